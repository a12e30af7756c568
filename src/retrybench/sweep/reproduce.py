"""The boundaries step of `retrybench reproduce`: whether to compute the maps, and computing them on any
executor through the result cache, with a progress display, timed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result, is_failed
from retrybench.report.boundaries import MapDocument
from retrybench.runs.display import Display
from retrybench.runs.executors import Executor
from retrybench.runs.executors import Progress as Report
from retrybench.runs.plan import RunPlan
from retrybench.runs.store import run_is_cached
from retrybench.sweep.boundaries import plan_maps, run_maps, runs_bound

__all__ = ["BOUNDARIES", "Computed", "compute_maps", "wanted"]

BOUNDARIES = "boundaries"  # the maps' name in `reproduce --block`


def wanted(blocks_text: str, skip: bool) -> bool:
    """Whether `reproduce --block TEXT` computes the maps: with `all` (the default) or when named,
    unless --no-boundaries."""
    parts = {part.strip() for part in blocks_text.split(",")}
    return not skip and bool(parts & {"all", BOUNDARIES})


class _Counting:
    """An executor that counts the distinct specs it was given and how many were cached then."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.name = inner.name
        self.seen: set[RunSpec] = set()
        self.cached = 0

    def plan(self, specs: Sequence[RunSpec]) -> RunPlan:
        new = set(specs) - self.seen
        self.cached += sum(run_is_cached(spec) for spec in new)
        self.seen |= new
        return self.inner.plan(specs)

    def run(self, plan: RunPlan, progress: Report | None = None) -> list[Result]:
        return self.inner.run(plan, progress)

    def close(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class Computed:
    """The maps as the report reads them, and what they cost here."""

    maps: list[MapDocument]
    runs: int  # distinct run specs the searches needed
    cached: int  # of those, already in the cache
    wall_s: float


def compute_maps(models: Sequence[str], gpu: str, executor: Executor, display: Display) -> Computed:
    """Every map's boundary searches, a round at a time on `executor`."""
    maps = plan_maps(models, gpu)
    bound = runs_bound(maps)
    display.note(f"boundaries: {len(maps)} maps, at most {bound} runs (bisection; cached runs are reused)")
    counting = _Counting(executor)
    started = time.perf_counter()

    def advance(spec: RunSpec, result: Result) -> None:
        display.advance(1, f"boundaries: {spec.condition}")
        if is_failed(result):
            display.failed(f"boundaries: {spec}: {result['error']}")

    display.start("boundaries", bound)
    try:
        docs = run_maps(maps, counting, advance)
    finally:
        display.stop(len(counting.seen))
    return Computed(docs, len(counting.seen), counting.cached, time.perf_counter() - started)
