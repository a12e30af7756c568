"""The stacked-retries block and its report section: the block's specs (stacks x controls, and each stack
with one layer's retries off), and a section whose table and paragraph are computed from the runs."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, cast

import pytest

from retrybench.plan.blocks import BLOCKS, block_specs
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result
from retrybench.report import build_context
from retrybench.report.context import run_file_name
from retrybench.report.meta import gather
from retrybench.report.render import render_html
from retrybench.report.runs import RunSet
from retrybench.report.stacks import stacks_section

pytestmark = pytest.mark.beyond

QWEN = "qwen2.5-7b-instruct"
GATEWAY = "sdk-in-tenacity-behind-gateway"


@pytest.fixture(scope="module")
def template(results: list[Result]) -> dict[str, Any]:
    return dict(next(r for r in results if "error" not in r))


def requests_per_call(spec: RunSpec) -> tuple[float, float, bool]:
    """Made-up outcomes: (requests per call, executions per call, recovered) the section must report back."""
    off = dict(spec.overrides)
    if spec.client != GATEWAY:
        return 1.0, 1.0, True
    if spec.condition == "coalescing":
        return 7.0, 1.01, True
    if spec.condition == "retry-budget":
        return 6.0, 1.1, True
    if off.get("layer.tenacity.retries") is False:
        return 5.0, 5.0, False
    if off:
        return 13.0, 13.0, False
    return 26.0, 26.0, False


def fake(template: dict[str, Any], spec: RunSpec) -> Result:
    wire, executions, recovered = requests_per_call(spec)
    calls = 100
    summary: dict[str, Any] = {**template, **asdict(spec), "spec": spec.as_dict(), "recovered": recovered,
                               "calls": calls, "attempts": round(wire * calls),
                               "executions_created": round(executions * calls),
                               "hold_delivered_pct": 100.0 if recovered else 0.0, "pulse_delivered_pct": 50.0}
    if spec.client == GATEWAY:
        summary["stack"] = {"layers": ["tenacity", "sdk", "gateway"],
                            "timeout_kinds": ["total", "total", "first_byte"],
                            "attempts": [round(wire * calls / 6), round(wire * calls / 3), round(wire * calls)],
                            "max_attempts": [5, 10, 30]}
    return cast(Result, summary)


def results(template: dict[str, Any]) -> list[Result]:
    return [fake(template, s) for s in block_specs("stacked-retries", QWEN, runs=1)]


def test_the_block_crosses_stacks_with_controls_and_turns_each_layers_retries_off() -> None:
    block = BLOCKS["stacked-retries"]
    assert not block.paper and block.models == (QWEN,)
    specs = block_specs("stacked-retries", QWEN)
    assert {s.seed for s in specs} == {1, 2} and {s.pulse_x for s in specs} == {2.7}
    per_seed = [s for s in specs if s.seed == 1]
    crossed = [s for s in per_seed if not s.overrides]
    assert {(s.client, s.condition) for s in crossed} == {(c, k) for c in block.clients for k in block.conditions}
    off = {(s.client, s.overrides) for s in per_seed if s.overrides}
    assert (GATEWAY, (("layer.gateway.retries", False),)) in off and len(off) == len(block.variants)
    assert all(s.condition == "no-control" for s in per_seed if s.overrides)
    assert len({run_file_name(cast(Result, {"spec": s.as_dict()})) for s in specs}) == len(specs)


def test_a_run_with_overrides_is_read_back_as_its_spec(template: dict[str, Any]) -> None:
    rs = RunSet(results(template), runs=1)
    assert len(rs.block_entries("stacked-retries")) == len(block_specs("stacked-retries", QWEN, runs=1))


def test_the_section_reports_the_multiplication_and_the_control_that_cut_it(template: dict[str, Any]) -> None:
    section = stacks_section(RunSet(results(template), runs=1))
    assert section is not None
    rows = {(r["stack"], r["control"]): r for r in section["rows"]}
    none = rows[(GATEWAY, "no-control")]
    assert (none["wire_per_call"], none["recovered"], none["max_wire_attempts"]) == ("26.0", "0 of 1", "30")
    assert none["layers"] == "tenacity 5 × sdk 3 × gateway 3"
    assert rows[(GATEWAY, "gateway retries off")]["wire_per_call"] == "13.0"
    text = " ".join(section["sentences"])
    assert (f"Under no control, {GATEWAY} (tenacity 5 × sdk 3 × gateway 3) sent 26.0 requests and created 26.0 "
            "executions per call; at most 30 for one call, of the 45 its layers allow, and recovered in 0 of 1 "
            "runs.") in text
    assert (f"For {GATEWAY}, the single control that cut executions per call most was coalescing: from 26.0 to "
            "1.01 (7.00 requests per call; recovered in 1 of 1 runs); every run recovered with coalescing, "
            "retry-budget.") in text
    assert "tenacity's: 5.00 requests per call, recovered in 0 of 1 runs" in text
    assert "For openai-sdk, no single control cut executions per call below no control's 1.00" in text


def test_the_page_shows_the_section_and_its_figure(template: dict[str, Any]) -> None:
    context = build_context(results(template), {**gather(engine="sim", wall_s=1.0, command="test"),
                                                 "chat_at_steps": []}, runs=1)
    page = render_html({**context, "real_engine": None})
    assert 'id="stacks"' in page and "Stacked retries. Requests and executions per call" in page
    assert "tenacity 5 × sdk 3 × gateway 3" in page


def test_no_run_of_the_block_no_section(template: dict[str, Any]) -> None:
    assert stacks_section(RunSet([], runs=1)) is None
