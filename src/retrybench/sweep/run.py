"""Running a plan: every point (a grid sweep), or a boundary search per cell (`--find`), into rows.

A row is one run: the axis values, condition, seed and the run's headline metrics, as sweep.json holds it
(a JSON object: the axes' names are its keys). A boundary is one cell's (condition x other axes x seed)
critical value along the searched axis; a spread is the same over seeds. A grid sweep reports
boundaries too, read off its grid along its first numeric axis. The runs go to any executor
(runs/executors.py): this machine's processes, Ray, or a live engine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from retrybench.plan.spec import OverrideValue
from retrybench.records.results import Result, RunSummary, is_failed
from retrybench.runs.executors import Executor, Progress, run_specs
from retrybench.sweep.bisect import Bisection, Boundary, boundary_of
from retrybench.sweep.plan import Point, SweepPlan, Values, check_specs

__all__ = ["METRICS", "UNTIL", "CellBoundary", "Find", "Record", "SeedCritical", "Spread", "SweepResult", "describe",
           "find_runs_bound", "run_find", "run_finds", "run_grid"]

METRICS = ("recovered", "recovery_s", "hold_delivered_pct", "pulse_delivered_pct", "primary_timely_pct",
           "created_x", "completed_x", "retry_share_pct", "calls_failed")

# --until: the outcome whose onset a boundary marks, as a predicate on a run's summary.
UNTIL: dict[str, Callable[[RunSummary], bool]] = {
    "not-recovered": lambda result: not result["recovered"],
    "recovered": lambda result: bool(result["recovered"]),
}


Record = dict[str, object]
"""One run, boundary or spread as sweep.json holds it: a JSON object, keyed by the axes' names too."""
Number = int | float  # a value of a numeric axis, along which boundaries are searched


def _number(value: OverrideValue) -> Number:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a boundary lies on a numeric axis, not at {value!r}")
    return value


@dataclass(frozen=True)
class CellBoundary:
    """One cell's boundary along `axis`: status "found", "everywhere", "nowhere", "non-monotone" (bisect) or
    "failed" (a run of the cell failed: `error`), the critical value and the grid values bracketing it."""

    condition: str
    seed: int
    others: Values  # the cell's values of the other axes
    axis: str
    until: str
    status: str
    critical: Number | None = None
    bracket: tuple[Number, Number] | None = None
    rises: bool | None = None
    runs: int | None = None
    error: str | None = None

    def record(self) -> Record:
        found: Record = {"condition": self.condition, "seed": self.seed, **dict(self.others), "axis": self.axis,
                         "until": self.until, "status": self.status, "critical": self.critical,
                         "bracket": list(self.bracket) if self.bracket else None, "rises": self.rises,
                         "runs": self.runs}
        return found if self.status != "failed" else {**found, "error": self.error}


@dataclass(frozen=True)
class SeedCritical:
    seed: int
    status: str
    critical: Number | None


@dataclass(frozen=True)
class Spread:
    """One condition's (and other axes') critical values over seeds, where found."""

    condition: str
    others: Values
    axis: str
    by_seed: tuple[SeedCritical, ...]

    @property
    def found(self) -> list[Number]:
        return [s.critical for s in self.by_seed if s.status == "found" and s.critical is not None]

    def record(self) -> Record:
        found = self.found
        return {"condition": self.condition, **dict(self.others), "axis": self.axis, "seeds": len(self.by_seed),
                "found": len(found), "critical_min": min(found) if found else None,
                "critical_max": max(found) if found else None,
                "critical_mean": round(statistics.fmean(found), 6) if found else None,
                "by_seed": [{"seed": s.seed, "status": s.status, "critical": s.critical} for s in self.by_seed]}


@dataclass
class SweepResult:
    """What a sweep found: its runs (rows), per-cell boundaries along `axis`, their spread over seeds."""

    rows: list[Record] = field(default_factory=list)
    boundaries: list[CellBoundary] = field(default_factory=list)
    spreads: list[Spread] = field(default_factory=list)
    axis: str | None = None
    until: str = "not-recovered"

    @property
    def failed(self) -> int:
        """How many of its runs failed."""
        return sum(1 for row in self.rows if row.get("error"))


