"""The paper's capacity calibration (Section 3.2) against a live engine: a real vLLM, say.

The same stages as the simulated calibration (300 s each, 1.5 times the previous rate, no
retries, no deadline that matters), sent through the proxy with cancellation off, which passes
them on unchanged, so the engine's waiting queue is scraped as in every live run. C-hat comes
from the same `calibration_from_log`. Every clock runs `time_scale` wall seconds per trace
second, and a `token_scale` below 1 shortens prompts and replies for a slower engine; C-hat,
latencies and stage times are then in trace seconds, as a simulated engine profile needs them.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from retrybench.analysis.calibrate import (
    CALIBRATION_CLIENT,
    FIRST_STAGE_RATE,
    LATENCY_RATE,
    STAGE_FACTOR,
    STAGE_S,
    STAGES,
    Calibration,
    calibration_from_log,
    stage_plan,
)
from retrybench.conditions.config import WorkloadSpec
from retrybench.loadgen.run import run_live
from retrybench.plan.spec import RunSpec
from retrybench.traffic.workload import Trace, concat_calls, stage_trace

__all__ = ["calibrate_live", "calibration_summary"]

# The paper reports latencies at 1.52 calls/s with C-hat 2.78: for another engine, the stage at the same
# share of its C-hat.
LATENCY_SHARE = LATENCY_RATE / 2.78


def calibrate_live(engine_url: str, *, model: str, gpu: str, workdir: Path, time_scale: float = 1.0,
                   token_scale: float = 1.0, seed: int = 0, stages: int = STAGES,
                   first_rate: float = FIRST_STAGE_RATE, stage_s: float = STAGE_S) -> Calibration:
    """C-hat of the engine at `engine_url`; `model` and `gpu` name the profile the run log records.
    Raises ValueError (with the last stage's rate) when no stage saturated."""
    spec = WorkloadSpec(chat_calls_per_s=1.0).scaled(token_scale)
    plan = stage_plan(first_rate, STAGE_FACTOR, stages, stage_s)
    calls = concat_calls([stage_trace(rate, stage_s, seed, spec, start_s=start) for rate, start, _ in plan])
    run_spec = RunSpec(model=model, condition="retries-off-cancel-off", seed=seed, gpu=gpu, token_scale=token_scale)
    run = run_live(run_spec, time_scale=time_scale, workdir=workdir, chat=1.0, engine_url=engine_url,
                   trace=Trace(spec=spec, seed=seed, calls=calls), client=CALIBRATION_CLIENT)
    calibration = calibration_from_log(run.log, plan)
    (workdir / "calibration.json").write_text(json.dumps(calibration_summary(calibration, engine_url=engine_url,
                                                                            time_scale=time_scale,
                                                                            token_scale=token_scale), indent=1))
    return calibration


def calibration_summary(calibration: Calibration, **meta: Any) -> dict[str, Any]:
    """C-hat, the latencies at the stage nearest LATENCY_SHARE x C-hat (where the paper reports them
    for its engine), and every stage."""
    near = calibration.stage_near(LATENCY_SHARE * calibration.chat_calls_per_s)
    return {**meta, "chat": calibration.chat_calls_per_s, "latency_stage_rate": near.rate_calls_per_s,
            "median_ttft_s": near.median_ttft_s, "median_e2e_s": near.median_e2e_s,
            "saturated_stage_rate": calibration.saturated.rate_calls_per_s,
            "saturated_stage_growth_per_s": calibration.saturated.growth_per_s,
            "stages": [asdict(s) for s in calibration.stages]}
