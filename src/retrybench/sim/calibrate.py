"""Run the paper's calibration on the simulated engine."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from retrybench.analysis.calibrate import (
    CALIBRATION_CLIENT,
    FIRST_STAGE_RATE,
    LATENCY_RATE,
    SATURATION_PER_S,
    STAGE_FACTOR,
    STAGE_S,
    STAGES,
    Calibration,
    calibration_from_log,
    stage_plan,
)
from retrybench.conditions.config import ProxyPolicy, WorkloadSpec
from retrybench.engine.profiles import EngineProfile
from retrybench.sim.run import simulate
from retrybench.traffic.workload import concat_calls, stage_trace

__all__ = ["CALIBRATION_SEEDS", "RepeatedCalibration", "average_calibrations", "calibrate", "calibrate_repeated"]

# One 300-s stage carries noise of a few percent in C-hat (a standard deviation of 1.7% over ten traces), so
# the calibration is repeated on independent traces and averaged.
CALIBRATION_SEEDS = 5


def calibrate(profile: EngineProfile, *, seed: int = 0, spec: WorkloadSpec | None = None,
              first_rate: float = FIRST_STAGE_RATE, factor: float = STAGE_FACTOR, stage_s: float = STAGE_S,
              threshold_per_s: float = SATURATION_PER_S, stages: int = STAGES) -> Calibration:
    """Stages of constant-rate calls, without retries, sent straight to the engine."""
    spec = spec or WorkloadSpec(chat_calls_per_s=1.0)
    plan = stage_plan(first_rate, factor, stages, stage_s)
    calls = concat_calls([stage_trace(rate, stage_s, seed, spec, start_s=start) for rate, start, _ in plan])
    log = simulate(profile, calls, client=CALIBRATION_CLIENT,
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
                       spec: WorkloadSpec | None = None, latency_rate: float = LATENCY_RATE) -> RepeatedCalibration:
    """`calibrate` on seeds 0 .. seeds-1, averaged; latencies from each run's stage nearest `latency_rate`."""
    return average_calibrations(tuple(calibrate(profile, seed=seed, spec=spec) for seed in range(seeds)),
                                latency_rate)


def average_calibrations(runs: tuple[Calibration, ...], latency_rate: float = LATENCY_RATE) -> RepeatedCalibration:
    """The mean of calibrations on independent traces (made here one after another, or by a pool)."""
    stages = [run.stage_near(latency_rate) for run in runs]
    ttft = [s.median_ttft_s for s in stages if s.median_ttft_s is not None]
    e2e = [s.median_e2e_s for s in stages if s.median_e2e_s is not None]
    return RepeatedCalibration(chat_calls_per_s=fmean(run.chat_calls_per_s for run in runs),
                               median_ttft_s=fmean(ttft) if ttft else float("nan"),
                               median_e2e_s=fmean(e2e) if e2e else float("nan"), runs=runs)
