"""Run specs -> results, through the result cache (records/cache.py) so that an interrupted batch resumes.
Calibration (C-hat) is cached the same way, per engine build: GPU, model and prompt mix.

A live run (load generator -> proxy -> engine over real HTTP) is summarised as a simulated one is,
plus where it ran, for the command line and the finding tests' live sessions alike. The live stack is
an optional extra (aiohttp), imported only when a live run starts.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from functools import partial
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, cast

from retrybench.analysis import section5, summarize
from retrybench.analysis.calibrate import LATENCY_RATE, Calibration
from retrybench.analysis.delivery import delivered_per_window, waiting_total
from retrybench.conditions.config import WorkloadSpec
from retrybench.engine.profiles import GPUS, profile_for
from retrybench.plan.engine_choice import EngineChoice
from retrybench.plan.spec import RunSpec, condition_for, engine_config_for
from retrybench.records.cache import cache_dir, cached_json, code_version, has_entry, write_entry
from retrybench.records.results import FailedRun, LiveFields, PromptWork, Result, RunSummary, Series, SpecFields
from retrybench.records.runlog import RunLog
from retrybench.records.tracefile import write_trace
from retrybench.sim.calibrate import (
    CALIBRATION_SEEDS,
    RepeatedCalibration,
    average_calibrations,
    calibrate,
    calibrate_repeated,
)
from retrybench.sim.calibrate_deployment import calibrate_deployment
from retrybench.sim.deployment import simulate_deployment
from retrybench.sim.replica_runs import DeploymentBuild, deployment_build, deployment_of, replica_profiles
from retrybench.sim.run import simulate
from retrybench.traffic.workload import generate_trace

__all__ = ["Serve", "calibrate_builds", "calibrate_one_live", "calibration_at_steps", "calibration_for", "chat_for",
           "deployment_calibration_for",
           "live_run_key", "live_workdir", "run_is_cached", "run_many", "run_many_live", "run_one", "run_one_live",
           "run_safely", "run_summary", "run_traced", "series", "simulate_spec", "store_run", "summarize_spec"]

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


def calibration_at_steps(model: str, gpu: str, max_batched_tokens: int, use_cache: bool = True) -> dict[str, Any]:
    """C-hat of a build calibrated at another step size (12,000-token prompts). The paper calibrated at
    8,192 batched tokens only, and its 2,048-token runs keep that C-hat: this is recorded beside it, never
    used to set a run's rates."""
    engine = replace(GPUS[gpu].engine_defaults(), max_num_batched_tokens=max_batched_tokens)

    def compute() -> dict[str, Any]:
        result = calibrate_repeated(profile_for(model, gpu, engine), spec=_calibration_spec(False, 1.0))
        record = _calibration_record(result, model, gpu, False, 1.0)
        record["max_batched_tokens"] = max_batched_tokens
        return record

    path = cache_dir() / "calibration" / f"{model}-{gpu}-steps{max_batched_tokens}-{code_version()}.json"
    return cached_json(path, compute, use_cache)


def _calibrate_seed(model: str, gpu: str, mixed_prompts: bool, seed: int) -> Calibration:
    return calibrate(profile_for(model, gpu), seed=seed, spec=_calibration_spec(mixed_prompts, 1.0))


def _calibrate_in_pool(pool: Executor, builds: list[tuple[str, str, bool]]) -> None:
    """Calibrate the uncached builds, every (build, seed) a task of its own: the runs need C-hat first,
    and one build after another on one core was a sixth of a cold reproduction."""
    missing = [b for b in builds if not has_entry(_calibration_path(*b, 1.0), report=True)]
    futures = {(b, seed): pool.submit(_calibrate_seed, *b, seed) for b in missing
               for seed in range(CALIBRATION_SEEDS)}
    for build in missing:
        runs = tuple(futures[build, seed].result() for seed in range(CALIBRATION_SEEDS))
        record = _calibration_record(average_calibrations(runs), *build, 1.0)
        write_entry(_calibration_path(*build, 1.0), record)


def _deployment_path(build: DeploymentBuild) -> Path:
    key = hashlib.sha256(json.dumps([*build, code_version()]).encode()).hexdigest()[:24]
    return cache_dir() / "calibration" / f"{build[0]}-{len(build[1])}-replicas-{build[2]}-{key}.json"


def _calibrate_deployment_seed(build: DeploymentBuild, seed: int) -> Calibration:
    model, gpus, router, mixed_prompts, token_scale = build
    return calibrate_deployment([profile_for(model, gpu) for gpu in gpus], router, seed=seed,
                                spec=_calibration_spec(mixed_prompts, token_scale))


