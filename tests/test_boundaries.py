"""The boundary maps `reproduce` computes (sweep.boundaries): which searches they plan, what a synthetic
monotone outcome gives through them (no simulation), that a cell is the run `retrybench run` computes
for its spec, and `reproduce` computing them through the cache (a rerun computes nothing)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures.runner_fakes import StandInExecutor

from retrybench.calibration.store import EngineBuild
from retrybench.cli.main import main
from retrybench.plan.blocks import PAPER_MODELS, PRIMARY_MODEL, PULSES_X, TABLE1
from retrybench.plan.spec import RunSpec
from retrybench.records.cache import write_entry
from retrybench.report.boundaries import PAPER_Q, boundaries_section
from retrybench.runs import executors
from retrybench.runs.executors import LocalExecutor
from retrybench.runs.plan import RunPlan
from retrybench.sweep import boundaries
from retrybench.sweep.boundaries import BoundaryMap, plan_maps, pulse_map, run_maps, runs_bound
from retrybench.sweep.reproduce import wanted

QWEN3 = "qwen3-14b"
CHAT = 1.0900243919376884  # Qwen3-14B's C-hat as calibrated (tests/sim/test_digests.py pins it too)


def _pairs(found: BoundaryMap) -> set[tuple[str, str]]:
    """(Table 1 condition, model) of every cell a pulse map searches, aliases included."""
    pairs = set()
    for find in found.finds:
        models = next(a.values for a in find.plan.axes if a.name == "model")
        pairs |= {(name, str(model)) for c in find.plan.conditions for name in found.aliases[c] for model in models}
    return pairs


def test_the_pulse_map_searches_every_condition_and_model_of_table1_once() -> None:
    maps = {m.name: m for m in plan_maps(list(PAPER_MODELS))}
    assert list(maps) == ["pulse", "deferral", "engine-cap"]
    pulse = maps["pulse"]
    table1 = {(c, m) for block in TABLE1.values() for c in block.conditions for m in block.models}
    assert _pairs(pulse) == table1
    assert pulse.aliases["retries-on-cancel-off"] == ("retries-on-cancel-off", "no-control")  # one policy, run once
    searched = [c for f in pulse.finds for c in f.plan.conditions]
    assert len(searched) == len(set(searched)) == len(pulse.aliases)
    specs = [p.spec for f in pulse.finds for p in f.plan.points()]
    assert {s.seed for s in specs} == set(boundaries.SEEDS)
    assert {(s.max_batched_tokens, s.mixed_prompts, s.trace, s.overrides) for s in specs} == {(8192, False, False, ())}
    assert {f.axis for f in pulse.finds} == {"pulse_x"}
    assert all(f.plan.find_grid("pulse_x", None) == [1.0 + 0.25 * k for k in range(9)] for f in pulse.finds)
    # The paper's runs on the map: the trigger sweep's pulses on every model, 2.7 elsewhere.
    assert {"panel": QWEN3, "x": 2.0, "y": "retries-on-cancel-off"} in pulse.points
    assert {"panel": PRIMARY_MODEL, "x": 2.7, "y": "lifo"} in pulse.points
    assert not any(p["panel"] == QWEN3 and p["y"] == "lifo" for p in pulse.points)  # lifo runs on Qwen2.5 only


def test_the_deferral_and_engine_cap_maps_hold_the_papers_points() -> None:
    maps = {m.name: m for m in plan_maps(list(PAPER_MODELS))}
    deferral, cap = maps["deferral"], maps["engine-cap"]
    (find,) = deferral.finds
    assert find.plan.conditions == ("deferred-cancellation",) and find.axis == "pulse_x"
    assert next(a for a in find.plan.axes if a.name == "proxy.defer_s").values == (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)
    at_paper = find.plan.spec("deferred-cancellation", 1, (("pulse_x", 2.0), ("proxy.defer_s", 10.0)))
    assert at_paper == RunSpec(model=PRIMARY_MODEL, condition="deferred-cancellation", seed=1, pulse_x=2.0)
    assert deferral.points == ({"panel": "deferred-cancellation", "x": 2.7, "y": 10.0},)
    (find,) = cap.finds
    assert find.plan.conditions == ("engine-cap-338", "engine-cap-338-cancel-on") and find.axis == "engine_cap"
    grid = find.plan.find_grid("engine_cap", None)
    assert (grid[0], grid[-1], len(grid)) == (25, 1000, 40) and 100 in grid
    assert cap.ys == tuple(PULSES_X)
    assert PAPER_Q == 338
    assert sorted((p["panel"], p["x"], p["y"]) for p in cap.points) == [
        ("engine-cap-338", 100, 2.7), ("engine-cap-338", 338, 2.7), ("engine-cap-338-cancel-on", 338, 2.7)]


def test_without_the_primary_model_only_the_pulse_map_runs() -> None:
    (only,) = plan_maps([QWEN3])
    assert only.name == "pulse" and only.panels == (QWEN3,)
    table1 = {c for block in TABLE1.values() if QWEN3 in block.models for c in block.conditions}
    assert {c for c, _ in _pairs(only)} == table1


def test_reproduce_computes_the_maps_with_all_or_by_name() -> None:
    assert wanted("all", skip=False) and wanted("diagnostic, boundaries", skip=False)
    assert not wanted("all", skip=True) and not wanted("table1", skip=False)
    assert not wanted("diagnostic,trigger-sweep,composition", skip=False)  # what the resume test runs


class ThresholdExecutor(StandInExecutor):
    """A stand-in engine: a run recovers below its cell's threshold. Records every round (plan)."""

    def __init__(self, threshold: Callable[[RunSpec], tuple[str, float]]) -> None:
        super().__init__(self.outcome_of)
        self.threshold = threshold
        self.calls: list[list[RunSpec]] = []

    def plan(self, specs: Sequence[RunSpec]) -> RunPlan:
        self.calls.append(list(specs))
        return super().plan(specs)

    def outcome_of(self, spec: RunSpec) -> dict[str, object]:
        axis, limit = self.threshold(spec)
        value = spec.engine_cap if axis == "engine_cap" else spec.pulse_x
        return {"recovered": value is not None and value < limit, "hold_delivered_pct": 50.0}


