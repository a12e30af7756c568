"""Where a plan's runs execute: this machine's process pool (LocalExecutor), Ray (runs/ray.py) or a live
engine (runs/live.py), behind one interface.

Every executor returns the results in the plan's order, keeps a failed run with its error, reports
each result to a progress callback as it comes, and reads and writes the one result cache, so that a
batch resumes under any of them. Ctrl-C stops the local pool's workers at once: the runs they had
finished are cached, a run cut short leaves no entry.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict
from multiprocessing.process import BaseProcess
from typing import Protocol, cast

from retrybench.calibration.store import build_of, calibrate_missing, chat_for
from retrybench.plan.engine_choice import EngineChoice
from retrybench.plan.spec import RunSpec
from retrybench.records.results import FailedRun, Result, RunSummary, SpecFields
from retrybench.runs.plan import PlannedRun, RunPlan, plan_runs
from retrybench.runs.simulate import summarize_spec
from retrybench.runs.store import read_run, through_cache

__all__ = ["EXECUTORS", "Executor", "Interrupted", "LocalExecutor", "Progress", "compute", "make_executor", "run_one",
           "run_safely", "run_specs"]

Progress = Callable[[RunSpec, Result], None]
EXECUTORS = ("local", "ray")  # the simulator's; a live engine is chosen by naming it (make_executor's `engine`)


class Interrupted(Exception):
    """Ctrl-C during a command's runs (reproduce, assess): the runs stopped, those finished are cached."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"interrupted: {done} of {total} distinct runs finished and are cached; run the same "
                         "command again to resume from there")
        self.done, self.total = done, total


class Executor(Protocol):
    """Plans run specs (C-hat resolved, on this executor's workers) and runs a plan to results."""

    name: str

    def plan(self, specs: Sequence[RunSpec]) -> RunPlan: ...

    def run(self, plan: RunPlan, progress: Progress | None = None) -> list[Result]: ...

    def close(self) -> None: ...


def run_specs(executor: Executor, specs: Sequence[RunSpec], progress: Progress | None = None) -> list[Result]:
    """The specs planned and run on `executor`: results in the order of `specs`."""
    return executor.run(executor.plan(specs), progress)


def compute(run: PlannedRun) -> RunSummary:
    """One planned run on the simulator, through the result cache (read if there, else computed and cached)."""
    return through_cache(run.spec, lambda: summarize_spec(run.spec, run.chat))


def run_one(spec: RunSpec, use_cache: bool = True) -> RunSummary:
    """The summary of one run on the simulator, in this process: from the cache when present, else computed
    at its build's C-hat (calibrated here if need be)."""
    if use_cache and (cached := read_run(spec)) is not None:
        return cached
    chat = chat_for(spec, use_cache)
    return through_cache(spec, lambda: summarize_spec(spec, chat), use_cache)


def run_safely(run: Callable[[PlannedRun], RunSummary], planned: PlannedRun) -> Result:
    """`run(planned)`, or the spec with the error: a failed run is reported, never dropped."""
    try:
        return run(planned)
    except Exception as error:
        failed: FailedRun = {**cast(SpecFields, asdict(planned.spec)), "error": f"{type(error).__name__}: {error}"}
        return failed


def from_cache(plan: RunPlan, progress: Progress | None) -> tuple[dict[int, Result], list[int]]:
    """The plan's results already cached (read here, reported to `progress`) and the indices still to run."""
    done: dict[int, Result] = {}
    missing: list[int] = []
    for i, run in enumerate(plan.runs):
        cached = read_run(run.spec)
        if cached is None:
            missing.append(i)
            continue
        done[i] = cached
        if progress:
            progress(run.spec, cached)
    return done, missing


def expected_cost(spec: RunSpec) -> tuple[bool, int, int]:
    """A sort key that puts the long runs first (traced ones, more replicas, smaller token budgets), so
    that no worker is left with a long run at the end while the others idle."""
    return (not spec.trace, -spec.replicas, spec.max_batched_tokens)


class LocalExecutor:
    """A process pool on this machine's cores (`jobs`, default all); one process, no pool, with jobs=1."""

    name = "local"

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = jobs or os.cpu_count() or 1

    def plan(self, specs: Sequence[RunSpec]) -> RunPlan:
        """C-hat of every spec; the builds not cached are calibrated on the pool, a task per (build, seed)."""
        if self.jobs > 1:
            builds = list(dict.fromkeys(build_of(spec) for spec in specs))
            with worker_pool(self.jobs) as pool:
                calibrate_missing(pool, builds)
        return plan_runs(specs)

    def run(self, plan: RunPlan, progress: Progress | None = None) -> list[Result]:
        done, missing = from_cache(plan, progress)
        if self.jobs == 1 or len(missing) == 1:
            for i in missing:
                done[i] = run_safely(compute, plan.runs[i])
                if progress:
                    progress(plan.runs[i].spec, done[i])
        elif missing:
            with worker_pool(self.jobs) as pool:
                order = sorted(missing, key=lambda i: expected_cost(plan.runs[i].spec))
                futures = {pool.submit(run_safely, compute, plan.runs[i]): i for i in order}
                for future in as_completed(futures):
                    i = futures[future]
                    done[i] = future.result()
                    if progress:
                        progress(plan.runs[i].spec, done[i])
        return [done[i] for i in range(len(plan))]

    def close(self) -> None:
        """Nothing to release: a pool lives as long as one plan() or run()."""


@contextmanager
def worker_pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """A process pool whose workers are stopped at once when the block raises (Ctrl-C among others)."""
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_start_worker)
    try:
        yield pool
    except BaseException:
        _stop_workers(pool)
        raise
    pool.shutdown()


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


def make_executor(name: str = "local", *, jobs: int | None = None, address: str | None = None,
                  engine: EngineChoice | None = None, time_scale: float = 1.0) -> Executor:
    """The executor named `name` (EXECUTORS) on the simulator, or, with a live `engine` (engine-server or a
    running engine's URL), the live executor on it, one run after another at `time_scale`. `address` is
    Ray's only; `jobs` the pool's processes or a local Ray's CPUs (a live engine's runs take no pool)."""
    if engine is not None and engine.live:
        if name != "local" or address is not None:
            raise ValueError("a live engine takes one run after another: --executor and --address are for the "
                             "simulated engine")
        from retrybench.runs.live import LiveExecutor

        return LiveExecutor(engine, time_scale=time_scale)
    if time_scale != 1.0:
        raise ValueError("--time-scale is for a live engine: the simulated engine runs in virtual time")
    if name == "local":
        if address is not None:
            raise ValueError("--address is for --executor ray")
        return LocalExecutor(jobs)
    if name == "ray":
        from retrybench.runs.ray import RayExecutor

        return RayExecutor(address, jobs)
    raise ValueError(f"unknown executor {name!r}; known: {', '.join(EXECUTORS)}")

