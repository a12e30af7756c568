"""Finding 5 (Section 6.1): the retry budget and coalescing restored service on all three models,
yet only coalescing rescued the pulse calls, a third to half of them late. Also Section 6.1's
budget-with-cancellation block and Section 6.4, the order of budget and lookup.
"""

from __future__ import annotations

from typing import Any

import pytest

from findings import PRIMARY, block_runs, result
from retrybench.blocks import BLOCKS
from retrybench.paper import FAR, NEAR, near, paper_values

pytestmark = pytest.mark.finding5

PAPER = paper_values()
COMPOSITION = PAPER["composition"]["qwen25"]
BUDGET_CANCEL = PAPER["budget_with_cancellation"]["qwen25"]
ORDER = PAPER["order"]["qwen25"]
MODELS = BLOCKS["composition"].models

# Runs on which the simulator does not reproduce a claim, with what it measured (strict xfails).
COALESCING_MISSES = {
    (PRIMARY, 3): "measured: coalescing delivered 99.87% of the pulse cohort by 840 s; one pulse call with a "
    "5,506-token response (lognormal tail) finished 7 s after its fourth attempt timed out",
}
LOOKUP_FIRST_MISSES = {
    (PRIMARY, 3): "measured: 99.75% of the pulse cohort delivered. Call 337 (5,506-token response) finished 7 s "
    "after its fourth attempt timed out; call 755's retry, sent 2.1 s after its execution had completed for "
    "nobody, found nothing to attach to and was refused by the budget (1 refusal) with Retry-After 123 s > 120 s",
    ("llama-3.1-8b-instruct", 1): "measured: 3 retries refused, 99.42% of the pulse cohort delivered. Each was "
    "sent 0.2-1.7 s after its call's execution had completed for nobody, found nothing to attach to, and was "
    "refused by the budget with Retry-After 130-136 s > 120 s, so the client gave the call up",
}
BUDGET_FIRST_LIVE_MISSES = {
    (PRIMARY, 2): "measured: 635 of 1,447 budget-first refusals (43.9%) had a live execution, not more than half",
    (PRIMARY, 3): "measured: 624 of 1,486 budget-first refusals (42.0%) had a live execution, not more than half",
}


@pytest.mark.parametrize(("model", "seed"), block_runs("composition", MODELS))
def test_retry_budget_restores_service_and_delivers_as_many_pulse_calls_as_no_control(
        model: str, seed: int, record: Any) -> None:
    budget = result(model, "retry-budget", seed)
    none = result(model, "no-control", seed)
    retries_refused_pct = 100 * budget["retries_refused"] / budget["retries"]
    record("recovered", budget["recovered"], True)
    record("retries_refused_pct", retries_refused_pct, COMPOSITION["budget_retries_refused_pct"])
    record("pulse_delivered_pct", budget["pulse_delivered_pct"], COMPOSITION["budget_pulse_by_840_pct"])
    record("no_control_pulse_delivered_pct", none["pulse_delivered_pct"], COMPOSITION["no_control_pulse_by_840_pct"])
    record("primary_timely_pct", budget["primary_timely_pct"], COMPOSITION["budget_primary_within_120_pct"])
    record("primary_delivered_pct", budget["primary_delivered_pct"], COMPOSITION["budget_primary_by_840_pct"])
    assert budget["recovered"] is True
    assert none["recovered"] is False and none["primary_delivered_pct"] == 0.0
    assert near(budget["pulse_delivered_pct"], none["pulse_delivered_pct"], none["pulse_delivered_pct"]), (
        f"the budget's pulse delivery is not within {NEAR:.0%} of no control's")


@pytest.mark.parametrize(("model", "seed"), block_runs("composition", MODELS, COALESCING_MISSES))
def test_coalescing_restores_service_and_delivers_every_pulse_and_hold_call(model: str, seed: int,
                                                                          record: Any) -> None:
    run = result(model, "coalescing", seed)
    late_pct = run["pulse_delivered_pct"] - run["pulse_timely_pct"]
    record("retries_attached_pct", run["retries_attached_pct"], COMPOSITION["coalescing_retries_attached_pct"])
    record("primary_timely_pct", run["primary_timely_pct"], COMPOSITION["coalescing_primary_within_120_pct"])
    record("pulse_delivered_pct", run["pulse_delivered_pct"], COMPOSITION["coalescing_pulse_by_840_pct"])
    record("pulse_late_pct", late_pct)
    assert run["recovered"] is True
    assert run["pulse_delivered_pct"] == 100.0
    assert run["hold_delivered_pct"] == 100.0


