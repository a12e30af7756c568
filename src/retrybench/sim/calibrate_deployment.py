"""C-hat of a replica set, measured the paper's way (Section 3.2) on the whole deployment.

The calibration's calls, without retries and without any control, go through the deployment's router
to its replicas; the saturated stage is the first in which the waiting queue summed over the replicas
grows by 0.1 calls/s, and C-hat is that stage's rate minus the growth, as for one engine. Pulses and
rates of a deployment's runs are then in units of what the deployment as built (replicas, GPUs and
router) serves, not of N times one engine: a router that balances badly has the lower C-hat.

The stages start at N times the paper's first rate (0.2 calls/s per replica), so they cut the
deployment's capacity at the same relative points as one engine's, with the same number of stages.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from retrybench.sim.calibrate import CALIBRATION_SEEDS, RepeatedCalibration, average_calibrations
from retrybench.sim.deployment import Deployment, simulate_deployment
from retrybench.traffic.workload import concat_calls, stage_trace

__all__ = ["calibrate_deployment", "calibrate_deployment_repeated", "deployment_stage_plan"]


def deployment_stage_plan(replicas: int) -> list[tuple[float, float, float]]:
    """(rate, start_s, end_s) of each stage: the paper's plan, every rate times the replica count."""
    return stage_plan(FIRST_STAGE_RATE * replicas, STAGE_FACTOR, STAGES, STAGE_S)


def calibrate_deployment(profiles: Sequence[EngineProfile], router: str, *, seed: int = 0,
                         spec: WorkloadSpec | None = None) -> Calibration:
    """One calibration of the replicas `profiles` behind a `router`, on trace seed `seed`."""
    spec = spec or WorkloadSpec(chat_calls_per_s=1.0)
    plan = deployment_stage_plan(len(profiles))
    calls = concat_calls([stage_trace(rate, STAGE_S, seed, spec, start_s=start) for rate, start, _ in plan])
    log = simulate_deployment(profiles, calls, client=CALIBRATION_CLIENT, proxy=ProxyPolicy(cancellation="off"),
                              seed=seed, meta={"calibration": True}, deployment=Deployment(router=router),
                              prefix_tokens=spec.shared_prefix_tokens, stop_s=plan[-1][2])
    return calibration_from_log(log, plan, SATURATION_PER_S)


def calibrate_deployment_repeated(profiles: Sequence[EngineProfile], router: str, *,
                                  seeds: int = CALIBRATION_SEEDS, spec: WorkloadSpec | None = None
                                  ) -> RepeatedCalibration:
    """`calibrate_deployment` on seeds 0 .. seeds-1, averaged; latencies at the stage nearest 1.52 calls/s
    per replica."""
    runs = tuple(calibrate_deployment(profiles, router, seed=seed, spec=spec) for seed in range(seeds))
    return average_calibrations(runs, LATENCY_RATE * len(profiles))