# Per model and seed, the pulse from which retries-on-cancel-off does not recover; the Q from which the
# engine-cap conditions do not at any pulse; W's effect on deferred cancellation.
PULSE_LIMITS = {(PRIMARY_MODEL, 1): 1.9, (PRIMARY_MODEL, 2): 2.1, (QWEN3, 1): 2.6, (QWEN3, 2): 2.6,
                ("llama-3.1-8b-instruct", 1): 2.4, ("llama-3.1-8b-instruct", 2): 2.8}
CAP_LIMITS = {1: 290, 2: 340}


def threshold(spec: RunSpec) -> tuple[str, float]:
    if spec.engine_cap is not None:
        return "engine_cap", CAP_LIMITS[spec.seed]
    if spec.condition in ("retries-on-cancel-off", "no-control"):
        return "pulse_x", PULSE_LIMITS[spec.model, spec.seed]
    if spec.condition == "deferred-cancellation":  # W = 10 s is the condition's own: no override
        return "pulse_x", 1.1 + float(dict(spec.overrides).get("proxy.defer_s", 10.0) or 0.0) / 10
    return "pulse_x", math.inf


def _critical(limit: float, low: float, step: float) -> float:
    """The smallest grid value at or above `limit`: where a search must find the boundary."""
    return low + step * math.ceil(round((limit - low) / step, 9))


def test_a_synthetic_monotone_outcome_gives_its_critical_values_and_spread() -> None:
    maps = plan_maps(list(PAPER_MODELS))
    executor = ThresholdExecutor(threshold)
    docs = run_maps(maps, executor)
    ran = [spec for call in executor.calls for spec in call]
    assert len(ran) == len(set(ran)) <= runs_bound(maps)
    assert len(executor.calls) <= 2 + math.ceil(math.log2(39))  # every map a round at a time, together
    section = boundaries_section(docs)
    rows = {(r["condition"], r["other"]): r for r in section["tables"]["pulse"]}
    for model in PAPER_MODELS:
        row = rows["retries-on-cancel-off (= no-control)", model]
        expected = [_critical(PULSE_LIMITS[model, seed], 1.0, 0.25) for seed in (1, 2)]
        assert [s["critical"] for s in row["seeds"]] == [f"{x:g}" for x in expected]
        assert row["spread"] == (f"{min(expected):g}" if len(set(expected)) == 1 else
                                 f"{min(expected):g}–{max(expected):g}")
        assert rows["coalescing", model]["seeds"][0]["critical"] == "> 3"  # recovers over the whole range
    cell, q = section["pulse_cell"], section["q_range"]
    assert cell is not None and q is not None
    qwen25 = cell["sentences"][0]
    assert qwen25.startswith(f"{PRIMARY_MODEL}: the smallest pulse that does not recover is 2 on seed 1, 2.25 on "
                             "seed 2")
    assert "seeds that do not recover: 1 of 2" in qwen25 and "on 2 of 2 seeds" in qwen25
    deferral = {r["other"]: r["seeds"][0]["critical"] for r in section["tables"]["deferral"]}
    assert deferral == {"0": "1.25", "1": "1.25", "2": "1.5", "5": "1.75", "10": "2.25", "30": "> 3"}
    off = next(s for s in q["sentences"] if s.startswith("engine-cap-338 at 2.7"))
    assert "is 300 on seed 1, 350 on seed 2 (grid step 25)" in off
    assert "Every seed recovers at Q ≤ 275. No seed recovers at Q ≥ 350." in off
    assert "Recovery depends on the seed from Q = 300 to 325." in off
    assert "Q = 338 (the paper's): it lies between grid values" in off


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    write_entry(EngineBuild(QWEN3).path(), {"chat": CHAT})  # no test calibrates
    return tmp_path / "cache"