@pytest.mark.parametrize(("model", "seed"), block_runs("composition", MODELS))
def test_only_coalescing_rescues_the_pulse_a_third_to_half_of_it_late(model: str, seed: int, record: Any) -> None:
    coalescing = result(model, "coalescing", seed)
    budget = result(model, "retry-budget", seed)
    late_pct = coalescing["pulse_delivered_pct"] - coalescing["pulse_timely_pct"]
    record("pulse_late_pct", late_pct, [100 / 3, 50.0])
    record("budget_pulse_delivered_pct", budget["pulse_delivered_pct"])
    assert budget["pulse_delivered_pct"] <= FAR * coalescing["pulse_delivered_pct"]
    assert near(late_pct, 100 / 3, 50.0)


@pytest.mark.parametrize(("model", "seed"), block_runs("composition", MODELS))
def test_coalescing_delivers_more_of_the_primary_cohort_within_120s_than_the_budget(
        model: str, seed: int, record: Any) -> None:
    coalescing = result(model, "coalescing", seed)
    budget = result(model, "retry-budget", seed)
    record("coalescing_primary_timely_pct", coalescing["primary_timely_pct"],
           COMPOSITION["coalescing_primary_within_120_pct"])
    record("budget_primary_timely_pct", budget["primary_timely_pct"], COMPOSITION["budget_primary_within_120_pct"])
    assert coalescing["primary_timely_pct"] > budget["primary_timely_pct"]


# -- Section 6.4: the order of budget and lookup ------------------------------------------------------

@pytest.mark.parametrize(("model", "seed"), block_runs("composition", (PRIMARY,), BUDGET_FIRST_LIVE_MISSES))
def test_budget_first_refuses_retries_whose_call_still_had_a_live_execution(model: str, seed: int,
                                                                           record: Any) -> None:
    run = result(model, "budget-first", seed)
    record("retries_refused", run["retries_refused"], ORDER["budget_first_refused_per_run"])
    record("retries_refused_live", run["retries_refused_live"])
    assert run["retries_refused_live"] > run["retries_refused"] / 2


@pytest.mark.parametrize(("model", "seed"), block_runs("composition", MODELS, LOOKUP_FIRST_MISSES))
def test_lookup_first_refuses_no_retry_and_delivers_every_pulse_and_hold_call(model: str, seed: int,
                                                                             record: Any) -> None:
    run = result(model, "lookup-first", seed)
    budget_first = result(model, "budget-first", seed)
    record("retries_refused", run["retries_refused"], ORDER["lookup_first_refused_per_run"])
    record("gain_within_120_points", run["primary_timely_pct"] - budget_first["primary_timely_pct"],
           ORDER["lookup_first_gain_within_120_points"])
    record("gain_by_840_points", run["primary_delivered_pct"] - budget_first["primary_delivered_pct"],
           ORDER["lookup_first_gain_by_840_points"])
    assert run["retries_refused"] == 0
    assert run["pulse_delivered_pct"] == 100.0
    assert run["hold_delivered_pct"] == 100.0


# -- Section 6.1: budget with cancellation (Qwen2.5-7B) -------------------------------------------------

@pytest.mark.parametrize(("model", "seed"), block_runs("budget-with-cancellation", (PRIMARY,)))
def test_with_cancellation_the_budget_restores_service_and_favours_timely_delivery(model: str, seed: int,
                                                                                   record: Any) -> None:
    alone = result(model, "retries-on-cancel-on", seed)
    budget_on = result(model, "retry-budget-cancel-on", seed)
    budget_off = result(model, "retry-budget", seed)
    deferred = result(model, "deferred-cancellation", seed)
    record("budget_cancel_on_pulse_delivered_pct", budget_on["pulse_delivered_pct"],
           BUDGET_CANCEL["budget_cancel_on_pulse_by_840_pct"])
    record("budget_cancel_on_primary_timely_pct", budget_on["primary_timely_pct"],
           BUDGET_CANCEL["budget_cancel_on_primary_within_120_pct"])
    record("budget_cancel_off_primary_timely_pct", budget_off["primary_timely_pct"],
           BUDGET_CANCEL["budget_cancel_off_primary_within_120_pct"])
    record("deferred_primary_timely_pct", deferred["primary_timely_pct"],
           BUDGET_CANCEL["deferred_primary_within_120_pct"])
    record("deferred_pulse_delivered_pct", deferred["pulse_delivered_pct"], BUDGET_CANCEL["deferred_pulse_by_840_pct"])
    assert alone["recovered"] is False
    assert budget_on["recovered"] is True
    assert near(budget_on["pulse_delivered_pct"], budget_off["pulse_delivered_pct"], budget_off["pulse_delivered_pct"])
    assert budget_on["primary_timely_pct"] > budget_off["primary_timely_pct"]
    assert budget_on["primary_timely_pct"] > deferred["primary_timely_pct"]
    assert deferred["pulse_delivered_pct"] == 100.0
