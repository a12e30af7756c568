"""The paper's calibration on the simulated engine: one engine, or a replica set behind its router.

A replica set's calibration sends the same uncontrolled calls through the deployment's router; its
saturated stage is the first in which the waiting queue summed over the replicas grows by 0.1 calls/s,
and C-hat is that stage's rate minus the growth, as for one engine. A deployment's pulses and rates are
then in units of what it serves as built (replicas, GPUs and router), not of N times one engine: a
router that balances badly has the lower C-hat. Its stages start at N times the paper's first rate
(stages.deployment_stage_plan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from retrybench.calibration.stages import (
    CALIBRATION_CLIENT,
    FIRST_STAGE_RATE,
    LATENCY_RATE,
    SATURATION_PER_S,
    STAGE_FACTOR,
    STAGE_S,
    STAGES,
    Calibration,
    calibration_from_log,
    deployment_stage_plan,
    stage_calls,
    stage_plan,
)
from retrybench.conditions.config import ProxyPolicy, WorkloadSpec
from retrybench.engine.profiles import EngineProfile
from retrybench.sim.deployment import Deployment, simulate_deployment
from retrybench.sim.run import simulate

__all__ = ["CALIBRATION_SEEDS", "RepeatedCalibration", "average_calibrations", "calibrate", "calibrate_deployment",
           "calibrate_repeated"]

# One 300-s stage carries noise of a few percent in C-hat (a standard deviation of 1.7% over ten traces), so
# the calibration is repeated on independent traces and averaged.
CALIBRATION_SEEDS = 5
_UNCONTROLLED = ProxyPolicy(cancellation="off")


def calibrate(profile: EngineProfile, *, seed: int = 0, spec: WorkloadSpec | None = None,
              first_rate: float = FIRST_STAGE_RATE, factor: float = STAGE_FACTOR, stage_s: float = STAGE_S,
              threshold_per_s: float = SATURATION_PER_S, stages: int = STAGES) -> Calibration:
    """Stages of constant-rate calls, without retries, sent straight to the engine."""
    spec = spec or WorkloadSpec(chat_calls_per_s=1.0)
    plan = stage_plan(first_rate, factor, stages, stage_s)
    log = simulate(profile, stage_calls(plan, stage_s, seed, spec), client=CALIBRATION_CLIENT, proxy=_UNCONTROLLED,
                   seed=seed, meta={"calibration": True}, prefix_tokens=spec.shared_prefix_tokens, stop_s=plan[-1][2])
    return calibration_from_log(log, plan, threshold_per_s)


def calibrate_deployment(profiles: Sequence[EngineProfile], router: str, *, seed: int = 0,
                         spec: WorkloadSpec | None = None) -> Calibration:
    """One calibration of the replicas `profiles` behind a `router`, on trace seed `seed`."""
    spec = spec or WorkloadSpec(chat_calls_per_s=1.0)
    plan = deployment_stage_plan(len(profiles))
    log = simulate_deployment(profiles, stage_calls(plan, STAGE_S, seed, spec), client=CALIBRATION_CLIENT,
                              proxy=_UNCONTROLLED, seed=seed, meta={"calibration": True},
                              deployment=Deployment(router=router), prefix_tokens=spec.shared_prefix_tokens,
                              stop_s=plan[-1][2])
    return calibration_from_log(log, plan, SATURATION_PER_S)


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
    """The mean of calibrations on independent traces (made one after another, or by a pool)."""
    stages = [run.stage_near(latency_rate) for run in runs]
    ttft = [s.median_ttft_s for s in stages if s.median_ttft_s is not None]
    e2e = [s.median_e2e_s for s in stages if s.median_e2e_s is not None]
    return RepeatedCalibration(chat_calls_per_s=fmean(run.chat_calls_per_s for run in runs),
                               median_ttft_s=fmean(ttft) if ttft else float("nan"),
                               median_e2e_s=fmean(e2e) if e2e else float("nan"), runs=runs)