def _deployment_record(build: DeploymentBuild, runs: tuple[Calibration, ...]) -> dict[str, Any]:
    model, gpus, router, mixed_prompts, token_scale = build
    record = _calibration_summary(average_calibrations(runs, LATENCY_RATE * len(gpus)))
    record.update(model=model, gpu=",".join(gpus), replicas=len(gpus), router=router, mixed_prompts=mixed_prompts,
                  token_scale=token_scale)
    return record


def deployment_calibration_for(spec: RunSpec, use_cache: bool = True) -> dict[str, Any]:
    """C-hat of the spec's replica set (the whole deployment, behind its router), calibrated the paper's way."""
    build = deployment_build(spec)

    def compute() -> dict[str, Any]:
        return _deployment_record(build, tuple(_calibrate_deployment_seed(build, seed)
                                               for seed in range(CALIBRATION_SEEDS)))

    return cached_json(_deployment_path(build), compute, use_cache)


def chat_for(spec: RunSpec, use_cache: bool = True) -> float:
    """The C-hat a spec's rates are in: its engine build's, or its replica set's when it has several."""
    if spec.replicas > 1:
        return float(deployment_calibration_for(spec, use_cache)["chat"])
    return float(calibration_for(spec.model, spec.gpu, spec.mixed_prompts, use_cache, spec.token_scale)["chat"])


def _calibrate_deployments_in_pool(pool: Executor, specs: Iterable[RunSpec]) -> None:
    """Calibrate the uncached replica sets, every (set, seed) a task of its own."""
    builds = sorted({deployment_build(s) for s in specs if s.replicas > 1})
    missing = [b for b in builds if not has_entry(_deployment_path(b), report=True)]
    futures = {(b, seed): pool.submit(_calibrate_deployment_seed, b, seed) for b in missing
               for seed in range(CALIBRATION_SEEDS)}
    for build in missing:
        runs = tuple(futures[build, seed].result() for seed in range(CALIBRATION_SEEDS))
        write_entry(_deployment_path(build), _deployment_record(build, runs))


def simulate_spec(spec: RunSpec, chat: float | None = None, trace: list[dict[str, Any]] | None = None) -> RunLog:
    """The run log of one spec on the simulated engine (on its deployment, when it has several replicas
    or proxy instances)."""
    condition = condition_for(spec)
    if chat is None:
        chat = chat_for(spec)
    engine, cap = engine_config_for(spec, condition, chat)
    profile = profile_for(spec.model, spec.gpu, engine)
    workload = spec.workload(chat)
    calls = generate_trace(workload, spec.seed).calls
    meta: dict[str, Any] = {
        **spec.as_dict(), "chat": chat, "pulse_start_s": workload.pulse_start_s,
        "pulse_end_s": workload.pulse_end_s, "hold_end_s": workload.hold_end_s,
        "attempt_timeout_s": condition.client.attempt_timeout_s, "delivery_horizon_s": 840.0,
        "engine_cap": cap, "kv_blocks": profile.kv_blocks,
    }
    if spec.deployed:
        cap_given = spec.engine_cap if spec.engine_cap is not None else condition.engine_cap
        return simulate_deployment(replica_profiles(spec, cap_given), calls, client=condition.client,
                                   proxy=condition.proxy, seed=spec.seed, meta=meta, deployment=deployment_of(spec),
                                   prefix_tokens=workload.shared_prefix_tokens, trace=trace)
    return simulate(profile, calls, client=condition.client, proxy=condition.proxy, seed=spec.seed,
                    meta=meta, prefix_tokens=workload.shared_prefix_tokens, trace=trace)


def series(log: RunLog) -> Series:
    """Figure 1's time series: calls delivered per 60 s, and executions waiting in the proxy plus the
    engine every SERIES_STEP_S seconds (the 1-s sample at each multiple), both from the run's start."""
    waiting = waiting_total(log)[::SERIES_STEP_S]
    return Series(delivered_per_60s=[n for _, n in delivered_per_window(log, 60.0)],
                  waiting_step_s=SERIES_STEP_S, waiting=[int(w) for w in waiting])


def run_summary(spec: RunSpec, chat: float, log: RunLog, started: float,
                events: list[dict[str, Any]] | None = None, live: LiveFields | None = None) -> RunSummary:
    """A run's summary (the paper's Section 3.2 metrics) from its log, simulated or live, in one shape;
    with the engine trace's `events`, also where the prompt work went (Section 5); with `live`, where a
    live run ran. `wall_s` counts from `started` (time.perf_counter) to the summary's end."""
    given = cast(SpecFields, spec.as_dict())  # as given; the top-level engine_cap is the resolved one
    resolved: SpecFields = {**given, "engine_cap": log.meta["engine_cap"]}
    traced = section5.trace_summary(events, log) if events is not None else PromptWork()
    summary: RunSummary = {**resolved, "chat": round(chat, 4), **summarize(log), **section5.timing_and_counters(log),
                           **traced, **(live or LiveFields()), "spec": given, "series": series(log),
                           "wall_s": round(time.perf_counter() - started, 3), "code_version": code_version()}
    return summary