def test_a_map_cell_is_the_run_retrybench_run_computes(cache: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    found = pulse_map([QWEN3], seeds=(1,), conditions=["retries-on-cancel-off"])
    assert found is not None
    (doc,) = run_maps([found], LocalExecutor(jobs=1))
    (boundary,) = doc["boundaries"]
    assert boundary["status"] == "found" and boundary["runs"] == len(doc["rows"]) <= 5
    row = next(r for r in doc["rows"] if r["pulse_x"] == boundary["critical"])
    spec = RunSpec(model=QWEN3, condition="retries-on-cancel-off", seed=1, pulse_x=row["pulse_x"])
    assert row["key"] == spec.key()  # the very cache entry reproduce's runs use
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "alone"))  # where `run` computes it afresh
    write_entry(EngineBuild(QWEN3).path(), {"chat": CHAT})
    result = CliRunner().invoke(main, ["run", "--condition", "retries-on-cancel-off", "--model", QWEN3, "--seed", "1",
                                       "--pulse-x", str(row["pulse_x"]), "--json"])
    assert result.exit_code == 0, result.output
    alone = json.loads(result.stdout)
    metrics = ("recovered", "recovery_s", "hold_delivered_pct", "pulse_delivered_pct", "primary_timely_pct",
               "created_x", "completed_x", "retry_share_pct")
    assert {m: row[m] for m in metrics} == {m: alone[m] for m in metrics}
    assert row["recovered"] is False  # the critical pulse is where it stops recovering


def test_reproduce_computes_the_maps_and_a_rerun_computes_nothing(cache: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boundaries, "SEEDS", (1,))  # the smallest maps that still search: both ends only
    monkeypatch.setattr(boundaries, "PULSE_AXIS", "pulse_x=1.5:2.5:1.0")
    command = ["reproduce", "--model", QWEN3, "--block", "trigger-sweep,boundaries", "--runs", "1", "--jobs", "2",
               "--out", str(tmp_path / "out")]
    first = CliRunner().invoke(main, command)
    assert first.exit_code == 0, first.output
    conditions = {c for block in TABLE1.values() if QWEN3 in block.models for c in block.conditions}
    distinct = 2 * (len(conditions) - 1)  # no-control is retries-on-cancel-off's run; two ends per cell
    assert f"boundaries: {distinct} distinct runs" in " ".join(first.output.split())
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'id="boundaries"' in page and "Boundaries 1. Recovery over the pulse" in page
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["boundaries"]
    assert summary["distinct"] == distinct and summary["seeds"] == [1] and not summary["failed"]
    assert list(summary["maps"]) == ["pulse"]

    def no_runs(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a cached run was computed again")

    monkeypatch.setattr(executors, "compute", no_runs)
    again = CliRunner().invoke(main, command)
    assert again.exit_code == 0, again.output
    assert f"boundaries: {distinct} distinct runs ({distinct} cached)" in " ".join(again.output.split())


def test_reproduce_refuses_the_maps_on_a_live_engine_before_any_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["reproduce", "--engine", "http://127.0.0.1:9", "--block", "boundaries",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 2 and "simulated engine only" in result.output


def test_the_grid_holds_the_papers_pulses() -> None:
    grid = plan_maps([QWEN3])[0].finds[0].plan.find_grid("pulse_x", Decimal("0.25"))
    assert {1.5, 2.0} <= set(grid) and 2.7 not in grid  # 2.7 falls between 2.5 and 2.75 on the map
