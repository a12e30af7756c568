"""`retrybench assess`: the controls and runs it plans on a setup, the per-control outcome and the verdict from
synthetic results (pure), and the command end to end on the tiny CPU model, page and JSON included."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner
from markupsafe import escape

from retrybench.assess.plan import AssessSetup, assess_specs, burst_grids, burst_of, controls, with_burst
from retrybench.assess.run import AssessError, AssessRequest, Interrupted, assess, pick_controls
from retrybench.assess.verdict import BurstLimit, SeedLimit, outcome_of, seed_limit, verdict
from retrybench.cli.main import main
from retrybench.plan.blocks import BLOCKS, TABLE1
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result
from retrybench.runs.plan import PlannedRun, RunPlan
from retrybench.runs.store import run_is_cached
from retrybench.sweep.bisect import Boundary

RECORDED: dict[str, Any] = {"workload_file": "t.csv", "workload_digest": "ab" * 32, "workload_format": "own",
                            "rate_x": 0.6, "pulses": ((120.0, 107.0, 5.0),)}


# -- plan ---------------------------------------------------------------------------------------------


def test_every_table1_and_retention_condition_is_assessed_once_per_policy() -> None:
    found = controls()
    named = {alias for aliases in found.values() for alias in aliases}
    wanted = {c for block in [*TABLE1.values(), BLOCKS["retention"]] for c in block.conditions}
    assert named == wanted | {"no-control"}
    assert next(iter(found)) == "no-control"
    assert found["no-control"] == ("no-control", "retries-on-cancel-off")  # the same policies, run once
    assert {"coalescing-retain", "lookup-first-retain", "retry-budget", "coalescing"} <= set(found)


def test_a_client_profile_folds_the_retries_off_conditions_into_the_retries_on_ones() -> None:
    found = controls("openai-sdk")
    assert found["no-control"] == ("no-control", "retries-on-cancel-off", "retries-off-cancel-off")
    assert found["retries-on-cancel-on"] == ("retries-on-cancel-on", "retries-off-cancel-on")
    assert not any(name.startswith("retries-off") for name in found)


def test_specs_cover_every_control_on_every_seed_with_the_setup() -> None:
    setup = AssessSetup(model="tiny-llama", gpu="cpu", token_scale=0.1, client="openai-sdk", seeds=(1, 3))
    specs = assess_specs(setup, ["no-control", "coalescing"])
    assert [(s.condition, s.seed) for s in specs] == [("no-control", 1), ("no-control", 3), ("coalescing", 1),
                                                      ("coalescing", 3)]
    assert all(s.gpu == "cpu" and s.token_scale == 0.1 and s.client == "openai-sdk" and s.pulse_x == 2.7
               for s in specs)


def test_the_burst_and_its_search_grids() -> None:
    paper = AssessSetup(model="qwen2.5-7b-instruct")
    assert burst_of(paper) == 2.7
    first, second = burst_grids(paper)
    assert first == (Decimal("1.0"), Decimal("3.0"), Decimal("0.25"))  # reproduce's pulse map's: shared runs
    assert second == (Decimal("3.0"), Decimal("6.0"), Decimal("0.25"))  # for those that survive all of it
    recorded = AssessSetup(model="qwen2.5-7b-instruct", recorded=cast(Any, RECORDED))
    assert burst_of(recorded) == 5.0
    (low, high, _), _ = burst_grids(recorded)
    assert low == Decimal("0.25") and high == Decimal("6.00")  # past the burst asked about
    quiet = AssessSetup(model="qwen2.5-7b-instruct", recorded=cast(Any, {**RECORDED, "pulses": ()}))
    assert burst_of(quiet) is None and burst_grids(quiet) == ()


def test_with_burst_sets_the_paper_pulse_or_every_recorded_burst() -> None:
    assert with_burst(RunSpec(model="tiny-llama", condition="no-control", seed=1), 1.25).pulse_x == 1.25
    spec = RunSpec(model="qwen2.5-7b-instruct", condition="no-control", seed=1,
                   **{**RECORDED, "pulses": ((10.0, 5.0, 2.0), (60.0, 5.0, 3.0))})
    moved = with_burst(spec, 1.5)
    assert moved.pulses == ((10.0, 5.0, 1.5), (60.0, 5.0, 1.5)) and moved.pulse_x == 2.7


def test_also_adds_the_controls_of_the_blocks_beyond_the_paper() -> None:
    """--also deadlines / rejection: their controls join Table 1's; a policy already there (retry-budget,
    engine-cap-338) is not run twice; a stacked client profile needs no option."""
    plain = controls()
    more = controls(None, ("deadlines", "rejection"))
    added = set(more) - set(plain)
    assert {"deadline-propagation", "deadline-admission", "deadline-deferred", "breaker-busy-faults",
            "breaker-errors-only", "reject-cap-529"} <= added
    assert not added & {"retry-budget", "engine-cap-338"}
    assert "deadline-admission" in pick_controls(AssessSetup(model="tiny-llama", also=("deadlines",)), [])
    with pytest.raises(ValueError, match="known: deadlines, rejection"):
        AssessSetup(model="tiny-llama", also=("stacks",))
    stacked = AssessSetup(model="tiny-llama", client="sdk-in-tenacity-behind-gateway")
    assert "coalescing" in pick_controls(stacked, [])
    assert {s.client for s in assess_specs(stacked, ["coalescing"])} == {"sdk-in-tenacity-behind-gateway"}


def test_controls_are_picked_by_any_of_their_names() -> None:
    setup = AssessSetup(model="tiny-llama")
    assert list(pick_controls(setup, ["retries-on-cancel-off", "coalescing"])) == ["no-control", "coalescing"]
    with pytest.raises(AssessError, match="unknown control"):
        pick_controls(setup, ["no-such-control"])


# -- verdict ------------------------------------------------------------------------------------------

GRID = [1.0, 1.25, 1.5, 1.75, 2.0]


def test_seed_limit_reads_each_boundary() -> None:
    assert seed_limit(1, Boundary("found", 3, (2, 3), True, 4), GRID) == SeedLimit(1, "found", 1.5, 1.75)
    assert seed_limit(1, Boundary("everywhere", 0, None, None, 2), GRID) == SeedLimit(1, "everywhere", None, 1.0)
    assert seed_limit(1, Boundary("nowhere", None, None, None, 2), GRID) == SeedLimit(1, "nowhere", 2.0, None)
    assert seed_limit(1, Boundary("found", 2, (2, 3), False, 4), GRID).status == "unclear"
    assert seed_limit(2, None, GRID).status == "failed"


def test_the_largest_burst_is_the_smallest_over_seeds() -> None:
    two = BurstLimit(1.0, 2.0, (SeedLimit(1, "found", 1.5, 1.75), SeedLimit(2, "found", 1.25, 1.5)))
    assert two.largest == 1.25 and two.words() == "up to 1.25x"
    top = BurstLimit(1.0, 2.0, (SeedLimit(1, "nowhere", 2.0, None),))
    assert top.words() == "at least 2x"
    bottom = BurstLimit(1.0, 2.0, (SeedLimit(1, "nowhere", 2.0, None), SeedLimit(2, "everywhere", None, 1.0)))
    assert bottom.largest is None and bottom.words() == "below 1x"


def run(condition: str, seed: int, recovered: bool, pulse: float = 50.0, **more: Any) -> Result:
    return cast(Result, {"condition": condition, "seed": seed, "recovered": recovered,
                         "recovery_s": 300.0 + seed if recovered else None, "pulse_delivered_pct": pulse,
                         "hold_delivered_pct": 90.0, "primary_delivered_pct": 80.0, "created_x": 0.6, "chat": 2.0,
                         **more})


def test_a_control_keeps_the_setup_up_only_if_every_seed_recovered() -> None:
    runs = [run("coalescing", 1, True, 100.0), run("coalescing", 2, True, 90.0)]
    up = outcome_of("coalescing", ("coalescing",), runs)
    assert up.keeps_up and up.recovered_runs == 2 and up.recovery_s == 302.0 and up.pulse_delivered_pct == 95.0
    half = outcome_of("lifo", ("lifo",), [run("lifo", 1, True), run("lifo", 2, False)])
    assert not half.keeps_up and half.recovered_runs == 1 and half.recovery_s is None
    failed = outcome_of("lifo", ("lifo",), [run("lifo", 1, True),
                                             cast(Result, {"condition": "lifo", "seed": 2, "error": "boom"})])
    assert not failed.keeps_up and failed.failed_runs == 1 and failed.runs == 2


def test_the_verdict_names_the_controls_that_keep_it_up() -> None:
    limit = BurstLimit(1.0, 3.0, (SeedLimit(1, "found", 2.25, 2.5),))
    outcomes = [outcome_of("no-control", ("no-control",), [run("no-control", 1, False)]),
                outcome_of("retries-on-cancel-on", ("retries-on-cancel-on",), [run("retries-on-cancel-on", 1, False)]),
                outcome_of("retry-budget", ("retry-budget",), [run("retry-budget", 1, True, 30.0)]),
                outcome_of("coalescing", ("coalescing",), [run("coalescing", 1, True, 100.0)], limit),
                outcome_of("lookup-first", ("lookup-first",), [run("lookup-first", 1, True, 100.0)]),
                outcome_of("lifo", ("lifo",), [run("lifo", 1, True), run("lifo", 2, False)])]
    text = verdict(outcomes, "m on g", "the paper's burst", (1,))
    assert text.startswith("On m on g, at the paper's burst, 3 of 6 controls keep the setup up")
    assert ": retry-budget, coalescing and lookup-first." in text
    assert "Without a control it does not recover and neither does cancellation alone." in text
    assert "Of those, coalescing and lookup-first deliver the most of the burst (100.0%)." in text
    assert "coalescing up to 2.25x" in text and "lifo (1 of 2)" in text
    unclear = BurstLimit(1.0, 3.0, (SeedLimit(1, "unclear", None, 2.0),))
    wobbly = outcome_of("lifo", ("lifo",), [run("lifo", 1, True)], unclear)
    assert "For lifo recovery is not monotone in the burst" in verdict([wobbly], "m", "b", (1,))
    tied = verdict(outcomes[2:4], "m", "b", (1,))
    assert "Each of them delivers" not in tied and "Of those, coalescing delivers the most" in tied
    assert "Each of them delivers 100.0% of the burst." in verdict(outcomes[3:5], "m", "b", (1,))
    none_up = verdict(outcomes[:2], "m on g", "b", (1, 2))
    assert "none of the 2 controls keeps the setup up" in none_up and "seeds 1 and 2" in none_up


# -- the command end to end on the tiny CPU model ---------------------------------------------------------

TINY = ["assess", "--model", "tiny-llama", "--gpu", "cpu", "--token-scale", "0.1", "--seed", "1", "--jobs", "2"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_assess_writes_a_page_and_json_with_a_verdict_per_control(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = CliRunner().invoke(main, [*TINY, "--no-boundaries", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "assess.json").read_text())
    assert [c["control"] for c in doc["controls"]] == list(controls())
    assert all(isinstance(c["keeps_up"], bool) and c["runs"] == 1 and c["largest_burst"] is None
               for c in doc["controls"])
    by_name = {c["control"]: c for c in doc["controls"]}
    assert by_name["coalescing"]["keeps_up"] and not by_name["no-control"]["keeps_up"]
    assert doc["keeps_up"] == [c["control"] for c in doc["controls"] if c["keeps_up"]]
    assert len(doc["runs"]) == len(doc["controls"]) and doc["chat"] > 0
    page = (out / "index.html").read_text()
    assert str(escape(doc["verdict"])) in page and "<script" not in page
    assert all(run_is_cached(RunSpec(model="tiny-llama", gpu="cpu", token_scale=0.1, condition=c["control"],
                                     seed=1)) for c in doc["controls"])  # a rerun computes nothing


def test_assess_searches_the_largest_burst_of_a_control(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = CliRunner().invoke(main, [*TINY, "--condition", "coalescing", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "assess.json").read_text())
    [control] = doc["controls"]
    search = control["burst_search"]
    assert (search["low"], search["high"]) == (1.0, 6.0)
    [seed] = search["seeds"]
    assert seed["status"] in ("found", "nowhere", "everywhere")
    assert control["largest_burst_x"] == seed["survived"]
    if seed["survived"] is not None and seed["failed_at"] is not None:
        assert seed["survived"] < seed["failed_at"]
    assert doc["search_runs"] >= 2  # both ends of the grid at least
    assert json.loads(result.stdout) == doc  # --json prints the document


# -- the search on a stand-in executor: outcomes fixed per control, no simulation ------------------------


class Threshold:
    """An executor whose runs recover where the burst is at most the control's limit (x C-hat)."""

    name = "threshold"

    def __init__(self, limits: dict[str, float], interrupt_after: int | None = None) -> None:
        self.limits, self.interrupt_after = limits, interrupt_after
        self.specs: list[RunSpec] = []

    def plan(self, specs: Sequence[RunSpec]) -> RunPlan:
        return RunPlan(tuple(PlannedRun(spec, 2.0) for spec in specs))

    def run(self, plan: RunPlan, progress: Any = None) -> list[Result]:
        if self.interrupt_after is not None and len(self.specs) >= self.interrupt_after:
            raise KeyboardInterrupt
        self.specs += plan.specs()
        return [run(s.condition, s.seed, s.pulse_x <= self.limits[s.condition]) for s in plan.specs()]

    def close(self) -> None:
        pass


