"""`retrybench assess` as a service: every control on one setup at its burst, then each control's critical
burst by bisection, on an executor through the result cache, then the page and JSON.

Every run goes through the cache (keyed by spec and code version), so a rerun of the same request computes
only what is missing; Ctrl-C stops the runs and raises Interrupted, which says how many are cached.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from retrybench.assess.plan import AssessSetup, assess_specs, burst_grids, burst_of, controls, with_burst
from retrybench.assess.verdict import BurstLimit, ControlOutcome, SeedLimit, outcome_of, seed_limit, verdict
from retrybench.plan.spec import PAPER_PULSE_X, RunSpec
from retrybench.records.results import Result, is_failed
from retrybench.runs.display import Display, SilentDisplay
from retrybench.runs.executors import Executor, Interrupted
from retrybench.runs.store import run_is_cached
from retrybench.sweep.bisect import Bisection, grid

__all__ = ["AssessError", "AssessOutcome", "AssessRequest", "Interrupted", "assess", "pick_controls"]


class AssessError(ValueError):
    """A request that cannot run (an unknown control)."""


@dataclass(frozen=True)
class AssessRequest:
    """The setup, the controls to assess (empty: all), whether to search each one's critical burst, and
    the command line it came from (for the page)."""

    setup: AssessSetup
    conditions: tuple[str, ...] = ()
    boundaries: bool = True
    command: str = "retrybench assess"


@dataclass
class AssessOutcome:
    """What an assessment found: per control its outcome, the runs at the setup's burst, C-hat, the
    burst in words, the verdict and the wall time."""

    request: AssessRequest
    outcomes: list[ControlOutcome]
    results: list[Result]
    chat: float | None
    burst: str
    verdict: str
    wall_s: float
    search_runs: int = 0
    notes: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        """Whether a run at the burst or of a search failed (the command exits 1)."""
        return any(o.failed_runs for o in self.outcomes) or any(
            s.status == "failed" for o in self.outcomes if o.limit for s in o.limit.seeds)


def pick_controls(setup: AssessSetup, names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The controls to assess (all where `names` is empty), each under the name it is run as; AssessError
    names one that is neither a control of Table 1 nor of the retention block (nor of a block in `also`)."""
    known = controls(setup.client, setup.also)
    if not names:
        return known
    alias_of = {alias: name for name, aliases in known.items() for alias in aliases}
    unknown = [n for n in names if n not in alias_of]
    if unknown:
        raise AssessError(f"unknown control(s) {', '.join(unknown)}; known: {', '.join(alias_of)}")
    wanted = {alias_of[n] for n in names}
    return {name: aliases for name, aliases in known.items() if name in wanted}


def one_burst(setup: AssessSetup) -> float | None:
    """The setup's burst where the search's line runs through it (the paper's pulse, or recorded bursts all
    of one size), for checking the search against the runs at it; else None."""
    sizes = {x for _, _, x in setup.recorded.get("pulses", ())}
    return burst_of(setup) if not setup.recorded or len(sizes) == 1 else None


def burst_words(setup: AssessSetup) -> str:
    """The setup's burst in words, for the verdict."""
    if not setup.recorded:
        paper = "the paper's burst" if setup.pulse_x == PAPER_PULSE_X else "a burst"
        return f"{paper} (pulse {setup.pulse_x:g} x C-hat for 107 s on the paper's trace)"
    pulses = setup.recorded.get("pulses", ())
    if not pulses:
        return "the recorded workload as it is (no --pulse burst)"
    return "a burst of " + ", ".join(f"{x:g} x C-hat for {d:g} s from {a:g} s" for a, d, x in pulses)


def setup_words(setup: AssessSetup) -> str:
    """The setup in words, for the verdict."""
    load = f"workload {Path(setup.recorded['workload_file']).name}" if setup.recorded.get("workload_file") \
        else "the paper's trace"
    client = f", client {setup.client}" if setup.client else ""
    scale = f", token scale {setup.token_scale:g}" if setup.token_scale != 1.0 else ""
    return f"{setup.model} on {setup.gpu} ({load}{client}{scale})"


class _Runner:
    """Runs spec batches on the executor with progress, remembering every distinct spec it was given."""

    def __init__(self, executor: Executor, display: Display) -> None:
        self.executor, self.display = executor, display
        self.seen: set[RunSpec] = set()

    def run(self, specs: list[RunSpec], label: str) -> list[Result]:
        self.seen |= set(specs)

        def advance(spec: RunSpec, result: Result) -> None:
            self.display.advance(1, f"{label}: {spec.condition}")
            if is_failed(result):
                self.display.failed(f"{spec}: {result['error']}")

        return self.executor.run(self.executor.plan(specs), advance)