def _run_path(spec: RunSpec) -> Path:
    return cache_dir() / "runs" / f"{spec.key()}.json"


def run_is_cached(spec: RunSpec) -> bool:
    """Whether the simulated run of `spec` is in the cache, whole and sound (run_one would not compute it)."""
    return has_entry(_run_path(spec))


def run_one(spec: RunSpec, use_cache: bool = True) -> RunSummary:
    """The summary of one run (the paper's Section 3.2 metrics), from the cache when present."""
    path = _run_path(spec)

    def compute() -> RunSummary:
        return summarize_spec(spec, chat_for(spec, use_cache))

    return cached_json(path, compute, use_cache)


def summarize_spec(spec: RunSpec, chat: float) -> RunSummary:
    """run_one's summary computed afresh at C-hat = `chat`, touching no cache: what a worker that shares
    no disk with the caller (a Ray cluster's) computes, for the caller to store with store_run."""
    started = time.perf_counter()
    events: list[dict[str, Any]] | None = [] if spec.trace else None
    log = simulate_spec(spec, chat, trace=events)
    return run_summary(spec, chat, log, started, events)


def store_run(spec: RunSpec, summary: RunSummary) -> None:
    """Write a summary computed elsewhere where run_one and run_is_cached look for it."""
    write_entry(_run_path(spec), summary)


def calibrate_builds(pool: Executor, builds: Iterable[tuple[str, str, bool]]) -> None:
    """Calibrate the uncached (model, gpu, mixed_prompts) builds on `pool`, one task per calibration seed."""
    _calibrate_in_pool(pool, sorted(set(builds)))


def run_traced(spec: RunSpec, trace_path: Path) -> dict[str, Any]:
    """One run computed afresh, its engine trace written to `trace_path` (JSONL) and its run log beside
    it (.runlog.json): run_one's summary, with where the two files are."""
    chat = float(calibration_for(spec.model, spec.gpu, spec.mixed_prompts, token_scale=spec.token_scale)["chat"])
    started = time.perf_counter()
    events: list[dict[str, Any]] = []
    log = simulate_spec(spec, chat, trace=events)
    write_trace(trace_path, events, {"spec": log.meta})
    runlog_path = trace_path.with_suffix(".runlog.json")
    runlog_path.write_text(log.to_json())
    return {**run_summary(spec, chat, log, started, events), "trace": str(trace_path),
            "run_log": str(runlog_path)}


def run_safely(run: Callable[[RunSpec], RunSummary], spec: RunSpec) -> Result:
    """`run(spec)`, or the spec with the error: a failed run is reported, never dropped."""
    try:
        return run(spec)
    except Exception as error:
        failed: FailedRun = {**cast(SpecFields, asdict(spec)), "error": f"{type(error).__name__}: {error}"}
        return failed


def _expected_cost(spec: RunSpec) -> tuple[bool, int, int]:
    """A sort key that puts the long runs first (traced ones, more replicas, smaller token budgets), so
    that no worker is left with a long run at the end while the others idle."""
    return (not spec.trace, -spec.replicas, spec.max_batched_tokens)


def run_many(specs: Iterable[RunSpec], jobs: int | None = None,
             progress: Callable[[RunSpec, Result], None] | None = None) -> list[Result]:
    """Results in the order of `specs`; runs in parallel processes, failures kept with their error."""
    ordered = list(specs)
    jobs = jobs or os.cpu_count() or 1
    builds = sorted({(s.model, s.gpu, s.mixed_prompts) for s in ordered})
    results: dict[int, Result] = {}
    if jobs == 1 or len(ordered) == 1:
        for build in builds:
            calibration_for(*build)  # once, before the runs would each compute it
        for spec in ordered:
            if spec.replicas > 1:
                chat_for(spec)  # a replica set's, likewise
        for i, spec in enumerate(ordered):
            results[i] = run_safely(run_one, spec)
            if progress:
                progress(spec, results[i])
    else:
        pool = ProcessPoolExecutor(max_workers=jobs, initializer=_start_worker)
        try:
            _calibrate_in_pool(pool, builds)
            _calibrate_deployments_in_pool(pool, ordered)
            order = sorted(range(len(ordered)), key=lambda i: _expected_cost(ordered[i]))
            futures = {pool.submit(run_safely, run_one, ordered[i]): i for i in order}
            for future in as_completed(futures):
                i = futures[future]
                results[i] = future.result()
                if progress:
                    progress(ordered[i], results[i])
        except BaseException:
            _stop_workers(pool)
            raise
        pool.shutdown()
    return [results[i] for i in range(len(ordered))]