def test_the_search_finds_each_limit_and_goes_on_past_the_first_grid(cache: Path) -> None:
    executor = Threshold({"no-control": 1.8, "coalescing": 4.6, "engine-cap-100": 50.0})
    setup = AssessSetup(model="tiny-llama", seeds=(1, 2))
    outcome = assess(AssessRequest(setup, ("no-control", "coalescing", "engine-cap-100")), executor)
    by_name = {o.control: o for o in outcome.outcomes}
    assert [o.keeps_up for o in outcome.outcomes] == [False, True, True]  # at the paper's 2.7
    limits = {name: o.limit.words() for name, o in by_name.items() if o.limit}
    assert limits == {"no-control": "up to 1.75x", "coalescing": "up to 4.5x", "engine-cap-100": "at least 6x"}
    assert by_name["engine-cap-100"].limit is not None and by_name["engine-cap-100"].limit.short() == ">=6x"
    second = {s.pulse_x for s in executor.specs if s.condition == "no-control"}
    assert max(second) <= 3.0  # no-control did not survive the first grid: not searched past it
    assert outcome.search_runs == len(set(executor.specs)) - 6
    assert "coalescing and engine-cap-100" in outcome.verdict


def test_ctrl_c_says_how_many_runs_are_cached(cache: Path) -> None:
    executor = Threshold({"no-control": 1.8}, interrupt_after=2)
    with pytest.raises(Interrupted, match="0 of 6 distinct runs finished"):
        assess(AssessRequest(AssessSetup(model="tiny-llama", seeds=(1, 2)), ("no-control",)), executor)