def _row(point: Point, result: Result) -> Record:
    row: Record = {"condition": point.condition, "seed": point.seed, "model": point.spec.model,
                   "gpu": point.spec.gpu, **dict(point.values)}
    if is_failed(result):
        return {**row, **dict.fromkeys(METRICS), "error": result["error"], "key": point.spec.key()}
    metrics: Record = {m: result.get(m) for m in METRICS}
    return {**row, **metrics, "key": point.spec.key()}


def _others(point: Point, axis: str) -> Values:
    return tuple((name, value) for name, value in point.values if name != axis)


def _boundary_row(point: Point, axis: str, until: str, values: Sequence[OverrideValue],
                  boundary: Boundary | None, error: str | None = None) -> CellBoundary:
    cell = CellBoundary(point.condition, point.seed, _others(point, axis), axis, until, "failed", error=error)
    if boundary is None:
        return cell
    bracket = None
    if boundary.bracket:
        low, high = boundary.bracket
        bracket = (_number(values[low]), _number(values[high]))
    critical = _number(values[boundary.critical]) if boundary.critical is not None else None
    return replace(cell, status=boundary.status, critical=critical, bracket=bracket, rises=boundary.rises,
                   runs=boundary.probes)


def _spreads(boundaries: list[CellBoundary], axis: str) -> list[Spread]:
    """Per condition and other-axis values: the critical values over seeds (only where found)."""
    groups: dict[tuple[str, Values], list[CellBoundary]] = {}
    for b in boundaries:
        groups.setdefault((b.condition, b.others), []).append(b)
    return [Spread(condition, others, axis, tuple(SeedCritical(b.seed, b.status, b.critical) for b in members))
            for (condition, others), members in groups.items()]


def _position(point: Point, axis: str) -> float:
    value = dict(point.values)[axis]
    return float(value) if isinstance(value, int | float) else math.nan


def _first_numeric(plan: SweepPlan) -> str | None:
    return next((axis.name for axis in plan.axes if axis.numeric), None)


def run_grid(plan: SweepPlan, executor: Executor, until: str = "not-recovered",
             progress: Progress | None = None) -> SweepResult:
    """Every point of the plan; boundaries read off the grid along its first numeric axis."""
    points = plan.points()
    check_specs(p.spec for p in points)
    results = run_specs(executor, [p.spec for p in points], progress)
    found = SweepResult(rows=[_row(p, r) for p, r in zip(points, results, strict=True)],
                        axis=_first_numeric(plan), until=until)
    axis = found.axis
    if axis is None:
        return found
    cells: dict[tuple[str, int, Values], list[tuple[Point, Result]]] = {}
    for point, result in zip(points, results, strict=True):
        cells.setdefault((point.condition, point.seed, _others(point, axis)), []).append(
            (point, result))
    for members in cells.values():
        members.sort(key=lambda m: _position(m[0], axis))
        values = [dict(p.values)[axis] for p, _ in members]
        errors = [r["error"] for _, r in members if is_failed(r)]
        outcomes = [UNTIL[until](r) for _, r in members if not is_failed(r)]
        boundary = None if errors else boundary_of(outcomes)
        found.boundaries.append(_boundary_row(members[0][0], axis, until, values, boundary, next(iter(errors), None)))
    found.spreads = _spreads(found.boundaries, axis)
    return found


def find_runs_bound(plan: SweepPlan, axis: str, resolution: Decimal | None) -> int:
    """The most runs a boundary search may make (both ends, then one per halving, per cell)."""
    points = len(plan.find_grid(axis, resolution))
    cells = len(plan.points([a for a in plan.axes if a.name != axis], {axis: 0}))
    return cells * (min(points, 2) + max(0, math.ceil(math.log2(max(points - 1, 1)))))


