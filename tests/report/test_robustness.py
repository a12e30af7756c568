"""Robustness on unseen seeds: a claim holds on a seed when every check of it there held; robust when
it held on at least 9 of every 10 seeds evaluated; uncertain cases are left out; the report shows it."""

from __future__ import annotations

from typing import cast

from retrybench.claims import claim
from retrybench.plan.blocks import UNSEEN_SEEDS
from retrybench.records.results import Result, is_failed
from retrybench.report import build_context
from retrybench.report.robustness import Robustness, robustness

QWEN = "qwen2.5-7b-instruct"


def _row(rows: list[Robustness], claim_id: str, model: str = QWEN) -> Robustness:
    return next(r for r in rows if r.claim.id == claim_id and r.model == model)


def test_a_claim_that_held_on_its_seed_is_robust_and_a_missing_seed_is_not_evaluated(results: list[Result]) -> None:
    rows = robustness(results, seeds=(1, 2))  # the fixture set has seed 1 only
    deferred = _row(rows, "f7-deferred-cancellation-restores")
    assert (deferred.held, deferred.failed, deferred.not_evaluated) == ((1,), (), (2,))
    assert deferred.robust is True
    assert not any(r.claim.recorded_only for r in rows)  # the paper's uncertain cases are not judged


def test_one_failing_variant_fails_the_seed(results: list[Result]) -> None:
    flipped = [cast(Result, {**r, "recovered": False, "recovery_s": None})
               if r["condition"] == "retries-off-cancel-on" else r for r in results]
    row = _row(robustness(flipped, seeds=(1,)), "f1-recovers-without-retries")
    assert (row.held, row.failed) == ((), (1,))  # the cancel-off variant still held; the seed failed
    assert row.robust is False


def test_robust_means_held_on_at_least_nine_of_ten() -> None:
    def of(held: int) -> Robustness:
        return Robustness(claim=claim("f1-small-pulse-recovers"), model=QWEN, held=tuple(range(held)),
                          failed=tuple(range(held, 10)), not_evaluated=())

    assert of(9).robust is True and of(8).robust is False
    assert Robustness(claim=claim("f1-small-pulse-recovers"), model=QWEN, held=(), failed=(),
                      not_evaluated=(1,)).robust is None


def test_the_report_has_the_section_only_with_unseen_runs(results: list[Result]) -> None:
    assert build_context(results, {})["robustness"] is None
    section = build_context(results, {}, unseen=results)["robustness"]
    assert section is not None
    assert section["seeds"] == list(UNSEEN_SEEDS)
    assert all(r["evaluated"] == 0 and r["robust"] == "not evaluated" for r in section["rows"])  # seeds 101-110


def test_the_page_shows_the_robustness_table(results: list[Result]) -> None:
    from retrybench.report.meta import gather
    from retrybench.report.render import render_html

    renamed = [cast(Result, {**r, "seed": 101, "spec": {**r["spec"], "seed": 101}}) for r in results
               if not is_failed(r)]
    context = build_context(results, gather(engine="sim", wall_s=1.0, command="test"), unseen=renamed)
    page = render_html(context)
    assert 'id="robustness"' in page and "f7-deferred-cancellation-restores" in page
    section = context["robustness"]
    assert section is not None
    deferred = next(r for r in section["rows"] if r["claim"] == "f7-deferred-cancellation-restores")
    assert (deferred["held"], deferred["evaluated"]) == (1, 1)
    scores = section["scores"]  # the unseen runs' paper figures, scored as the main ones
    assert scores["scored"] == context["scores"]["tally"]["scored"] > 0  # same runs under other seeds
    assert "figures the claim checks measured on the unseen seeds" in page
