"""Where a sweep's runs execute: this machine's process pool, or Ray (a local instance or a cluster).

Both read and write the same result cache (runner's), so a sweep resumes under either. Runs already
cached are read here and never sent out. The Ray executor sends each run spec as one task with its
C-hat and gets the summary back, then stores it here: a cluster's workers need no access to this
machine's disk, only the same retrybench code, which is checked (a summary carries its code version).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future
from functools import cache, partial
from pathlib import Path
from typing import Any, Protocol, cast

from retrybench.plan.spec import RunSpec
from retrybench.records.cache import code_version
from retrybench.records.results import FailedRun, Result, is_failed
from retrybench.runs.runner import (
    calibrate_builds,
    calibration_for,
    run_is_cached,
    run_many,
    run_one,
    run_safely,
    store_run,
    summarize_spec,
)

__all__ = ["EXECUTORS", "LocalExecutor", "Progress", "RayExecutor", "RayMissing", "RunExecutor", "make_executor"]

Progress = Callable[[RunSpec, Result], None]
EXECUTORS = ("local", "ray")


class RunExecutor(Protocol):
    """Runs specs to results, in the order given, through the result cache."""

    name: str

    def run(self, specs: Sequence[RunSpec], progress: Progress | None = None) -> list[Result]: ...

    def close(self) -> None: ...


def _from_cache(specs: Sequence[RunSpec], progress: Progress | None) -> tuple[dict[int, Result], list[int]]:
    """The results already cached (read here, reported to `progress`) and the indices still to run."""
    done: dict[int, Result] = {}
    missing: list[int] = []
    for i, spec in enumerate(specs):
        if run_is_cached(spec):
            done[i] = run_one(spec)
            if progress:
                progress(spec, done[i])
        else:
            missing.append(i)
    return done, missing


class LocalExecutor:
    """runner.run_many's process pool on this machine's cores (`jobs`, default all)."""

    name = "local"

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = jobs

    def run(self, specs: Sequence[RunSpec], progress: Progress | None = None) -> list[Result]:
        done, missing = _from_cache(specs, progress)
        fresh = run_many([specs[i] for i in missing], jobs=self.jobs, progress=progress) if missing else []
        done.update(zip(missing, fresh, strict=True))
        return [done[i] for i in range(len(specs))]

    def close(self) -> None:
        """Nothing to release: run_many's pool lives as long as one call."""


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


class _RayPool(Executor):
    """A concurrent.futures view of Ray tasks, for runner.calibrate_builds: one task per submit."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = _remote_apply().remote(partial(fn, **kwargs), args).future()
        return future


def _summarize(spec: RunSpec, chat: float) -> Result:
    """One run on a Ray worker: the summary, or the spec with its error."""
    return run_safely(partial(summarize_spec, chat=chat), spec)


def _failed(spec: RunSpec, error: str) -> FailedRun:
    failed = {**spec.as_dict(), "error": error}
    return cast(FailedRun, failed)


class RayExecutor:
    """One Ray task per run spec. `address` names a running cluster (`ray start --head`, `ray up`), whose
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

    def run(self, specs: Sequence[RunSpec], progress: Progress | None = None) -> list[Result]:
        done, missing = _from_cache(specs, progress)
        if missing:
            ray = self._connect()
            chats = self._chats(specs[i] for i in missing)
            remote = _remote_apply()
            pending = {remote.remote(_summarize, (specs[i], chats[_build(specs[i])])): i for i in missing}
            version = code_version()
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                i = pending.pop(ready[0])
                done[i] = self._store(specs[i], ray.get(ready[0]), version)
                if progress:
                    progress(specs[i], done[i])
        return [done[i] for i in range(len(specs))]

    @staticmethod
    def _store(spec: RunSpec, result: Result, version: str) -> Result:
        """Cache a worker's summary, unless it failed or the worker ran other code than this checkout's."""
        if is_failed(result):
            return result
        if result["code_version"] != version:
            return _failed(spec, f"the worker ran retrybench code {result['code_version']}, this checkout is "
                                 f"{version}: install the same version on the cluster")
        store_run(spec, result)
        return result

    def _chats(self, specs: Iterable[RunSpec]) -> dict[tuple[str, str, bool, float], float]:
        """C-hat of every build the specs need: calibrated as Ray tasks (one per seed) where not cached."""
        builds = {_build(spec) for spec in specs}
        calibrate_builds(_RayPool(), [(m, g, mixed) for m, g, mixed, scale in builds if scale == 1.0])
        return {build: float(calibration_for(*build[:3], token_scale=build[3])["chat"]) for build in builds}

    def close(self) -> None:
        """Stop the Ray instance this executor started (a cluster only disconnects)."""
        if self._started:
            _ray().shutdown()
            self._started = False


def _build(spec: RunSpec) -> tuple[str, str, bool, float]:
    return spec.model, spec.gpu, spec.mixed_prompts, spec.token_scale


def make_executor(name: str, *, jobs: int | None = None, address: str | None = None) -> RunExecutor:
    """The executor named `name` (EXECUTORS); `address` is Ray's only."""
    if name == "local":
        if address is not None:
            raise ValueError("--address is for --executor ray")
        return LocalExecutor(jobs)
    if name == "ray":
        return RayExecutor(address, jobs)
    raise ValueError(f"unknown executor {name!r}; known: {', '.join(EXECUTORS)}")