def test_a_search_that_contradicts_the_run_at_the_burst_gives_no_largest_burst() -> None:
    survived_above = BurstLimit(1.0, 6.0, (SeedLimit(1, "found", 4.25, 4.5), SeedLimit(2, "found", 4.0, 4.25)))
    failing = outcome_of("engine-cap-338", ("engine-cap-338",), [run("x", 1, False), run("x", 2, True)],
                         survived_above, burst=2.7)
    assert failing.limit is not None and [s.status for s in failing.limit.seeds] == ["unclear", "found"]
    assert failing.limit.largest is None and failing.limit.words() == "not monotone"
    failed_below = BurstLimit(1.0, 3.0, (SeedLimit(1, "found", 2.0, 2.25),))
    up = outcome_of("lifo", ("lifo",), [run("lifo", 1, True)], failed_below, burst=2.7)
    assert up.keeps_up and up.limit is not None and up.limit.words() == "not monotone"
    agreeing = outcome_of("lifo", ("lifo",), [run("lifo", 1, True)], survived_above, burst=2.7)
    assert agreeing.limit is not None and agreeing.limit.words() == "up to 4x"


def test_a_pulse_on_the_paper_trace_is_the_burst_and_reaches_the_grid_past_it() -> None:
    setup = AssessSetup(model="qwen2.5-7b-instruct", pulse_x=4.1)
    assert burst_of(setup) == 4.1 and all(s.pulse_x == 4.1 for s in assess_specs(setup, ["no-control"]))
    (low, high, _), (_, top, _) = burst_grids(setup)
    assert (low, high, top) == (Decimal("1.0"), Decimal("5.25"), Decimal("10.50"))


def test_the_options_of_the_paper_trace_and_of_a_workload_do_not_mix(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n1.0,100,10\n")
    for extra, error in ((["--pulse-x", "2"], "--pulse-x is the paper's pulse"),
                         (["--token-scale", "0.5"], "--token-scale changes the paper's trace")):
        result = CliRunner().invoke(main, ["assess", "--model", "tiny-llama", "--workload", str(trace), *extra])
        assert result.exit_code == 2 and error in result.output