def _at(plan: SweepPlan, point: Point, axis: str, value: OverrideValue) -> Point:
    values = tuple((name, value if name == axis else v) for name, v in point.values)
    return replace(point, values=values, spec=plan.spec(point.condition, point.seed, values))


@dataclass(frozen=True)
class Find:
    """One boundary search: every cell of `plan` bisected along `axis` at `resolution` (None: the axis' step)."""

    plan: SweepPlan
    axis: str
    resolution: Decimal | None = None


@dataclass
class _Search:
    """A Find under way: its grid, its cells and one bisection per cell."""

    find: Find
    values: Sequence[OverrideValue]
    cells: list[Point]
    searches: list[Bisection]
    errors: dict[int, str] = field(default_factory=dict)
    result: SweepResult = field(default_factory=SweepResult)

    def probes(self) -> list[tuple[int, int, Point]]:
        """(cell, grid index, point) of every run this search needs now."""
        return [(i, k, _at(self.find.plan, self.cells[i], self.find.axis, self.values[k]))
                for i, search in enumerate(self.searches) if i not in self.errors for k in search.next_probes()]

    def record(self, i: int, k: int, point: Point, result: Result, until: str) -> None:
        self.result.rows.append(_row(point, result))
        if is_failed(result):
            self.errors[i] = result["error"]
        else:
            self.searches[i].record(k, UNTIL[until](result))


def _start(find: Find, until: str) -> _Search:
    plan, axis = find.plan, find.axis
    values = plan.find_grid(axis, find.resolution)
    cells = plan.points([a for a in plan.axes if a.name != axis], {axis: values[0]})
    check_specs(_at(plan, c, axis, v).spec for c in cells for v in (values[0], values[-1]))
    return _Search(find, values, cells, [Bisection(len(values)) for _ in cells],
                   result=SweepResult(axis=axis, until=until))


def run_finds(finds: Sequence[Find], executor: Executor, until: str = "not-recovered",
              progress: Progress | None = None) -> list[SweepResult]:
    """Several boundary searches advanced together: each round runs the next probes of every cell of
    every search in one call of the executor (a spec two searches need at once runs once), so a short
    search does not wait for a long one and a process pool starts once a round, not once a search."""
    started = [_start(find, until) for find in finds]
    while True:
        probes = [(search, i, k, point) for search in started for i, k, point in search.probes()]
        if not probes:
            break
        specs = list(dict.fromkeys(point.spec for *_, point in probes))
        results = dict(zip(specs, run_specs(executor, specs, progress), strict=True))
        for search, i, k, point in probes:
            search.record(i, k, point, results[point.spec], until)
    for search in started:
        axis, found = search.find.axis, search.result
        found.boundaries = [_boundary_row(cell, axis, until, search.values,
                                          None if i in search.errors else search.searches[i].boundary(),
                                          search.errors.get(i)) for i, cell in enumerate(search.cells)]
        found.spreads = _spreads(found.boundaries, axis)
    return [search.result for search in started]


def run_find(plan: SweepPlan, axis: str, resolution: Decimal | None, executor: Executor,
             until: str = "not-recovered", progress: Progress | None = None) -> SweepResult:
    """Bisect every cell along `axis` between its bounds to `resolution`, all cells a round at a time."""
    return run_finds([Find(plan, axis, resolution)], executor, until, progress)[0]


def describe(result: SweepResult) -> Iterable[str]:
    """One line per spread, for the terminal: the critical value per condition (and other axes)."""
    for spread in result.spreads:
        others = ", ".join(f"{k}={v}" for k, v in spread.others)
        where = spread.condition + (f" ({others})" if others else "")
        if found := spread.found:
            low, high = min(found), max(found)
            span = f"{low}" if low == high else f"{low}-{high}"
            yield f"{where}: {result.until} from {result.axis} = {span} ({len(found)} of {len(spread.by_seed)} seeds)"
        else:
            statuses = ", ".join(sorted({s.status for s in spread.by_seed}))
            yield f"{where}: no boundary of {result.until} along {result.axis} ({statuses})"
