"""The Ray executor: a plan's runs as Ray tasks on a local Ray instance or a cluster.

Runs already cached are read here and never sent out. Each other run goes out as one task with its
spec and C-hat and comes back as its summary, stored here: a cluster's workers need no access to this
machine's disk, only the same retrybench code, which is checked (a summary carries its code version).
Missing calibrations are Ray tasks too, one per (build, seed). Ray is an optional extra, imported only
when this executor is made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor as TaskPool
from concurrent.futures import Future
from functools import cache, partial
from pathlib import Path
from typing import Any, cast

from retrybench.calibration.store import build_of, calibrate_missing
from retrybench.plan.spec import RunSpec
from retrybench.records.cache import code_version
from retrybench.records.results import FailedRun, Result, SpecFields, is_failed
from retrybench.runs.executors import Progress, from_cache, run_safely
from retrybench.runs.plan import PlannedRun, RunPlan, plan_runs
from retrybench.runs.simulate import summarize_spec
from retrybench.runs.store import store_run

__all__ = ["RayExecutor", "RayMissing"]


class RayMissing(RuntimeError):
    """Ray is not installed here."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise RayMissing("the ray executor needs Ray: pip install 'retrybench[ray]'") from error
    return ray


def _apply(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return fn(*args)


@cache
def _remote_apply() -> Any:
    return _ray().remote(_apply)


class _RayPool(TaskPool):
    """A concurrent.futures view of Ray tasks, for calibrate_missing: one task per submit, Ray connected
    (by `connect`) at the first."""

    def __init__(self, connect: Callable[[], object]) -> None:
        self.connect = connect

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.connect()
        future: Future[Any] = _remote_apply().remote(partial(fn, **kwargs), args).future()
        return future


def _summarize(run: PlannedRun) -> Result:
    """One run on a Ray worker: the summary, or the spec with its error."""
    return run_safely(lambda planned: summarize_spec(planned.spec, planned.chat), run)


def _failed(spec: RunSpec, error: str) -> FailedRun:
    return {**cast(SpecFields, spec.as_dict()), "error": error}


class RayExecutor:
    """One Ray task per run. `address` names a running cluster (`ray start --head`, `ray up`), whose
    workers get this checkout's retrybench package shipped with the job; None starts a local Ray
    instance with `jobs` CPUs (default: all) and stops it on close(). A Ray already initialised in
    this process is used as it is, and left running."""

    name = "ray"

    def __init__(self, address: str | None = None, jobs: int | None = None) -> None:
        self.address, self.jobs = address, jobs
        self._started = False
        _ray()  # fail now, not after the first round, where Ray is missing

    def _connect(self) -> Any:
        ray = _ray()
        if not ray.is_initialized():
            if self.address is not None:
                import retrybench

                package = str(Path(retrybench.__file__).parent)
                ray.init(address=self.address, runtime_env={"py_modules": [package]}, log_to_driver=False)
            else:
                ray.init(num_cpus=self.jobs, include_dashboard=False, log_to_driver=False)
            self._started = True
        return ray

    def plan(self, specs: Sequence[RunSpec]) -> RunPlan:
        """C-hat of every spec; the builds not cached are calibrated as Ray tasks, one per (build, seed)."""
        calibrate_missing(_RayPool(self._connect), [build_of(spec) for spec in specs])
        return plan_runs(specs)

    def run(self, plan: RunPlan, progress: Progress | None = None) -> list[Result]:
        done, missing = from_cache(plan, progress)
        if missing:
            ray = self._connect()
            remote = _remote_apply()
            pending = {remote.remote(_summarize, (plan.runs[i],)): i for i in missing}
            version = code_version()
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                i = pending.pop(ready[0])
                done[i] = self.store(plan.runs[i].spec, ray.get(ready[0]), version)
                if progress:
                    progress(plan.runs[i].spec, done[i])
        return [done[i] for i in range(len(plan))]

    @staticmethod
    def store(spec: RunSpec, result: Result, version: str) -> Result:
        """Cache a worker's summary, unless it failed or the worker ran other code than this checkout's."""
        if is_failed(result):
            return result
        if result["code_version"] != version:
            return _failed(spec, f"the worker ran retrybench code {result['code_version']}, this checkout is "
                                 f"{version}: install the same version on the cluster")
        store_run(spec, result)
        return result

    def close(self) -> None:
        """Stop the Ray instance this executor started (a cluster only disconnects)."""
        if self._started:
            _ray().shutdown()
            self._started = False
