"""Runs on a live engine: load generator -> proxy -> engine over real HTTP, one run after another.

A live run is summarised as a simulated one is, plus where it ran, and cached by spec, engine, C-hat
and time scale (runs/store.py), for the command line and the finding tests' live sessions alike. The
engine is an engine server the run starts itself, a running engine's URL, or one the caller starts
per run (`serve`: a vLLM process or container). The live stack is an optional extra (aiohttp),
imported only when a run starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from retrybench.plan.engine_choice import EngineChoice
from retrybench.plan.spec import RunSpec, condition_for
from retrybench.records.cache import cache_dir, cached_json
from retrybench.records.results import LiveFields, Result, RunSummary
from retrybench.runs.executors import Progress, run_safely
from retrybench.runs.plan import PlannedRun, RunPlan, plan_live
from retrybench.runs.simulate import run_summary
from retrybench.runs.store import live_run_key, live_run_path

__all__ = ["LiveExecutor", "Serve", "live_refusal", "run_one_live"]

Serve = Callable[[RunSpec, float], str]
"""Starts an engine for a spec at C-hat (calls/s) and returns its base URL: how the caller provides
the engines it starts per run (a vLLM process or container)."""


def live_refusal(spec: RunSpec) -> str | None:
    """Why `spec` cannot run live, or None: a live run has the paper's setup and the condition's own policies."""
    if spec.overrides:
        return "policy overrides (a sweep's policy axes) run on the simulated engine only"
    if spec.deployed:
        return "several replicas or proxy instances run on the simulated engine only"
    if spec.engine_speed != 1.0:
        return "an engine made faster or slower (engine_speed) is the simulated engine's only"
    return None


def run_one_live(spec: RunSpec, engine: EngineChoice, *, chat: float | None = None, time_scale: float = 1.0,
                 workdir: Path | None = None, use_cache: bool = True, serve: Serve | None = None) -> RunSummary:
    """The summary of one run live at C-hat `chat` (947 x time_scale wall seconds and more), from the cache
    when present; its logs in `workdir` (default under the cache, by key). `chat` None: the spec's simulated
    C-hat, resolved before the run (plan_live). engine-server is started by the run; vllm-process and
    vllm-container by `serve`."""
    if not engine.live:
        raise ValueError("run_one_live needs a live engine; the simulator's runs are the local executor's")
    refusal = live_refusal(spec)
    if refusal is not None:
        raise ValueError(refusal)
    rate = chat if chat is not None else plan_live([spec], use_cache=use_cache).runs[0].chat
    key = live_run_key(spec, engine, rate, time_scale)
    logs = workdir if workdir is not None else cache_dir() / "live" / key

    def compute() -> RunSummary:
        from retrybench.loadgen.run import run_live

        started = time.perf_counter()
        client = condition_for(spec).client if spec.client is not None else None
        live = run_live(spec, time_scale=time_scale, workdir=logs, chat=rate,
                        engine_url=_engine_url(engine, spec, rate, serve), client=client)
        return run_summary(spec, rate, live.log, started, live=LiveFields(engine=str(engine), workdir=str(logs)))

    return cached_json(live_run_path(key), compute, use_cache)


def _engine_url(engine: EngineChoice, spec: RunSpec, chat: float, serve: Serve | None) -> str | None:
    """The running engine's URL, or None for an engine server the run starts itself."""
    if engine.kind == "engine-server":
        return None
    if engine.url is not None:
        return engine.url
    if serve is None:
        raise ValueError(f"the engine {engine} is started per run: pass serve")
    return serve(spec, chat)


class LiveExecutor:
    """One run after another on `engine` (runs on one engine must not overlap), in real time scaled by
    `time_scale`; C-hat is `chat` (a live calibration's) or each build's simulated one."""

    name = "live"

    def __init__(self, engine: EngineChoice, *, time_scale: float = 1.0, chat: float | None = None,
                 serve: Serve | None = None, use_cache: bool = True) -> None:
        if not engine.live:
            raise ValueError(f"the live executor needs a live engine, not {engine}")
        self.engine, self.time_scale, self.chat, self.serve, self.use_cache = engine, time_scale, chat, serve, use_cache

    def plan(self, specs: Sequence[RunSpec]) -> RunPlan:
        return plan_live(specs, self.chat, self.use_cache)

    def run(self, plan: RunPlan, progress: Progress | None = None) -> list[Result]:
        one = partial(_run_planned, engine=self.engine, time_scale=self.time_scale, serve=self.serve,
                      use_cache=self.use_cache)
        results = []
        for run in plan.runs:
            result = run_safely(one, run)
            if progress:
                progress(run.spec, result)
            results.append(result)
        return results

    def close(self) -> None:
        """Nothing to release: each run starts and stops what it needs."""


def _run_planned(run: PlannedRun, *, engine: EngineChoice, time_scale: float, serve: Serve | None,
                 use_cache: bool) -> RunSummary:
    return run_one_live(run.spec, engine, chat=run.chat, time_scale=time_scale, use_cache=use_cache, serve=serve)
