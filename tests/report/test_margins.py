"""The report's margins: the same runs at the engine speeds of the band, read as run sets of their own,
give each claim on each model (and each finding) a verdict per speed and a margin; the summary, the score
line and the page show it."""

from __future__ import annotations

import json
from typing import cast

import pytest

from retrybench.claims import claim
from retrybench.records.results import Result, is_failed
from retrybench.report import build_context
from retrybench.report.margins import MarginRow, margins_section, runs_at
from retrybench.report.runs import spec_of

QWEN = "qwen2.5-7b-instruct"
FLIPPED = "f1-recovers-without-retries"  # reads the retries-off-cancel-on run


def at_speed(results: list[Result], speed: float, collapse: str | None = None) -> list[Result]:
    """The fixture runs as if made at `speed`; the runs of condition `collapse` did not recover there."""
    out = []
    for r in results:
        spec = spec_of(r).as_dict()
        record: dict[str, object] = {**r, "engine_speed": speed, "spec": {**spec, "engine_speed": speed}}
        if not is_failed(r) and r["condition"] == collapse:
            record |= {"recovered": False, "recovery_s": None}
        out.append(cast(Result, record))
    return out


def row(rows: list[MarginRow], claim_id: str, model: str = QWEN) -> MarginRow:
    return next(r for r in rows if r["claim"] == claim_id and r["model"] == model)


@pytest.fixture(scope="module")
def band(results: list[Result]) -> list[Result]:
    """The fixture set at 0.95 and 1.05, the faster engine's retries-off-cancel-on runs collapsing."""
    return [*at_speed(results, 0.95), *at_speed(results, 1.05, collapse="retries-off-cancel-on")]


def test_the_runs_at_a_speed_read_as_the_calibrated_runs(results: list[Result], band: list[Result]) -> None:
    fast = runs_at([*results, *band], 1.05)
    assert len(fast) == len(results)
    assert {spec_of(r) for r in fast} == {spec_of(r) for r in results}
    assert not any("engine_speed" in json.dumps(r) for r in fast)
    assert runs_at(results, 0.95) == []


def test_a_flip_at_one_speed_is_knife_edge_and_the_rest_robust(results: list[Result], band: list[Result]) -> None:
    section = margins_section([*results, *band])
    flipped = row(section["rows"], FLIPPED)
    assert flipped["verdicts"] == {"0.95": "reproduced", "1": "reproduced", "1.05": "not reproduced"}
    assert (flipped["margin"], flipped["flips_at"]) == ("knife-edge", [1.05])
    deferred = row(section["rows"], "f7-deferred-cancellation-restores")
    assert (deferred["margin"], deferred["flips_at"]) == ("robust", [])
    assert section["knife_edge"] >= 1 and section["reproduced_robust"] < section["reproduced"] <= section["judged"]
    assert section["findings"][claim(FLIPPED).row.key]["margin"] == "knife-edge"


def test_without_the_band_s_runs_no_verdict_has_a_margin(results: list[Result]) -> None:
    section = margins_section(results)
    assert section["rows"] and all(r["margin"] is None for r in section["rows"])
    assert section["reproduced_robust"] == 0 and section["knife_edge"] == 0


def test_the_report_shows_the_margin_beside_each_verdict_and_in_the_score_line(results: list[Result],
                                                                              band: list[Result]) -> None:
    from retrybench.report.meta import gather
    from retrybench.report.render import render_html

    assert build_context(results, {})["margins"] is None
    context = build_context(results, gather(engine="sim", wall_s=1.0, command="test"), at_speeds=band)
    margins = context["margins"]
    assert margins is not None
    finding = next(r for r in context["summary"] if r["key"] == claim(FLIPPED).row.key)
    assert (finding["margin"], finding["flips_at"]) == ("knife-edge", [1.05])
    page = render_html(context)
    assert 'id="margins"' in page and "knife-edge: flips at engine speed 1.05" in page
    assert (f"{margins['reproduced']} of {margins['judged']} reproduced, {margins['reproduced_robust']} of them "
            "robust") in page
