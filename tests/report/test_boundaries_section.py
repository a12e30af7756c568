"""The report's "Boundaries (beyond the paper)" section: built from maps (plain data, as `reproduce`
hands them over), its numbers read off the maps, never typed in; drawn and rendered in the page only when
there are maps. The maps here come from the sweep's searches on a stand-in engine (no simulation)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.runner_fakes import StandInExecutor
from markupsafe import escape

from retrybench.plan.blocks import PRIMARY_MODEL
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result
from retrybench.report import build_context, render_html
from retrybench.report.boundaries import (
    FAILS,
    RECOVERS,
    UNKNOWN,
    BoundariesSection,
    MapDocument,
    boundaries_section,
    known,
    outcome_at,
)
from retrybench.report.figures_boundaries import boundary_figures
from retrybench.report.meta import gather
from retrybench.sweep.boundaries import plan_maps, run_maps

MODELS = [PRIMARY_MODEL, "qwen3-14b"]


def engine(shift: float) -> StandInExecutor:
    """Recovers below a pulse (or cap) that moves with the seed by `shift`: a monotone outcome."""
    def outcome(spec: RunSpec) -> dict[str, object]:
        if spec.engine_cap is not None:
            recovered = spec.engine_cap < 300 + 40 * shift * spec.seed
        else:
            recovered = "retries-off" in spec.condition or spec.pulse_x < 1.6 + shift * spec.seed
        return {"recovered": recovered, "hold_delivered_pct": 100.0 if recovered else 10.0}

    return StandInExecutor(outcome)


def _maps(shift: float) -> list[MapDocument]:
    return run_maps(plan_maps(MODELS), engine(shift))


@pytest.fixture(scope="module")
def section() -> BoundariesSection:
    return boundaries_section(_maps(0.3), wall_s=12.4)


def test_what_a_seed_is_known_to_do_along_the_axis() -> None:
    grid = [1.0, 1.25, 1.5]
    found = known({"status": "found", "rises": True, "critical": 1.5, "bracket": [1.25, 1.5]}, grid)
    assert [outcome_at(found, x) for x in (1.0, 1.25, 1.4, 1.5)] == [RECOVERS, RECOVERS, UNKNOWN, FAILS]
    assert outcome_at(known({"status": "nowhere"}, grid), 1.5) == RECOVERS
    assert outcome_at(known({"status": "everywhere"}, grid), 1.0) == FAILS
    assert outcome_at(known({"status": "non-monotone"}, grid), 1.0) == UNKNOWN


def test_the_section_reads_its_numbers_off_the_maps(section: BoundariesSection) -> None:
    assert list(section["maps"]) == ["pulse", "deferral", "engine-cap"]
    rows = {(r["condition"], r["other"]): r for r in section["tables"]["pulse"]}
    # Seed 1 recovers below 1.9, seed 2 below 2.2: the grid values at or above those.
    retries = rows["retries-on-cancel-off (= no-control)", PRIMARY_MODEL]
    assert [(s["critical"], s["recovered_at"]) for s in retries["seeds"]] == [("2", "1.75"), ("2.25", "2")]
    assert retries["found"] == "2 of 2" and retries["spread"] == "2–2.25"
    assert rows["retries-off-cancel-on", "qwen3-14b"]["seeds"][0]["critical"] == "> 3"
    assert ("lifo", "qwen3-14b") not in rows  # Table 1 runs lifo on Qwen2.5-7B only
    cell = section["pulse_cell"]
    assert cell is not None
    assert cell["pulse_x"] == 2.0 and [r["model"] for r in cell["rows"]] == MODELS
    assert "seeds that do not recover: 1 of 2" in cell["sentences"][0]
    assert cell["sentences"][-1] == ("Over 2 model(s), 2 of 4 seed runs at 2 C-hat do not recover; the critical "
                                     "pulses found span 2–2.25 C-hat.")
    # Cap: seed 1 recovers below 312, seed 2 below 324: both fail from 325, recover at 300.
    q = section["q_range"]
    assert q is not None
    assert q["q"] == 338
    (at_27,) = [r for r in q["rows"] if r["condition"] == "engine-cap-338"]
    assert (at_27["all_recover_to"], at_27["none_recover_from"], at_27["seed_dependent"]) == (300, 325, [])
    assert "Q = 338 (the paper's): no seed recovers there." in q["sentences"][0]
    assert section["runs"] >= section["distinct"] > 0 and section["wall_s"] == 12.4 and section["seeds"] == [1, 2]


def test_other_outcomes_give_other_numbers() -> None:
    wider = boundaries_section(_maps(0.6))
    row = next(r for r in wider["tables"]["pulse"] if r["condition"].startswith("retries-on-cancel-off")
               and r["other"] == PRIMARY_MODEL)
    assert [s["critical"] for s in row["seeds"]] == ["2.25", "3"]
    q = wider["q_range"]
    assert q is not None
    (cap,) = [r for r in q["rows"] if r["condition"] == "engine-cap-338"]
    assert cap["seed_dependent"] == [325, 325] and "depends on the seed at Q = 325" in q["sentences"][0]


def test_the_page_shows_the_section_with_its_three_maps(results: list[Result], section: BoundariesSection,
                                                        built_report: Path) -> None:
    figures = boundary_figures(section)
    assert sorted(figures) == ["boundaries_deferral", "boundaries_engine_cap", "boundaries_pulse"]
    assert all(svg.startswith("<svg") and "the paper's runs" in svg for svg in figures.values())
    context = build_context(results, gather(engine="sim", wall_s=1.0, command="retrybench reproduce (fixture)"))
    context["boundaries"] = section
    page = render_html(context)
    start = page.index('<section id="boundaries"')
    text = page[start:page.index("</section>", page.index('id="boundaries-engine-cap"'))]
    assert '<a href="#boundaries">' in page and text.count("<svg") == 3
    cell, q = section["pulse_cell"], section["q_range"]
    assert cell is not None and q is not None
    for sentence in [*cell["sentences"], *q["sentences"]]:
        assert str(escape(sentence)) in text
    assert "retrybench sweep --condition deferred-cancellation" in text and "12 s here" in text
    assert 'id="boundaries"' not in built_report.read_text()  # no maps, no section
    assert boundary_figures(None) == {}
