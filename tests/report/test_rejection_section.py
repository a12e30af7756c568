"""The report's rejection section (beyond the paper): its rows, its paragraph computed from the runs'
numbers, and the page showing it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, cast

import pytest

from retrybench.plan.blocks import block_specs
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result
from retrybench.report import build_context
from retrybench.report.meta import gather
from retrybench.report.rejection import rejection_section
from retrybench.report.render import render_html
from retrybench.report.runs import RunSet

pytestmark = pytest.mark.beyond

QWEN = "qwen2.5-7b-instruct"


@pytest.fixture(scope="module")
def template(results: list[Result]) -> dict[str, Any]:
    return dict(next(r for r in results if "error" not in r))


def retries_of(spec: RunSpec) -> int:
    """What the runs would show if the SDKs stopped retrying on x-should-retry: false and a 529 did no better."""
    told = spec.condition in ("reject-budget-no-retry", "reject-cap-no-retry")
    if told and spec.client in ("openai-sdk", "anthropic-sdk"):
        return 10
    return 500


def fake(template: dict[str, Any], spec: RunSpec) -> Result:
    summary: dict[str, Any] = {**template, **asdict(spec), "spec": spec.as_dict(), "calls": 1000,
                               "retries": retries_of(spec), "calls_failed": 100, "retries_refused": 50,
                               "attempts_refused_deadline": 0, "engine_refused": 20, "recovered": True,
                               "primary_timely_pct": 90.0}
    if spec.condition.startswith("breaker-"):
        summary |= {"attempts_refused_breaker": 30, "breaker_not_closed_s": 60,
                    "drain_to_full_service_s": 45 if spec.condition == "breaker-busy-faults" else 0}
    return cast(Result, summary)


def results_of(template: dict[str, Any]) -> list[Result]:
    return [fake(template, s) for s in block_specs("rejection", QWEN, runs=1)]


def test_the_rows_and_the_paragraph_come_from_the_runs(template: dict[str, Any]) -> None:
    section = rejection_section(RunSet(results_of(template), runs=1))
    assert section is not None
    assert len(section["rows"]) == 11 * 4 and section["runs"] == 44
    first = section["rows"][0]
    assert (first["condition"], first["client"], first["retries"], first["refused"]) == ("retry-budget", "paper",
                                                                                          "500", "70")
    breaker = next(r for r in section["rows"] if r["condition"] == "breaker-busy-faults")
    assert breaker["drain_to_full_service_s"] == "45 s" and breaker["refused"] == "100"
    answer = section["answer"]
    assert ("openai-sdk: fewest with 429 + Retry-After + x-should-retry: false (10 retries per 1,000 calls, "
            "against 500 with 429 + Retry-After (the paper's))") in answer
    assert "paper: none sent fewer retries than 429 + Retry-After (the paper's)" in answer
    assert "with busy answers counted as faults median 45 s (max 45 s)" in answer
    assert "with only timeouts and errors counted median 0 s" in answer


def test_the_page_shows_the_section_and_its_figure(template: dict[str, Any]) -> None:
    context = build_context(results_of(template), {**gather(engine="sim", wall_s=1.0, command="test"),
                                                   "chat_at_steps": []}, runs=1)
    assert context.get("rejection") is not None
    html = render_html({**context, "real_engine": None})
    assert '<section id="rejection"' in html and "Rejection. Retries sent per 1,000 calls" in html


def test_no_rejection_runs_no_section(results: list[Result]) -> None:
    assert build_context(results, {"engine": "sim", "wall_s": 1.0})["rejection"] is None
