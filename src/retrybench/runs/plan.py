"""A run plan: run specs, each with the C-hat its rates are in, resolved once before any run.

Resolving C-hat up front means calibrating the builds the specs need that are not cached yet; an
executor does that on its own workers (a pool or Ray: one task per build and seed) and then hands
the plan to its runs, which never calibrate. A live plan's C-hat is the one given (a live
calibration's) or, as for the simulator, the simulated calibration of each spec's engine build.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field

from retrybench.calibration.store import Build, build_of, calibrate_missing, calibration_of
from retrybench.plan.spec import RunSpec

__all__ = ["PlannedRun", "RunPlan", "plan_live", "plan_runs"]


@dataclass(frozen=True)
class PlannedRun:
    """One run to make: its spec and C-hat (calls/s)."""

    spec: RunSpec
    chat: float


@dataclass(frozen=True)
class RunPlan:
    """The runs in the order their results are returned, and the calibrations they needed (build -> C-hat;
    empty where C-hat was given)."""

    runs: tuple[PlannedRun, ...]
    chats: Mapping[Build, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.runs)

    def specs(self) -> list[RunSpec]:
        return [run.spec for run in self.runs]


def plan_runs(specs: Iterable[RunSpec], pool: Executor | None = None, use_cache: bool = True) -> RunPlan:
    """Each spec at its build's C-hat (calibration/store.py). With `pool`, the builds not cached are
    calibrated on it first, one task per (build, seed); without, one after another here."""
    ordered = tuple(specs)
    builds = list(dict.fromkeys(build_of(spec) for spec in ordered))
    if pool is not None:
        calibrate_missing(pool, builds)
    chats: dict[Build, float] = {build: float(calibration_of(build, use_cache)["chat"]) for build in builds}
    return RunPlan(tuple(PlannedRun(spec, chats[build_of(spec)]) for spec in ordered), chats)


def plan_live(specs: Iterable[RunSpec], chat: float | None = None, use_cache: bool = True) -> RunPlan:
    """Each spec at C-hat `chat` (a live engine's own, measured by a live calibration), or by default at
    the simulated calibration of its engine build at its token scale."""
    ordered = tuple(specs)
    if chat is not None:
        return RunPlan(tuple(PlannedRun(spec, chat) for spec in ordered))
    builds = {spec: build_of(spec) for spec in ordered}
    chats: dict[Build, float] = {build: float(calibration_of(build, use_cache)["chat"])
                                 for build in dict.fromkeys(builds.values())}
    return RunPlan(tuple(PlannedRun(spec, chats[builds[spec]]) for spec in ordered), chats)