def _start_worker() -> None:
    """A worker's start. Ctrl-C reaches the whole process group, and the parent alone decides what it
    means (it stops the workers), so a worker ignores it rather than die with a traceback of its own.
    A parent killed outright (kill -9) cannot stop its workers: each ends itself with its parent, instead
    of going on with the runs queued for it and then waiting forever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: BaseProcess) -> None:
    """Wait for the parent to end (however it ends, even before this worker started), then end too."""
    parent.join()
    os._exit(1)  # a run cut short leaves no entry: entries are written whole


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Drop the runs not started and end the workers now, without waiting for the runs in flight:
    what they had finished is cached, and a run cut short leaves no entry (entries are written whole)."""
    workers = list((pool._processes or {}).values())  # no public way to end them in Python 3.11
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join()


def with_seed(spec: RunSpec, seed: int) -> RunSpec:
    return replace(spec, seed=seed)


Serve = Callable[[RunSpec, float], str]
"""Starts an engine for a spec at C-hat (calls/s) and returns its base URL: how the caller provides
the engines it starts per run (a vLLM process or container)."""


def live_run_key(spec: RunSpec, engine: EngineChoice, chat: float, time_scale: float) -> str:
    """The cache key of a live run: the spec (and code), the engine as named, C-hat and the time scale."""
    text = json.dumps({"spec": spec.key(), "engine": str(engine), "chat": chat, "time_scale": time_scale})
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def live_workdir(prefix: str) -> Path:
    """A new directory for a live run's logs, under the cache."""
    parent = cache_dir() / "live"
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def run_one_live(spec: RunSpec, engine: EngineChoice, *, chat: float | None = None, time_scale: float = 1.0,
                 workdir: Path | None = None, use_cache: bool = True, serve: Serve | None = None) -> RunSummary:
    """The summary of one run live (947 x time_scale wall seconds and more), from the cache when present:
    run_one's keys, and `engine` and `workdir` (where its logs are; default under the cache, by key).

    `chat` is C-hat in calls/s, which sets the trace's rates: by default the simulated calibration of the
    spec's build at its token scale. engine-server is started by the run; vllm-process and vllm-container
    by `serve`."""
    if not engine.live:
        raise ValueError("run_one_live needs a live engine; the simulator's runs are runner.run_one's")
    if spec.overrides:
        raise ValueError("policy overrides (a sweep's axes) run on the simulated engine only")
    if spec.deployed:
        raise ValueError("several replicas or proxy instances run on the simulated engine only")
    if chat is None:
        chat = float(calibration_for(spec.model, spec.gpu, spec.mixed_prompts, use_cache, spec.token_scale)["chat"])
    key = live_run_key(spec, engine, chat, time_scale)
    logs = workdir if workdir is not None else cache_dir() / "live" / key

    def compute() -> RunSummary:
        from retrybench.loadgen.run import run_live

        started = time.perf_counter()
        client = condition_for(spec).client if spec.client is not None else None
        live = run_live(spec, time_scale=time_scale, workdir=logs, chat=chat,
                        engine_url=_engine_url(engine, spec, chat, serve), client=client)
        return run_summary(spec, chat, live.log, started, live=LiveFields(engine=str(engine), workdir=str(logs)))

    return cached_json(cache_dir() / "live-runs" / f"{key}.json", compute, use_cache)


def _engine_url(engine: EngineChoice, spec: RunSpec, chat: float, serve: Serve | None) -> str | None:
    """The running engine's URL, or None for an engine server the run starts itself."""
    if engine.kind == "engine-server":
        return None
    if engine.url is not None:
        return engine.url
    if serve is None:
        raise ValueError(f"the engine {engine} is started per run: pass serve")
    return serve(spec, chat)


def run_many_live(specs: Iterable[RunSpec], engine: EngineChoice,
                  progress: Callable[[RunSpec, Result], None] | None = None) -> list[Result]:
    """Results in the order of `specs`, one run after another (runs on one engine must not overlap),
    in real time; failures kept with their error."""
    results = []
    for spec in specs:
        result = run_safely(partial(run_one_live, engine=engine), spec)
        if progress:
            progress(spec, result)
        results.append(result)
    return results


def calibrate_one_live(engine: EngineChoice, *, model: str, gpu: str, workdir: Path, time_scale: float,
                       token_scale: float, stages: int) -> dict[str, Any]:
    """The paper's calibration against the running engine `engine` (live.calibrate), summarised; raises
    ValueError when no stage saturated."""
    from retrybench.realvllm.calibrate import calibrate_live, calibration_summary

    if engine.url is None:
        raise ValueError(f"a live calibration needs a running engine's URL, not {engine}")
    result = calibrate_live(engine.url, model=model, gpu=gpu, workdir=workdir, time_scale=time_scale,
                            token_scale=token_scale, stages=stages)
    return calibration_summary(result, engine_url=engine.url, time_scale=time_scale, token_scale=token_scale)
