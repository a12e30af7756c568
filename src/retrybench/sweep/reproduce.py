"""The boundaries step of `retrybench reproduce`: whether to compute the maps, and computing them on
this machine's process pool through the result cache, with a progress display, timed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import Progress

from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result, is_failed
from retrybench.runs.runner import run_is_cached
from retrybench.sweep.boundaries import plan_maps, run_maps, runs_bound
from retrybench.sweep.executors import LocalExecutor
from retrybench.sweep.executors import Progress as Report

__all__ = ["BOUNDARIES", "Computed", "compute_boundaries", "wanted"]

BOUNDARIES = "boundaries"  # the maps' name in `reproduce --block`


def wanted(blocks_text: str, skip: bool) -> bool:
    """Whether `reproduce --block TEXT` computes the maps: with `all` (the default) or when named,
    unless --no-boundaries."""
    parts = {part.strip() for part in blocks_text.split(",")}
    return not skip and bool(parts & {"all", BOUNDARIES})


class _Counting(LocalExecutor):
    """The local executor, counting the distinct specs it was given and how many were cached then."""

    def __init__(self, jobs: int | None) -> None:
        super().__init__(jobs)
        self.seen: set[RunSpec] = set()
        self.cached = 0

    def run(self, specs: Sequence[RunSpec], progress: Report | None = None) -> list[Result]:
        new = set(specs) - self.seen
        self.cached += sum(run_is_cached(spec) for spec in new)
        self.seen |= new
        return super().run(specs, progress)


@dataclass(frozen=True)
class Computed:
    """The maps as the report reads them, and what they cost here."""

    maps: list[dict[str, Any]]
    runs: int  # distinct run specs the searches needed
    cached: int  # of those, already in the cache
    wall_s: float


def compute_boundaries(models: Sequence[str], gpu: str, jobs: int | None, progress: Progress,
                       console: Console) -> Computed:
    """Every map's boundary searches, a round at a time on `jobs` processes (default all cores)."""
    maps = plan_maps(models, gpu)
    bound = runs_bound(maps)
    console.print(f"boundaries: {len(maps)} maps, at most {bound} runs (bisection; cached runs are reused)")
    executor = _Counting(jobs)
    started = time.perf_counter()
    with progress:
        task = progress.add_task("boundaries", total=bound)

        def advance(spec: RunSpec, result: Result) -> None:
            progress.update(task, advance=1, description=f"boundaries: {spec.condition}")
            if is_failed(result):
                console.print(f"[red]run failed[/red] boundaries: {spec}: {result['error']}")

        docs = run_maps(maps, executor, advance)
        progress.update(task, total=len(executor.seen), completed=len(executor.seen))
    return Computed(docs, len(executor.seen), executor.cached, time.perf_counter() - started)
