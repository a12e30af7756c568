"""Run the paper's calibration on the simulated engine."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from retrybench.analysis.calibrate import Calibration, calibration_from_log, stage_plan
from retrybench.config import ClientPolicy, ProxyPolicy, WorkloadSpec
from retrybench.engine.profiles import EngineProfile
from retrybench.sim.run import simulate
from retrybench.workload import concat_calls, stage_trace

__all__ = ["CALIBRATION_SEEDS", "FIRST_STAGE_RATE", "RepeatedCalibration", "average_calibrations", "calibrate",
           "calibrate_repeated"]

# 0.2 calls/s x 1.5^5 = 1.52 calls/s: the stage at which the paper reports TTFT and E2E.
FIRST_STAGE_RATE = 0.2
STAGES = 11
# One 300-s stage carries Poisson noise of several percent in C-hat (about +-8% here over seeds), so
# the calibration is repeated on independent traces and averaged.
CALIBRATION_SEEDS = 5


def calibrate(profile: EngineProfile, *, seed: int = 0, spec: WorkloadSpec | None = None,
              first_rate: float = FIRST_STAGE_RATE, factor: float = 1.5, stage_s: float = 300.0,
              threshold_per_s: float = 0.1, stages: int = STAGES) -> Calibration:
    """Stages of constant-rate calls, without retries, sent straight to the engine."""
    spec = spec or WorkloadSpec(chat_calls_per_s=1.0)
    plan = stage_plan(first_rate, factor, stages, stage_s)
    calls = concat_calls([stage_trace(rate, stage_s, seed, spec, start_s=start) for rate, start, _ in plan])
    log = simulate(profile, calls, client=ClientPolicy(retries=False, attempt_timeout_s=1e9),
                   proxy=ProxyPolicy(cancellation="off"), seed=seed, meta={"calibration": True},
                   prefix_tokens=spec.shared_prefix_tokens, stop_s=plan[-1][2])
    return calibration_from_log(log, plan, threshold_per_s)


@dataclass(frozen=True, kw_only=True)
class RepeatedCalibration:
    """The calibration on several independent traces; C-hat and latencies are their means."""

    chat_calls_per_s: float
    median_ttft_s: float
    median_e2e_s: float
    runs: tuple[Calibration, ...]


def calibrate_repeated(profile: EngineProfile, *, seeds: int = CALIBRATION_SEEDS,
                       spec: WorkloadSpec | None = None, latency_rate: float = 1.52) -> RepeatedCalibration:
    """`calibrate` on seeds 0 .. seeds-1, averaged; latencies from each run's stage nearest `latency_rate`."""
    return average_calibrations(tuple(calibrate(profile, seed=seed, spec=spec) for seed in range(seeds)),
                                latency_rate)


def average_calibrations(runs: tuple[Calibration, ...], latency_rate: float = 1.52) -> RepeatedCalibration:
    """The mean of calibrations on independent traces (made here one after another, or by a pool)."""
    stages = [run.stage_near(latency_rate) for run in runs]
    ttft = [s.median_ttft_s for s in stages if s.median_ttft_s is not None]
    e2e = [s.median_e2e_s for s in stages if s.median_e2e_s is not None]
    return RepeatedCalibration(chat_calls_per_s=fmean(run.chat_calls_per_s for run in runs),
                               median_ttft_s=fmean(ttft) if ttft else float("nan"),
                               median_e2e_s=fmean(e2e) if e2e else float("nan"), runs=runs)
