"""Blocks beyond the paper (result retention, SDK clients): planned and reported beside Table 1's, never
counted among its runs, and their sections say what the runs measured."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import pytest

from retrybench.plan.blocks import (
    BLOCKS,
    PAPER_MODELS,
    TABLE1,
    block_specs,
    blocks_plan,
    table1_plan,
    unseen_seeds_plan,
)
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result
from retrybench.report import build_context
from retrybench.report.context import run_file_name
from retrybench.report.figures import figure_sdk
from retrybench.report.runs import RunSet

META = {"engine": "sim", "wall_s": 1.0}
QWEN = "qwen2.5-7b-instruct"


@pytest.fixture(scope="module")
def template(results: list[Result]) -> dict[str, Any]:
    """A real run summary of the fixture set, to give every field the report reads."""
    return dict(next(r for r in results if "error" not in r))


def fake(template: dict[str, Any], spec: RunSpec, **figures: Any) -> Result:
    """A run summary for `spec` with the counts the beyond sections read."""
    summary: dict[str, Any] = {
        **template, **asdict(spec), "spec": spec.as_dict(), "recovered": True, "hold_delivered_pct": 100.0,
        "pulse_delivered_pct": 100.0, "retries_refused": 0, "gave_up_retry_after": 0, "executions_created": 100,
        "calls_delivered": 100, "calls": 100}
    summary.pop("attempts_served_retained", None)
    summary.update(figures)
    return cast(Result, summary)


def test_table1_keeps_the_papers_137_runs_and_the_unseen_seeds_leave_beyond_blocks_out() -> None:
    assert set(TABLE1) == {name for name, block in BLOCKS.items() if block.paper}
    assert {"retention", "sdk-clients"} <= set(BLOCKS) - set(TABLE1)
    assert len(table1_plan(list(PAPER_MODELS), "h100", None)) == 137
    assert {block for block, _ in unseen_seeds_plan(list(PAPER_MODELS), "h100")} == set(TABLE1)


def test_blocks_plan_runs_only_the_named_blocks_and_refuses_unknown_names() -> None:
    plan = blocks_plan(["retention"], [QWEN], "h100", None)
    assert {block for block, _ in plan} == {"retention"}
    assert len(plan) == 4 * 4  # four conditions, the composition block's four runs on Qwen2.5-7B
    with pytest.raises(ValueError, match=r"unknown block.*no-such-block"):
        blocks_plan(["no-such-block"], [QWEN], "h100", None)


def test_the_sdk_block_crosses_client_profiles_with_its_conditions(template: dict[str, Any]) -> None:
    specs = block_specs("sdk-clients", QWEN, runs=1)
    assert {s.client for s in specs} == {None, "openai-sdk", "anthropic-sdk", "tenacity-typical"}
    assert len(specs) == 4 * len(BLOCKS["sdk-clients"].conditions) * len(BLOCKS["sdk-clients"].pulses_x)
    paper_client = [s for s in specs if s.client is None]
    assert all(s.as_dict() == RunSpec(model=QWEN, condition=s.condition, seed=1, pulse_x=s.pulse_x).as_dict()
               for s in paper_client)  # the paper client's runs are Table 1's specs, shared with its blocks
    names = {run_file_name(fake(template, s)) for s in specs}
    assert len(names) == len(specs), "two runs of the block would share a summary file"


def test_beyond_runs_are_entries_of_their_own_not_table1_runs(template: dict[str, Any]) -> None:
    specs = [s for _, s in blocks_plan(["retention"], [QWEN], "h100", 1)]
    rs = RunSet([fake(template, s) for s in specs], runs=1)
    assert {e.block for e in rs.entries} == {"composition", "deferral"}  # coalescing and lookup-first are shared
    # sdk-clients holds the paper client's coalescing and coalescing-retain runs too
    assert sorted(e.block for e in rs.beyond) == ["retention"] * 4 + ["sdk-clients"] * 2
    assert len(rs.block_entries("retention")) == 4


def test_the_retention_section_sets_each_condition_beside_its_retaining_twin(template: dict[str, Any]) -> None:
    specs = [s for _, s in blocks_plan(["retention"], [QWEN], "h100", 1)]
    results = [fake(template, s, executions_created=103, retries_refused=2) if not s.condition.endswith("-retain")
               else fake(template, s, attempts_served_retained=3) for s in specs]
    rows = build_context(results, META, runs=1)["retention"]
    assert [r["condition"] for r in rows] == ["coalescing", "coalescing-retain", "lookup-first",
                                              "lookup-first-retain"]
    assert [(r["executions_created"], r["retries_refused"], r["served_retained"]) for r in rows] == [
        (103, 2, 0), (100, 0, 3), (103, 2, 0), (100, 0, 3)]


def test_the_sdk_section_says_which_default_recovers_and_which_collapses(template: dict[str, Any]) -> None:
    specs = [s for s in block_specs("sdk-clients", QWEN, runs=1) if s.pulse_x == 2.7]
    results = [fake(template, s, recovered=s.client in ("openai-sdk", "anthropic-sdk"), executions_created=250)
               for s in specs]
    context = build_context(results, META, runs=1)
    assert context["sdk_verdicts"] == [
        "With no control at a 2.7 C-hat pulse, the paper client's default collapses (0 of 1 runs recovered).",
        "With no control at a 2.7 C-hat pulse, the openai-sdk client's default recovers (1 of 1 runs recovered).",
        "With no control at a 2.7 C-hat pulse, the anthropic-sdk client's default recovers (1 of 1 runs "
        "recovered).",
        "With no control at a 2.7 C-hat pulse, the tenacity-typical client's default collapses (0 of 1 runs "
        "recovered)."]
    row = next(r for r in context["sdk_clients"] if r["client"] == "openai-sdk" and r["condition"] == "no-control")
    assert row["executions_per_delivered_call"] == "2.500"


def test_the_sdk_figure_has_a_line_per_condition_and_client_with_recovery_marked(template: dict[str, Any]) -> None:
    specs = block_specs("sdk-clients", QWEN, runs=1)
    results = [fake(template, s, recovered=s.pulse_x < 2.7, hold_delivered_pct=100.0 / s.pulse_x) for s in specs]
    data = build_context(results, META, runs=1)["figures"]["sdk"]
    block = BLOCKS["sdk-clients"]
    assert data["conditions"] == list(block.conditions)
    assert len(data["series"]) == len(block.conditions) * len(block.clients)
    openai = next(s for s in data["series"] if s["client"] == "openai-sdk" and s["condition"] == "no-control")
    assert [(p["pulse_x"], p["runs"], p["recovered"]) for p in openai["points"]] == [
        (x, 1, 1.0 if x < 2.7 else 0.0) for x in block.pulses_x]
    assert openai["points"][-1]["hold_pct"] == pytest.approx(100.0 / 2.7)
    svg = figure_sdk(data)
    assert svg.startswith("<svg") and "no-control, openai-sdk: 1.5 C-hat 66.7% (100% of runs recovered)" in svg
    assert "sdk-clients run" in figure_sdk({"conditions": [], "series": []})  # said, not drawn, without runs


def test_the_page_shows_both_sections_with_their_rows(template: dict[str, Any], tmp_path: Path) -> None:
    from retrybench.report import write_report
    from retrybench.report.meta import gather

    specs = [s for _, s in blocks_plan(["retention", "sdk-clients"], [QWEN], "h100", 1)]
    results = [fake(template, s, attempts_served_retained=3) if s.condition.endswith("-retain")
               else fake(template, s) for s in dict.fromkeys(specs)]
    context = build_context(results, gather(engine="sim", wall_s=1.0, command="test"), runs=1)
    page = write_report(tmp_path, context, results).read_text()
    retention = page[page.index('<section id="retention"'):page.index("</section>", page.index('id="retention"'))]
    assert retention.count("<tr") == 1 + 4  # the head, and one row per condition
    sdk = page[page.index('<section id="sdk-clients"'):page.index("</section>", page.index('id="sdk-clients"'))]
    assert sdk.count("<tr") == 1 + 16 * 3 and "the openai-sdk client&#39;s default recovers" in sdk
    assert "(Section 6.4, beyond the paper)" in page


def test_reproduce_refuses_an_unknown_block_before_any_run(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from retrybench.cli.main import main

    result = CliRunner().invoke(main, ["reproduce", "--block", "retention,no-such-block", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "unknown block(s) no-such-block" in result.output and "sdk-clients" in result.output
    assert not any(tmp_path.iterdir()), "it ran something before refusing"