def _search(setup: AssessSetup, names: Sequence[str], runner: _Runner, display: Display) -> dict[str, BurstLimit]:
    """Each control's critical burst on each seed: bisection of "not recovered" on each stage's grid, every
    cell advanced together a round of runs at a time; a cell that recovered over a whole stage goes on to
    the next."""
    stages = burst_grids(setup)
    cells = [(name, seed) for name in names for seed in setup.seeds]
    limits: dict[tuple[str, int], SeedLimit] = {}
    for bounds in stages:
        values = [float(v) for v in grid(*bounds)]
        found = _bisect(setup, cells, values, runner, display)
        limits |= found
        cells = [cell for cell, limit in found.items() if limit.status == "nowhere"]
        if not cells:
            break
    low, high = float(stages[0][0]), float(stages[-1][1])
    return {name: BurstLimit(low, high, tuple(limits[name, seed] for seed in setup.seeds)) for name in names}


def _bisect(setup: AssessSetup, cells: Sequence[tuple[str, int]], values: list[float], runner: _Runner,
            display: Display) -> dict[tuple[str, int], SeedLimit]:
    """One stage of the search: each cell's limit on the grid `values`."""
    searches = {cell: Bisection(len(values)) for cell in cells}
    failed: set[tuple[str, int]] = set()
    bound = len(searches) * (2 + math.ceil(math.log2(max(len(values) - 1, 1))))
    display.note(f"critical burst: {len(searches)} searches on {values[0]:g}..{values[-1]:g} x C-hat, at most "
                 f"{bound} runs (bisection; cached runs are reused)")
    display.start("critical burst", bound)
    done = 0
    try:
        while True:
            probes = [(cell, i) for cell, b in searches.items() if cell not in failed for i in b.next_probes()]
            if not probes:
                break
            specs = [with_burst(setup.spec(name, seed), values[i]) for (name, seed), i in probes]
            for (cell, i), result in zip(probes, runner.run(specs, "critical burst"), strict=True):
                if is_failed(result):
                    failed.add(cell)
                else:
                    searches[cell].record(i, not result["recovered"])
            done += len(probes)
    finally:
        display.stop(done)
    return {cell: seed_limit(cell[1], None if cell in failed else b.boundary(), values)
            for cell, b in searches.items()}


def assess(request: AssessRequest, executor: Executor, display: Display | None = None) -> AssessOutcome:
    """Run the request on `executor` (closed at the end); AssessError for an unknown control, Interrupted on
    Ctrl-C."""
    display = display or SilentDisplay()
    setup = request.setup
    chosen = pick_controls(setup, request.conditions)
    names = list(chosen)
    specs = assess_specs(setup, names)
    runner = _Runner(executor, display)
    notes: list[str] = []
    started = time.perf_counter()
    cached = sum(run_is_cached(spec) for spec in specs)
    display.note(f"{len(names)} controls x {len(setup.seeds)} seeds: {len(specs)} runs, {cached} cached")
    try:
        display.start("controls", len(specs))
        try:
            results = runner.run(specs, "controls")
        finally:
            display.stop()
        limits: dict[str, BurstLimit] = {}
        if request.boundaries:
            if not burst_grids(setup):
                notes.append("critical burst not searched: the workload has no burst (give --pulse AT:DURATION:X)")
            else:
                limits = _search(setup, names, runner, display)
    except KeyboardInterrupt:
        raise Interrupted(sum(run_is_cached(s) for s in runner.seen), len(runner.seen)) from None
    finally:
        executor.close()
    for note in notes:
        display.note(note)
    per_seed = len(setup.seeds)
    burst = one_burst(setup)
    outcomes = [outcome_of(name, chosen[name], results[k * per_seed:(k + 1) * per_seed], limits.get(name), burst)
                for k, name in enumerate(names)]
    chats = [r["chat"] for r in results if not is_failed(r)]
    words = burst_words(setup)
    text = verdict(outcomes, setup_words(setup), words, setup.seeds)
    return AssessOutcome(request, outcomes, results, chats[0] if chats else None, words, text,
                         time.perf_counter() - started, len(runner.seen - set(specs)), tuple(notes))

