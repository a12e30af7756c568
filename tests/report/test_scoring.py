"""Paper figures scored against the paper's band: within, near (3 points for a percentage, else 10% of
the band's scale) or off; only numbers are scored; the report counts them and flags a finding that
reproduced on numbers off the paper's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from retrybench.claims import claim
from retrybench.claims.model import Subject
from retrybench.records.results import Result
from retrybench.report import build_context
from retrybench.report.scoring import band, mark, score, tally
from retrybench.report.verdicts import ClaimCheck


@pytest.mark.parametrize(("name", "measured", "low", "high", "expected"), [
    ("hold_delivered_pct", 73.0, 72.4, 74.8, "within"),
    ("hold_delivered_pct", 69.5, 72.4, 74.8, "near"),  # 2.9 points below
    ("hold_delivered_pct", 69.3, 72.4, 74.8, "off"),  # 3.1 points below
    ("gain_by_840_points", 17.5, 7.9, 14.6, "near"),  # points are percentage points too
    ("recovery_s", 590.0, 480.0, 540.0, "near"),  # within 54 s, 10% of 540
    ("recovery_s", 600.0, 480.0, 540.0, "off"),
    ("accepted_x", 2.3, 2.5, 2.5, "near"),
    ("retries_attached", 1.0, 0.0, 0.0, "off"),  # a zero band has no room
])
def test_a_figure_is_within_near_or_off_the_papers_band(name: str, measured: float, low: float, high: float,
                                                       expected: str) -> None:
    assert mark(name, measured, low, high) == expected


@pytest.mark.parametrize(("paper", "expected"), [
    (360, (360.0, 360.0)), ([0.79, 0.83], (0.79, 0.83)), (True, None), ("more than half", None),
    ([2.0, 1.0], None), ([1.0, 2.0, 3.0], None), ({}, None),
])
def test_only_a_number_or_a_numeric_range_is_a_band(paper: Any, expected: tuple[float, float] | None) -> None:
    assert band(paper) == expected


def test_outcomes_words_and_unevaluated_checks_are_not_scored() -> None:
    subject = Subject(model="qwen2.5-7b-instruct", seed=1)
    evaluated = ClaimCheck(claim=claim("f1-no-hold-call-without-cancellation"), subject=subject, passed=True,
                           measured={"hold_delivered_pct": 0.0, "recovered": False, "refused": 815},
                           paper={"hold_delivered_pct": [0.0, 0.0], "recovered": False, "refused": "more than half"})
    missing = ClaimCheck(claim=claim("f1-no-hold-call-without-cancellation"), subject=subject, passed=None,
                         note="not run: qwen2.5-7b-instruct retries-on-cancel-off seed 2")
    scored = score([evaluated, missing])
    assert [(f.name, f.mark) for f in scored] == [("hold_delivered_pct", "within")]
    assert tally(scored) == {"within": 1, "near": 0, "off": 0, "scored": 1}


def test_the_report_counts_the_scores_and_flags_a_reproduced_finding_off_the_paper(results: list[Result]) -> None:
    context = build_context(results, {})
    total = context["scores"]["tally"]
    assert total["scored"] == len(context["scores"]["figures"]) > 0
    assert total["within"] + total["near"] + total["off"] == total["scored"]
    assert sum(row["scores"]["scored"] for row in context["summary"]) == total["scored"]
    # Move Finding 7's deferred-cancellation figures far from the paper's: the verdict stays, the note says so.
    far = [cast(Result, {**r, "retries_attached_pct": 96.0}) if r["condition"] == "deferred-cancellation" else r
           for r in results]
    row = next(r for r in build_context(far, {})["summary"] if r["key"] == "finding7")
    assert row["verdict"] == "reproduced"
    assert row["scores"]["off"] >= 1 and "off the paper's band" in row["figures_note"]


def test_the_page_shows_the_score_line_and_the_scored_figures(built_report: Path) -> None:
    page = built_report.read_text(encoding="utf-8")
    assert "within the paper&#39;s band" in page or "within the paper's band" in page
    assert 'id="scores"' in page and "mark-off" in page
