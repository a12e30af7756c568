"""The boundary search on synthetic monotone outcomes: it finds every threshold on grids of every size,
in either direction, within the probes bisection needs; and run_find drives it per cell and seed
through an executor (a fake one here: no simulation)."""

from __future__ import annotations

import math
from dataclasses import replace
from decimal import Decimal

import pytest
from fixtures.runner_fakes import StandInExecutor

from retrybench.plan.spec import RunSpec
from retrybench.sweep.axes import parse_axis
from retrybench.sweep.bisect import Bisection, Boundary, boundary_of, grid
from retrybench.sweep.plan import SweepPlan
from retrybench.sweep.run import run_find, run_grid


def _search(outcomes: list[bool]) -> Bisection:
    search = Bisection(len(outcomes))
    while probes := search.next_probes():
        for k in probes:
            assert k not in search.outcomes, "a grid point probed twice"
            search.record(k, outcomes[k])
    return search


@pytest.mark.parametrize("points", [2, 3, 4, 5, 8, 17, 21, 33])
def test_bisection_finds_every_threshold(points: int) -> None:
    bound = 2 + math.ceil(math.log2(points - 1))
    for threshold in range(1, points):  # the outcome holds from `threshold` on
        rising = [k >= threshold for k in range(points)]
        found = _search(rising).boundary()
        assert found == Boundary("found", threshold, (threshold - 1, threshold), True, found.probes)
        assert found.probes <= bound
        falling = [k < threshold for k in range(points)]  # holds up to threshold - 1
        found = _search(falling).boundary()
        assert (found.status, found.critical, found.bracket, found.rises) == (
            "found", threshold - 1, (threshold - 1, threshold), False)
        assert boundary_of(rising).critical == threshold and boundary_of(falling).critical == threshold - 1


def test_no_boundary_within_the_bounds() -> None:
    assert _search([True] * 9).boundary() == Boundary("everywhere", 0, None, None, 2)
    assert _search([False] * 9).boundary() == Boundary("nowhere", None, None, None, 2)
    assert _search([True]).boundary().status == "everywhere"
    assert boundary_of([False, True, False]).status == "non-monotone"
    assert boundary_of([False, True, False, True]) == Boundary("non-monotone", 3, (2, 3), True, 4)


def test_an_unfinished_search_has_no_boundary() -> None:
    search = Bisection(9)
    search.record(0, False)
    with pytest.raises(ValueError, match="not finished"):
        search.boundary()


def test_the_grid_is_exact_and_reaches_its_top() -> None:
    assert grid(Decimal("1.0"), Decimal("3.0"), Decimal("0.1"))[17] == Decimal("2.7")
    assert grid(Decimal(0), Decimal(1), Decimal("0.3")) == [Decimal(0), Decimal("0.3"), Decimal("0.6"),
                                                            Decimal("0.9"), Decimal(1)]


# Per (condition, seed): the pulse from which a run does not recover.
THRESHOLDS = {("no-control", 1): 2.1, ("no-control", 2): 1.7, ("coalescing", 1): 9.0, ("coalescing", 2): 9.0}


def _below_threshold(spec: RunSpec) -> dict[str, object]:
    """A stand-in engine's run: it recovers below its cell's threshold pulse."""
    return {"recovered": spec.pulse_x < THRESHOLDS[spec.condition, spec.seed], "hold_delivered_pct": 50.0}


def test_run_find_reports_each_cell_and_the_spread_over_seeds() -> None:
    plan = SweepPlan(conditions=("no-control", "coalescing"), axes=(parse_axis("pulse_x=1.0:3.0:0.1"),),
                     seeds=(1, 2), model="qwen3-14b")
    executor = StandInExecutor(_below_threshold)
    found = run_find(plan, "pulse_x", None, executor)
    critical = {(b.condition, b.seed): (b.status, b.critical) for b in found.boundaries}
    assert critical == {("no-control", 1): ("found", 2.1), ("no-control", 2): ("found", 1.7),
                        ("coalescing", 1): ("nowhere", None), ("coalescing", 2): ("nowhere", None)}
    assert len(found.rows) == len(executor.ran) == sum(b.runs or 0 for b in found.boundaries)
    assert {(r["condition"], r["seed"], r["pulse_x"]) for r in found.rows} == {
        (s.condition, s.seed, s.pulse_x) for s in executor.ran}
    assert len(executor.ran) <= 4 * (2 + math.ceil(math.log2(20)))  # bisection, not the 84-run grid
    spread = {s.condition: s.record() for s in found.spreads}
    assert (spread["no-control"]["critical_min"], spread["no-control"]["critical_max"]) == (1.7, 2.1)
    assert spread["no-control"]["found"] == 2 and spread["coalescing"]["found"] == 0


def test_a_grid_sweep_reads_the_same_boundaries_off_its_grid() -> None:
    plan = SweepPlan(conditions=("no-control", "coalescing"), axes=(parse_axis("pulse_x=1.0:3.0:0.1"),),
                     seeds=(1, 2), model="qwen3-14b")
    executor = StandInExecutor(_below_threshold)
    swept = run_grid(plan, executor)
    assert len(executor.ran) == 84
    searched = run_find(plan, "pulse_x", None, StandInExecutor(_below_threshold))
    assert swept.boundaries == [replace(b, runs=21) for b in searched.boundaries]
