"""The deadlines block's report section (beyond the paper): its table, figure and the answer written
from the runs' numbers."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import pytest

from retrybench.plan.blocks import BLOCKS, block_specs
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result
from retrybench.report import build_context
from retrybench.report.figures_deadlines import figure_deadlines

pytestmark = pytest.mark.beyond

META = {"engine": "sim", "wall_s": 1.0}
QWEN = "qwen2.5-7b-instruct"
# Per condition: (recovered, hold delivered %, executions created, attempts refused 503, aborted prompt %).
MEASURED = {"no-control": (False, 0.0, 1000, 0, 0.0), "retries-on-cancel-on": (False, 14.0, 900, 0, 84.0),
            "deferred-cancellation": (True, 100.0, 101, 0, 0.0), "deadline-propagation": (False, 14.0, 900, 0, 84.0),
            "deadline-admission": (True, 95.0, 106, 40, 5.0), "deadline-deferred": (True, 100.0, 101, 0, 0.0)}


@pytest.fixture(scope="module")
def template(results: list[Result]) -> dict[str, Any]:
    return dict(next(r for r in results if "error" not in r))


# A traced run's fields (the block's runs are traced; its abort-on-disconnect run is also the tracing block's).
TRACED: dict[str, Any] = {"in_flight_share_pct": 1.0, "missed_share_pct": 1.0, "missed_share_last240_pct": 1.0,
                          "aborted_unscheduled": 0, "preempted_execution_prompt_tokens": 0,
                          "step_time_aborted_share_pct": [1.0, 2.0],
                          "step_time_aborted_share_by_rule_pct": {"proportional": 1.0}}


def fake(template: dict[str, Any], spec: RunSpec) -> Result:
    recovered, hold, created, refused, aborted = MEASURED[spec.condition]
    return cast(Result, {**template, **TRACED, **asdict(spec), "spec": spec.as_dict(), "recovered": recovered,
                         "hold_delivered_pct": hold, "executions_created": created, "calls_delivered": 100,
                         "attempts_refused_deadline": refused, "aborted_prompt_share_pct": aborted})


def test_the_block_is_beyond_the_paper_traced_and_compares_the_controls() -> None:
    block = BLOCKS["deadlines"]
    assert not block.paper and block.traced and block.pulses_x == (2.7,) and block.models == (QWEN,)
    assert {"no-control", "retries-on-cancel-on", "deferred-cancellation"} < set(block.conditions)
    assert len(block_specs("deadlines", QWEN)) == 2 * len(block.conditions)


def test_the_section_tables_each_control_and_answers_from_the_numbers(template: dict[str, Any]) -> None:
    results = [fake(template, s) for s in block_specs("deadlines", QWEN, runs=1)]
    section = build_context(results, META, runs=1)["deadlines"]
    assert section is not None
    rows = {r["condition"]: r for r in section["rows"]}
    assert rows["deadline-admission"]["executions_per_delivered"] == "1.06"
    assert rows["deadline-admission"]["refused_503"] == 40 and rows["deadline-admission"]["recovered"] == "1 of 1"
    assert rows["retries-on-cancel-on"]["prompt_aborted_pct"] == "84.0"
    answer = section["answer"]
    assert "Deadline propagation (deadline-propagation): 0 of 1 runs recovered" in answer
    assert "the same as abort-on-disconnect" in answer
    assert "40 attempts refused at admission: better than abort-on-disconnect" in answer
    assert "the same as deferred cancellation without deadlines" in answer


def test_without_the_blocks_runs_there_is_no_section(results: list[Result]) -> None:
    assert build_context(results, META)["deadlines"] is None


def test_the_figure_marks_each_run_and_the_page_shows_the_section(template: dict[str, Any], tmp_path: Path) -> None:
    from retrybench.report import write_report
    from retrybench.report.meta import gather

    # Without the abort-on-disconnect run, which is also the tracing block's (Figure 4 would draw it).
    results = [fake(template, s) for s in block_specs("deadlines", QWEN, runs=1)
               if s.condition != "retries-on-cancel-on"]
    context = build_context(results, gather(engine="sim", wall_s=1.0, command="test"), runs=1)
    section = context["deadlines"]
    assert section is not None
    svg = figure_deadlines(section)
    assert svg.startswith("<svg") and "deadline-admission run 1 95.0% (recovered)" in svg
    page = write_report(tmp_path, context, results).read_text()
    html = page[page.index('<section id="deadlines"'):page.index("</section>", page.index('id="deadlines"'))]
    assert html.count("<tr") == len(BLOCKS["deadlines"].conditions) and "<svg" in html  # the head, 5 rows
    assert "not all here: no answer" in html
