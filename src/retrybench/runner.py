"""Run specs -> results, through the result cache (cache.py) so that an interrupted batch resumes.
Calibration (C-hat) is cached the same way, per engine build: GPU, model and prompt mix.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from retrybench.analysis import section5, summarize
from retrybench.analysis.calibrate import Calibration
from retrybench.analysis.delivery import delivered_per_window, waiting_total
from retrybench.atomicfile import write_atomic
from retrybench.cache import cache_dir, cached_json, code_version
from retrybench.config import WorkloadSpec, load_condition
from retrybench.engine.profiles import profile_for
from retrybench.runlog import RunLog
from retrybench.sim.calibrate import (
    CALIBRATION_SEEDS,
    RepeatedCalibration,
    average_calibrations,
    calibrate,
    calibrate_repeated,
)
from retrybench.sim.run import simulate
from retrybench.spec import RunSpec, engine_config_for
from retrybench.workload import generate_trace

__all__ = ["calibration_for", "run_many", "run_one", "run_one_live", "series", "simulate_spec"]

SERIES_STEP_S = 10  # one waiting-queue sample kept per this many seconds (Figure 1(b))


def _calibration_summary(result: RepeatedCalibration) -> dict[str, Any]:
    return {
        "chat": result.chat_calls_per_s,
        "median_ttft_s_at_1_52": result.median_ttft_s,
        "median_e2e_s_at_1_52": result.median_e2e_s,
        "runs": [{"seed": seed, "chat": run.chat_calls_per_s,
                  "saturated_stage_rate": run.saturated.rate_calls_per_s,
                  "saturated_stage_growth_per_s": run.saturated.growth_per_s,
                  "stages": [asdict(s) for s in run.stages]}
                 for seed, run in enumerate(result.runs)],
    }


def _calibration_path(model: str, gpu: str, mixed_prompts: bool, token_scale: float) -> Path:
    parts = [model, gpu, mixed_prompts, code_version()] + ([token_scale] if token_scale != 1 else [])
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]
    return cache_dir() / "calibration" / f"{model}-{gpu}-{'mixed-' if mixed_prompts else ''}{key}.json"


def _calibration_spec(mixed_prompts: bool, token_scale: float) -> WorkloadSpec:
    return WorkloadSpec(chat_calls_per_s=1.0, mixed_prompts=mixed_prompts).scaled(token_scale)


def _calibration_record(result: RepeatedCalibration, model: str, gpu: str, mixed_prompts: bool,
                        token_scale: float) -> dict[str, Any]:
    summary = _calibration_summary(result)
    summary.update(model=model, gpu=gpu, mixed_prompts=mixed_prompts, token_scale=token_scale)
    return summary


def calibration_for(model: str, gpu: str = "h100", mixed_prompts: bool = False,
                    use_cache: bool = True, token_scale: float = 1.0) -> dict[str, Any]:
    """C-hat and the calibration stages of one engine build (default engine arguments)."""
    def compute() -> dict[str, Any]:
        spec = _calibration_spec(mixed_prompts, token_scale)
        result = calibrate_repeated(profile_for(model, gpu), spec=spec)
        return _calibration_record(result, model, gpu, mixed_prompts, token_scale)

    return cached_json(_calibration_path(model, gpu, mixed_prompts, token_scale), compute, use_cache)


def _calibrate_seed(model: str, gpu: str, mixed_prompts: bool, seed: int) -> Calibration:
    return calibrate(profile_for(model, gpu), seed=seed, spec=_calibration_spec(mixed_prompts, 1.0))


def _calibrate_in_pool(pool: Executor, builds: list[tuple[str, str, bool]]) -> None:
    """Calibrate the uncached builds, every (build, seed) a task of its own: the runs need C-hat first,
    and one build after another on one core was a sixth of a cold reproduction."""
    missing = [b for b in builds if not _calibration_path(*b, 1.0).exists()]
    futures = {(b, seed): pool.submit(_calibrate_seed, *b, seed) for b in missing
               for seed in range(CALIBRATION_SEEDS)}
    for build in missing:
        runs = tuple(futures[build, seed].result() for seed in range(CALIBRATION_SEEDS))
        record = _calibration_record(average_calibrations(runs), *build, 1.0)
        write_atomic(_calibration_path(*build, 1.0), json.dumps(record, sort_keys=True, indent=1))


def simulate_spec(spec: RunSpec, chat: float | None = None, trace: list[dict[str, Any]] | None = None) -> RunLog:
    """The run log of one spec on the simulated engine."""
    condition = load_condition(spec.condition)
    if chat is None:
        chat = float(calibration_for(spec.model, spec.gpu, spec.mixed_prompts, token_scale=spec.token_scale)["chat"])
    engine, cap = engine_config_for(spec, condition, chat)
    profile = profile_for(spec.model, spec.gpu, engine)
    workload = spec.workload(chat)
    calls = generate_trace(workload, spec.seed).calls
    meta: dict[str, Any] = {
        **asdict(spec), "chat": chat, "pulse_start_s": workload.pulse_start_s,
        "pulse_end_s": workload.pulse_end_s, "hold_end_s": workload.hold_end_s,
        "attempt_timeout_s": condition.client.attempt_timeout_s, "delivery_horizon_s": 840.0,
        "engine_cap": cap, "kv_blocks": profile.kv_blocks,
    }
    return simulate(profile, calls, client=condition.client, proxy=condition.proxy, seed=spec.seed,
                    meta=meta, prefix_tokens=workload.shared_prefix_tokens, trace=trace)


def series(log: RunLog) -> dict[str, Any]:
    """Figure 1's time series: calls delivered per 60 s, and executions waiting in the proxy plus the
    engine every SERIES_STEP_S seconds (the 1-s sample at each multiple), both from the run's start."""
    waiting = waiting_total(log)[::SERIES_STEP_S]
    return {"delivered_per_60s": [n for _, n in delivered_per_window(log, 60.0)],
            "waiting_step_s": SERIES_STEP_S, "waiting": [int(w) for w in waiting]}


