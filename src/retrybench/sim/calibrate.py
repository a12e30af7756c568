"""Run the paper's calibration on the simulated engine."""

from __future__ import annotations

from retrybench.analysis.calibrate import Calibration, calibration_from_log, stage_plan
from retrybench.config import ClientPolicy, ProxyPolicy, WorkloadSpec
from retrybench.engine.profiles import EngineProfile
from retrybench.sim.run import simulate
from retrybench.workload import concat_calls, stage_trace

__all__ = ["FIRST_STAGE_RATE", "calibrate"]

# 0.2 calls/s x 1.5^5 = 1.52 calls/s: the stage at which the paper reports TTFT and E2E.
FIRST_STAGE_RATE = 0.2
STAGES = 11


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
