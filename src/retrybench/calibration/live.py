"""The paper's capacity calibration (Section 3.2) against a live engine: a real vLLM, say.

The same stages as the simulated calibration (300 s each, 1.5 times the previous rate, no
retries, no deadline that matters), sent through the proxy with cancellation off, which passes
them on unchanged, so the engine's waiting queue is scraped as in every live run. C-hat comes
from the same `calibration_from_log`. Every clock runs `time_scale` wall seconds per trace
second, and a `token_scale` below 1 shortens prompts and replies for a slower engine; C-hat,
latencies and stage times are then in trace seconds, as a simulated engine profile needs them.
The live stack is an optional extra (aiohttp), imported only when a calibration starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from retrybench.calibration.stages import (
    CALIBRATION_CLIENT,
    FIRST_STAGE_RATE,
    LATENCY_SHARE,
    STAGE_FACTOR,
    STAGE_S,
    STAGES,
    Calibration,
    StageRecord,
    calibration_from_log,
    stage_calls,
    stage_plan,
    stage_record,
)
from retrybench.conditions.config import WorkloadSpec
from retrybench.plan.engine_choice import EngineChoice
from retrybench.plan.spec import RunSpec

__all__ = ["LiveCalibration", "calibrate_engine", "calibrate_live", "calibration_summary"]


class Measured(TypedDict, total=False):
    """Where and how a live calibration was measured."""

    engine_url: str
    time_scale: float
    token_scale: float


class LiveCalibration(Measured):
    """A live calibration as `retrybench calibrate --engine URL` prints it and calibration.json holds it."""

    chat: float
    latency_stage_rate: float
    median_ttft_s: float | None
    median_e2e_s: float | None
    saturated_stage_rate: float
    saturated_stage_growth_per_s: float
    stages: list[StageRecord]


def calibrate_live(engine_url: str, *, model: str, gpu: str, workdir: Path, time_scale: float = 1.0,
                   token_scale: float = 1.0, seed: int = 0, stages: int = STAGES,
                   first_rate: float = FIRST_STAGE_RATE, stage_s: float = STAGE_S) -> Calibration:
    """C-hat of the engine at `engine_url`; `model` and `gpu` name the profile the run log records.
    Raises ValueError (with the last stage's rate) when no stage saturated."""
    from retrybench.loadgen.run import run_live
    from retrybench.traffic.workload import Trace

    spec = WorkloadSpec(chat_calls_per_s=1.0).scaled(token_scale)
    plan = stage_plan(first_rate, STAGE_FACTOR, stages, stage_s)
    calls = stage_calls(plan, stage_s, seed, spec)
    run_spec = RunSpec(model=model, condition="retries-off-cancel-off", seed=seed, gpu=gpu, token_scale=token_scale)
    run = run_live(run_spec, time_scale=time_scale, workdir=workdir, chat=1.0, engine_url=engine_url,
                   trace=Trace(spec=spec, seed=seed, calls=calls), client=CALIBRATION_CLIENT)
    calibration = calibration_from_log(run.log, plan)
    summary = calibration_summary(calibration, engine_url=engine_url, time_scale=time_scale, token_scale=token_scale)
    (workdir / "calibration.json").write_text(json.dumps(summary, indent=1))
    return calibration


def calibration_summary(calibration: Calibration, *, engine_url: str | None = None, time_scale: float | None = None,
                        token_scale: float | None = None) -> LiveCalibration:
    """C-hat, the latencies at the stage nearest LATENCY_SHARE x C-hat (where the paper reports them
    for its engine), and every stage; with where and how it was measured, when given."""
    near = calibration.stage_near(LATENCY_SHARE * calibration.chat_calls_per_s)
    measured = Measured()
    if engine_url is not None:
        measured["engine_url"] = engine_url
    if time_scale is not None:
        measured["time_scale"] = time_scale
    if token_scale is not None:
        measured["token_scale"] = token_scale
    return {**measured, "chat": calibration.chat_calls_per_s, "latency_stage_rate": near.rate_calls_per_s,
            "median_ttft_s": near.median_ttft_s, "median_e2e_s": near.median_e2e_s,
            "saturated_stage_rate": calibration.saturated.rate_calls_per_s,
            "saturated_stage_growth_per_s": calibration.saturated.growth_per_s,
            "stages": [stage_record(s) for s in calibration.stages]}


def calibrate_engine(engine: EngineChoice, *, model: str, gpu: str, workdir: Path, time_scale: float,
                     token_scale: float, stages: int) -> LiveCalibration:
    """`retrybench calibrate --engine URL`: the paper's calibration against the running engine, summarised;
    raises ValueError when the engine is not a running one's URL or no stage saturated."""
    if engine.url is None:
        raise ValueError(f"a live calibration needs a running engine's URL, not {engine}")
    result = calibrate_live(engine.url, model=model, gpu=gpu, workdir=workdir, time_scale=time_scale,
                            token_scale=token_scale, stages=stages)
    return calibration_summary(result, engine_url=engine.url, time_scale=time_scale, token_scale=token_scale)