def run_one(spec: RunSpec, use_cache: bool = True) -> dict[str, Any]:
    """The summary of one run (the paper's Section 3.2 metrics), from the cache when present."""
    path = cache_dir() / "runs" / f"{spec.key()}.json"

    def compute() -> dict[str, Any]:
        chat = float(calibration_for(spec.model, spec.gpu, spec.mixed_prompts, use_cache, spec.token_scale)["chat"])
        started = time.perf_counter()
        events: list[dict[str, Any]] | None = [] if spec.trace else None
        log = simulate_spec(spec, chat, trace=events)
        result: dict[str, Any] = {**asdict(spec), "chat": round(chat, 4), **summarize(log)}
        result.update(section5.timing_and_counters(log))
        if events is not None:
            result.update(section5.trace_summary(events, log))
        result["engine_cap"] = log.meta["engine_cap"]  # resolved: the condition's cap unless overridden
        result["spec"] = asdict(spec)  # as given (engine_cap above is no longer the spec's)
        result["series"] = series(log)
        result["wall_s"] = round(time.perf_counter() - started, 3)
        result["code_version"] = code_version()
        return result

    return cached_json(path, compute, use_cache)


def run_one_live(spec: RunSpec, engine_url: str, use_cache: bool = True) -> dict[str, Any]:
    """The summary of one run live, through the proxy and load generator, against the OpenAI-compatible
    engine at `engine_url` (real time, 947+ s); cached like run_one, keyed also by the URL. The trace's
    rates come from the simulated engine's C-hat of the same build."""
    key = hashlib.sha256(f"{spec.key()} {engine_url}".encode()).hexdigest()[:24]
    path = cache_dir() / "live-runs" / f"{key}.json"

    def compute() -> dict[str, Any]:
        from retrybench.live.run import run_live  # the live stack is an extra; only live runs need it

        chat = float(calibration_for(spec.model, spec.gpu, spec.mixed_prompts, use_cache)["chat"])
        started = time.perf_counter()
        workdir = cache_dir() / "live" / key
        live = run_live(spec, time_scale=1.0, workdir=workdir, chat=chat, engine_url=engine_url)
        result: dict[str, Any] = {**asdict(spec), "chat": round(chat, 4), **summarize(live.log),
                                  **section5.timing_and_counters(live.log)}
        result.update(engine_cap=live.log.meta.get("engine_cap"), spec=asdict(spec), series=series(live.log),
                      engine=engine_url, workdir=str(workdir), wall_s=round(time.perf_counter() - started, 3),
                      code_version=code_version())
        return result

    return cached_json(path, compute, use_cache)


def _run_safely(spec: RunSpec) -> dict[str, Any]:
    try:
        return run_one(spec)
    except Exception as error:  # a failed run is reported, never dropped
        return {**asdict(spec), "error": f"{type(error).__name__}: {error}"}


def _expected_cost(spec: RunSpec) -> tuple[bool, int]:
    """A sort key that puts the long runs first (traced ones, smaller token budgets), so that no worker
    is left with a long run at the end while the others idle."""
    return (not spec.trace, spec.max_batched_tokens)


def run_many(specs: Iterable[RunSpec], jobs: int | None = None,
             progress: Callable[[RunSpec, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Results in the order of `specs`; runs in parallel processes, failures kept with their error."""
    ordered = list(specs)
    jobs = jobs or os.cpu_count() or 1
    builds = sorted({(s.model, s.gpu, s.mixed_prompts) for s in ordered})
    results: dict[int, dict[str, Any]] = {}
    if jobs == 1 or len(ordered) == 1:
        for build in builds:
            calibration_for(*build)  # once, before the runs would each compute it
        for i, spec in enumerate(ordered):
            results[i] = _run_safely(spec)
            if progress:
                progress(spec, results[i])
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            _calibrate_in_pool(pool, builds)
            order = sorted(range(len(ordered)), key=lambda i: _expected_cost(ordered[i]))
            futures = {pool.submit(_run_safely, ordered[i]): i for i in order}
            for future in as_completed(futures):
                i = futures[future]
                results[i] = future.result()
                if progress:
                    progress(ordered[i], results[i])
    return [results[i] for i in range(len(ordered))]


def with_seed(spec: RunSpec, seed: int) -> RunSpec:
    return replace(spec, seed=seed)
