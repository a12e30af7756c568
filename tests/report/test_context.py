"""The report's data: block membership, verdicts from measured numbers and from test outcomes, failed runs."""

from __future__ import annotations

from typing import Any, cast

import pytest

from retrybench.claims import ROWS
from retrybench.plan.blocks import BLOCKS, block_specs
from retrybench.records.results import Result
from retrybench.report import build_context
from retrybench.report.context import run_file_name
from retrybench.report.fmt import span, value
from retrybench.report.runs import RunSet
from retrybench.report.sections import ReportContext, SummaryRow
from retrybench.report.verdicts import NOT_REPRODUCED, NOT_RUN, REPRODUCED, UNCERTAIN, checks_of, verdict

META = {"engine": "sim", "wall_s": 1.0}


def _row(context: ReportContext, key: str) -> SummaryRow:
    return next(r for r in context["summary"] if r["key"] == key)


def test_a_result_counts_in_every_block_whose_runs_include_its_spec(results: list[Result]) -> None:
    rs = RunSet(results)
    blocks = [e.block for e in rs.entries
              if e.spec.condition == "retries-on-cancel-off" and e.spec.pulse_x == 2.7 and not e.spec.trace]
    assert blocks == ["diagnostic", "trigger-sweep"]  # one simulation, two block runs, as the paper counts
    spec = block_specs("diagnostic", "qwen2.5-7b-instruct")[0]
    assert rs.find(spec.model, spec.condition, spec.seed) is not None


def test_a_seed_beyond_a_blocks_run_count_is_not_one_of_its_runs() -> None:
    spec = next(s for s in block_specs("diagnostic", "qwen2.5-7b-instruct")
                if s.seed == 3 and s.condition == "retries-on-cancel-off")  # the sweep has one run
    result = cast(Result, {**spec.__dict__, "spec": spec.__dict__})
    assert [e.block for e in RunSet([result]).entries] == ["diagnostic"]
    assert [e.block for e in RunSet([result], runs=3).entries] == ["diagnostic", "trigger-sweep"]


def test_verdicts_come_from_the_measured_numbers(results: list[Result]) -> None:
    context = build_context(results, META)
    assert _row(context, "finding7")["verdict"] == REPRODUCED
    assert _row(context, "section62-q338")["verdict"] == UNCERTAIN
    assert _row(context, "finding4")["verdict"] == REPRODUCED
    # Flip one measured number against the claim: the same finding is no longer reproduced.
    changed = [cast(Result, {**r, "recovered": False}) if r["condition"] == "deferred-cancellation" else r
               for r in results]
    row = _row(build_context(changed, META), "finding7")
    assert row["verdict"] == NOT_REPRODUCED
    assert any("deferred cancellation" in reason for reason in row["reasons"])


def test_a_failed_run_is_reported_with_its_error_and_fails_its_claims(results: list[Result]) -> None:
    context = build_context(results, META)
    assert [f["error"] for f in context["failed"]] == ["RuntimeError: a failed run, kept with its error (fixture)"]
    assert context["counts"]["failed"] == 1
    row = _row(context, "finding6")  # LIFO's run 2 is the failed one
    assert row["verdict"] == NOT_REPRODUCED
    assert any("run failed" in reason for reason in row["reasons"])
    queue = next(b for b in context["blocks"] if b["name"] == "queue-policy")
    assert [r["error"] for r in queue["rows"] if r["error"]] == [context["failed"][0]["error"]]


def test_a_finding_without_runs_is_not_run() -> None:
    checks = checks_of(RunSet([]))
    assert all(verdict(row, checks[row.key]) == NOT_RUN for row in ROWS)


def test_under_pytest_the_verdict_is_the_tests_and_an_xfail_is_not_reproduced(results: list[Result]) -> None:
    reason = "measured: coalescing delivered 99.87% of the pulse cohort by 840 s"
    tests: list[dict[str, Any]] = [
        {"nodeid": "b.py::test_a[1]", "name": "test_a[1]", "markers": ["finding5"],
         "claims": ["f5-budget-restores-service"], "outcome": "passed", "reason": "", "properties": []},
        {"nodeid": "b.py::test_b[3]", "name": "test_b[3]", "markers": ["finding5"],
         "claims": ["f5-coalescing-restores-service"], "outcome": "xfailed", "reason": reason,
         "properties": [["measured:pulse_delivered_pct", "99.87"]]},
        {"nodeid": "b.py::test_lookup[1]", "name": "test_lookup[1]", "markers": ["finding5"],
         "claims": ["s64-lookup-first-refuses-none"], "outcome": "passed", "reason": "", "properties": []},
        {"nodeid": "c.py::test_c", "name": "test_c", "markers": ["finding7"],
         "claims": ["f7-deferred-cancellation-restores"], "outcome": "passed", "reason": "", "properties": []},
    ]
    context = build_context(results, META, tests=tests)
    five = _row(context, "finding5")
    assert five["verdict"] == NOT_REPRODUCED
    assert five["tally"] == {"passed": 1, "failed": 0, "xfailed": 1, "skipped": 0}
    assert reason in five["reasons"][0]
    assert _row(context, "section64")["verdict"] == REPRODUCED  # its claim's row, though marked finding5
    assert _row(context, "finding7")["verdict"] == REPRODUCED
    assert _row(context, "finding1")["verdict"] == NOT_RUN  # no finding1 test ran
    assert context["tests"] == tests


def test_run_files_are_unique_per_spec(results: list[Result]) -> None:
    assert len({run_file_name(r) for r in results}) == len(results)


@pytest.mark.parametrize(("values", "text"), [([13.3, 15.2], "13.3–15.2"), ([0.0, 0.0], "0.00"), ([], "–"),
                                              ([None, 2.5], "2.50")])
def test_ranges_print_as_the_paper_prints_them(values: list[float | None], text: str) -> None:
    assert span(values) == text


def test_recorded_values_print_readably() -> None:
    assert value(True) == "yes"
    assert value([51.7, 55.1]) == "51.7–55.1"
    assert value({"a": 1}) == "a 1"


def test_every_block_is_in_the_paper_order(results: list[Result]) -> None:
    names = [b["name"] for b in build_context(results, META)["blocks"]]
    assert names == [n for n in BLOCKS if n in names]
