"""ProxyCore's overload controls (paper Sections 2 and 6): coalescing, budget/lookup order, deferred
cancellation, the proxy queue (FIFO/LIFO, drops), the deadline check; and the policy files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import retrybench
from retrybench.conditions.config import ConfigError, ProxyPolicy, condition_from_toml, load_condition
from retrybench.control.proxy import (
    Attach,
    AttemptIn,
    Cancel,
    Create,
    Dispatch,
    Drop,
    Notify,
    ProxyCore,
    Refuse,
    SetTimer,
)


def attempt(call: int, no: int = 0, *, key: str | None = None, prompt: int = 12_000) -> AttemptIn:
    return AttemptIn(call_index=call, attempt_no=no, key=key if key is not None else f"call-{call}",
                     prompt_tokens=prompt, max_tokens=300)


def proxy(**policy: Any) -> ProxyCore:
    return ProxyCore(ProxyPolicy(**policy))


# == coalescing ======================================================================================


def test_retry_attaches_to_its_calls_live_execution() -> None:
    p = proxy(coalescing=True)
    assert p.on_attempt(attempt(0, 0), 0.0) == Create(0, dispatch=True)
    assert p.on_subscriber_left((0, 0), 20.0) == []  # cancellation off: orphaned, still live
    assert p.on_attempt(attempt(0, 1), 21.0) == Attach(0, first_token=False)
    assert len(p.executions) == 1  # no new execution
    execution = p.executions[0]
    assert execution.subscribers == {(0, 1)}
    assert execution.attached == 1
    assert p.counts.retries_attached == 1
    assert p.outstanding == 1
    # The attached retry receives the execution's output.
    assert p.on_engine_event(0, "first_token", 25.0) == [Notify((0, 1), "first_token")]
    assert p.on_engine_event(0, "completed", 30.0) == [Notify((0, 1), "completed")]
    assert p.outstanding == 0


def test_attach_after_the_first_token_replays_it() -> None:
    p = proxy(coalescing=True)
    p.on_attempt(attempt(0, 0), 0.0)
    assert p.on_engine_event(0, "first_token", 5.0) == [Notify((0, 0), "first_token")]
    p.on_subscriber_left((0, 0), 20.0)
    assert p.on_attempt(attempt(0, 1), 21.0) == Attach(0, first_token=True)
    assert p.on_engine_event(0, "completed", 30.0) == [Notify((0, 1), "completed")]


def test_every_subscriber_of_a_coalesced_execution_is_notified() -> None:
    p = proxy(coalescing=True)
    p.on_attempt(attempt(0, 0), 0.0)
    assert p.on_attempt(attempt(0, 1), 1.0) == Attach(0, first_token=False)
    assert p.on_attempt(attempt(0, 2), 2.0) == Attach(0, first_token=False)
    assert p.counts.retries_attached == 2
    assert p.executions[0].attached == 2
    assert p.on_engine_event(0, "completed", 3.0) == [
        Notify((0, 0), "completed"), Notify((0, 1), "completed"), Notify((0, 2), "completed")]


def test_one_subscriber_leaving_keeps_the_execution_for_the_others() -> None:
    p = proxy(coalescing=True, cancellation="immediate")
    p.on_attempt(attempt(0, 0), 0.0)
    p.on_attempt(attempt(0, 1), 1.0)
    assert p.on_subscriber_left((0, 0), 20.0) == []  # (0, 1) still waits
    assert p.executions[0].state == "live"
    assert p.on_subscriber_left((0, 1), 21.0) == [Cancel(0)]


def test_another_calls_attempt_never_attaches() -> None:
    p = proxy(coalescing=True)
    p.on_attempt(attempt(0, 0), 0.0)
    assert p.on_attempt(attempt(1, 0), 1.0) == Create(1, dispatch=True)
    assert p.on_attempt(attempt(1, 1), 2.0) == Attach(1, first_token=False)  # its own call's execution
    assert p.counts.retries_attached == 1
    assert p.executions[0].subscribers == {(0, 0)}


def test_a_retry_with_a_different_key_never_attaches() -> None:
    # The same call id with a different body hash (other generation parameters) is another key.
    p = proxy(coalescing=True)
    p.on_attempt(attempt(0, 0, key="tenant/call-0/body-a"), 0.0)
    assert p.on_attempt(attempt(0, 1, key="tenant/call-0/body-b"), 1.0) == Create(1, dispatch=True)
    assert p.counts.retries_attached == 0
    assert p.executions[0].subscribers == {(0, 0)}
    assert p.executions[1].subscribers == {(0, 1)}
    # The original key still finds its own execution.
    assert p.on_attempt(attempt(0, 2, key="tenant/call-0/body-a"), 2.0) == Attach(0, first_token=False)


def test_without_coalescing_a_retry_creates_an_execution() -> None:
    p = proxy(coalescing=False)
    p.on_attempt(attempt(0, 0), 0.0)
    assert p.on_attempt(attempt(0, 1), 21.0) == Create(1, dispatch=True)
    assert p.counts.retries_attached == 0


def test_a_retry_after_completion_creates_a_new_execution() -> None:
    p = proxy(coalescing=True)
    p.on_attempt(attempt(0, 0), 0.0)
    p.on_subscriber_left((0, 0), 20.0)
    assert p.on_engine_event(0, "completed", 20.5) == []  # completed for nobody
    assert p.on_attempt(attempt(0, 1), 21.0) == Create(1, dispatch=True)
    assert p.executions[1].creator == (0, 1)
    assert p.counts.retries_attached == 0
    # The new execution is now the call's live one.
    assert p.on_attempt(attempt(0, 2), 22.0) == Attach(1, first_token=False)


def test_a_retry_after_the_engine_refused_creates_a_new_execution() -> None:
    p = proxy(coalescing=True)
    p.on_attempt(attempt(0, 0), 0.0)
    assert p.on_engine_event(0, "refused", 0.0) == [Notify((0, 0), "refused", status=503)]
    assert p.on_attempt(attempt(0, 1), 1.0) == Create(1, dispatch=True)


@pytest.mark.parametrize("how", ["immediate", "deferred"])
def test_a_retry_after_cancellation_creates_a_new_execution(how: str) -> None:
    p = proxy(coalescing=True, cancellation=how, defer_s=10.0)
    p.on_attempt(attempt(0, 0), 0.0)
    left = p.on_subscriber_left((0, 0), 20.0)
    if how == "deferred":
        assert left == [SetTimer(30.0, 0)]
        assert p.on_timer(0, 30.0) == [Cancel(0)]
    else:
        assert left == [Cancel(0)]
    assert p.executions[0].state == "cancelled"
    assert p.on_attempt(attempt(0, 1), 31.0) == Create(1, dispatch=True)
    assert p.counts.retries_attached == 0


def test_attaching_to_a_queued_execution() -> None:
    p = proxy(coalescing=True, max_outstanding=1)
    assert p.on_attempt(attempt(0, 0), 0.0) == Create(0, dispatch=True)
    assert p.on_attempt(attempt(1, 0), 1.0) == Create(1, dispatch=False)
    assert p.on_attempt(attempt(1, 1), 2.0) == Attach(1, first_token=False)
    assert p.waiting == 1  # still one queued execution, now with two subscribers
    assert p.executions[1].state == "queued"
    assert p.executions[1].subscribers == {(1, 0), (1, 1)}
    assert p.on_engine_event(0, "completed", 3.0) == [Notify((0, 0), "completed"), Dispatch(1)]
    assert p.on_engine_event(1, "first_token", 4.0) == [Notify((1, 0), "first_token"), Notify((1, 1), "first_token")]
    # The first subscriber leaving a queued execution that still has the retry does not drop it.
    p2 = proxy(coalescing=True, max_outstanding=1)
    p2.on_attempt(attempt(0, 0), 0.0)
    p2.on_attempt(attempt(1, 0), 1.0)
    p2.on_attempt(attempt(1, 1), 2.0)
    assert p2.on_subscriber_left((1, 0), 21.0) == []
    assert p2.executions[1].state == "queued"
    assert p2.counts.executions_dropped == 0


# == order of budget and lookup =====================================================================


def test_budget_first_refuses_a_retry_whose_call_has_a_live_execution() -> None:
    p = proxy(coalescing=True, retry_budget=True, order="budget-first")
    p.on_attempt(attempt(0, 0), 0.0)  # one first attempt: 0.1 x 1 admits no retry
    p.on_subscriber_left((0, 0), 20.0)
    decision = p.on_attempt(attempt(0, 1), 21.0, engine_waiting=5)
    # No observations: wait = (ahead 0 + engine_waiting 5) / 1 per s + one own slot.
    assert decision == Refuse(429, retry_after_s=6.0, live=True)
    assert decision.retry_after_s is not None and decision.retry_after_s > 0
    assert p.counts.retries_refused == 1
    assert p.counts.retries_refused_live == 1
    assert p.counts.retries_attached == 0
    assert p.executions[0].subscribers == set()  # the refused retry did not attach
    assert p.budget is not None and p.budget.state(21.0) == (1, 0)


def test_budget_first_charges_the_budget_for_a_retry_that_then_attaches() -> None:
    p = proxy(coalescing=True, retry_budget=True, order="budget-first")
    for call in range(10):
        p.on_attempt(attempt(call, 0), 0.0)
    assert p.on_attempt(attempt(0, 1), 1.0) == Attach(0, first_token=False)
    assert p.budget is not None and p.budget.state(1.0) == (10, 1)
    # The budget is spent: the next retry is refused although its call is live too.
    assert p.on_attempt(attempt(1, 1), 2.0) == Refuse(429, retry_after_s=1.0, live=True)


def test_lookup_first_attaches_and_never_charges_the_budget() -> None:
    p = proxy(coalescing=True, retry_budget=True, order="lookup-first")
    p.on_attempt(attempt(0, 0), 0.0)
    p.on_subscriber_left((0, 0), 20.0)
    assert p.on_attempt(attempt(0, 1), 21.0, engine_waiting=5) == Attach(0, first_token=False)
    p.on_subscriber_left((0, 1), 41.0)
    assert p.on_attempt(attempt(0, 2), 42.0, engine_waiting=5) == Attach(0, first_token=False)
    assert p.counts.retries_refused == 0
    assert p.counts.retries_attached == 2
    assert p.budget is not None and p.budget.state(42.0) == (1, 0)


def test_lookup_first_refuses_a_retry_without_live_execution_when_over_budget() -> None:
    p = proxy(coalescing=True, retry_budget=True, order="lookup-first")
    p.on_attempt(attempt(0, 0), 0.0)
    p.on_engine_event(0, "completed", 10.0)  # nothing live for call 0 any more
    decision = p.on_attempt(attempt(0, 1), 21.0, engine_waiting=2)
    assert decision == Refuse(429, retry_after_s=3.0, live=False)
    assert p.counts.retries_refused == 1
    assert p.counts.retries_refused_live == 0
    assert len(p.executions) == 1


def test_lookup_first_creates_a_retry_within_budget_and_charges_it() -> None:
    p = proxy(coalescing=True, retry_budget=True, order="lookup-first")
    for call in range(10):
        p.on_attempt(attempt(call, 0), 0.0)
    p.on_engine_event(0, "completed", 10.0)
    assert p.on_attempt(attempt(0, 1), 21.0) == Create(10, dispatch=True)
    assert p.budget is not None and p.budget.state(21.0) == (10, 1)


def test_budget_without_coalescing_never_reports_live() -> None:
    p = proxy(retry_budget=True)
    p.on_attempt(attempt(0, 0), 0.0)
    assert p.on_attempt(attempt(0, 1), 1.0) == Refuse(429, retry_after_s=1.0, live=False)
    assert p.counts.retries_refused_live == 0


def test_first_attempts_are_never_refused_by_the_budget() -> None:
    p = proxy(retry_budget=True, budget_ratio=0.0)
    decisions = [p.on_attempt(attempt(call, 0), float(call)) for call in range(5)]
    assert decisions == [Create(i, dispatch=True) for i in range(5)]
    assert isinstance(p.on_attempt(attempt(0, 1), 6.0), Refuse)


def test_budget_retry_after_counts_the_proxy_queue() -> None:
    p = proxy(retry_budget=True, max_outstanding=1)
    for call in range(4):  # 1 dispatched, 3 queued
        p.on_attempt(attempt(call, 0), 0.0)
    assert p.waiting == 3
    assert p.on_attempt(attempt(0, 1), 1.0, engine_waiting=2) == Refuse(429, retry_after_s=6.0, live=False)


# == deferred cancellation ===========================================================================


def test_deferred_leaving_sets_a_timer_at_now_plus_defer() -> None:
    p = proxy(coalescing=True, cancellation="deferred", defer_s=10.0)
    p.on_attempt(attempt(0, 0), 0.0)
    assert p.on_subscriber_left((0, 0), 20.0) == [SetTimer(30.0, 0)]
    assert p.executions[0].state == "live"
    assert p.executions[0].last_left_s == 20.0


def test_deferred_a_retry_attaching_before_the_timer_keeps_the_execution() -> None:
    p = proxy(coalescing=True, cancellation="deferred", defer_s=10.0)
    p.on_attempt(attempt(0, 0), 0.0)
    p.on_subscriber_left((0, 0), 20.0)
    assert p.on_attempt(attempt(0, 1), 22.5) == Attach(0, first_token=False)
    assert p.on_timer(0, 30.0) == []
    assert p.executions[0].state == "live"
    assert p.counts.executions_cancelled == 0
    assert p.on_engine_event(0, "completed", 31.0) == [Notify((0, 1), "completed")]


def test_deferred_only_the_timer_of_the_last_departure_cancels() -> None:
    p = proxy(coalescing=True, cancellation="deferred", defer_s=10.0)
    p.on_attempt(attempt(0, 0), 0.0)
    assert p.on_subscriber_left((0, 0), 20.0) == [SetTimer(30.0, 0)]
    assert p.on_attempt(attempt(0, 1), 22.0) == Attach(0, first_token=False)
    assert p.on_subscriber_left((0, 1), 25.0) == [SetTimer(35.0, 0)]
    assert p.on_timer(0, 30.0) == []  # the earlier timer: the retry left only 5 s ago
    assert p.executions[0].state == "live"
    assert p.on_timer(0, 34.999) == []
    assert p.on_timer(0, 35.0) == [Cancel(0)]
    assert p.executions[0].state == "cancelled"
    assert p.executions[0].abort_requested_s == 35.0
    assert p.counts.executions_cancelled == 1
    assert p.outstanding == 0
    assert p.on_timer(0, 36.0) == []


def test_deferred_timer_after_completion_does_nothing() -> None:
    p = proxy(coalescing=True, cancellation="deferred", defer_s=10.0)
    p.on_attempt(attempt(0, 0), 0.0)
    p.on_subscriber_left((0, 0), 20.0)
    p.on_engine_event(0, "completed", 25.0)
    assert p.on_timer(0, 30.0) == []
    assert p.executions[0].state == "completed"
    assert p.counts.executions_cancelled == 0


@pytest.mark.parametrize("mode", ["off", "immediate"])
def test_timers_never_cancel_unless_deferred(mode: str) -> None:
    p = proxy(coalescing=True, cancellation=mode)
    p.on_attempt(attempt(0, 0), 0.0)
    p.on_attempt(attempt(1, 0), 0.0)
    p.on_subscriber_left((0, 0), 20.0)
    for t in (20.0, 30.0, 1_000.0):
        assert p.on_timer(0, t) == []
        assert p.on_timer(1, t) == []  # a live execution with its subscriber
    assert p.executions[1].state == "live"
    assert p.executions[0].state == ("live" if mode == "off" else "cancelled")
    assert p.counts.executions_cancelled == (mode == "immediate")


# == immediate cancellation + coalescing (Finding 7's mechanism) ===================================


def test_immediate_cancellation_leaves_coalescing_nothing_to_attach_to() -> None:
    p = proxy(coalescing=True, cancellation="immediate")
    p.on_attempt(attempt(0, 0), 0.0)
    assert p.on_subscriber_left((0, 0), 20.0) == [Cancel(0)]  # the first attempt timed out
    assert p.on_attempt(attempt(0, 1), 20.25) == Create(1, dispatch=True)  # back after the backoff
    assert p.counts.retries_attached == 0
    assert p.counts.executions_cancelled == 1
    assert p.on_subscriber_left((0, 1), 40.25) == [Cancel(1)]
    assert p.on_attempt(attempt(0, 2), 41.0) == Create(2, dispatch=True)
    assert len(p.executions) == 3


# == the proxy queue ================================================================================


def test_cap_queues_the_third_execution() -> None:
    p = proxy(max_outstanding=2)
    assert p.on_attempt(attempt(0), 0.0) == Create(0, dispatch=True)
    assert p.on_attempt(attempt(1), 1.0) == Create(1, dispatch=True)
    assert p.on_attempt(attempt(2), 2.0) == Create(2, dispatch=False)
    assert p.waiting == 1
    assert p.outstanding == 2
    assert p.executions[2].state == "queued"


def test_completing_one_dispatches_the_queued_one() -> None:
    p = proxy(max_outstanding=2)
    for call in range(3):
        p.on_attempt(attempt(call), float(call))
    assert p.on_engine_event(0, "completed", 5.0) == [Notify((0, 0), "completed"), Dispatch(2)]
    assert p.waiting == 0
    assert p.outstanding == 2
    assert p.executions[2].state == "live"
    # A queued execution gets no engine events until dispatched, then behaves as any live one.
    assert p.on_engine_event(2, "first_token", 6.0) == [Notify((2, 0), "first_token")]


def test_engine_refusal_frees_a_slot_too() -> None:
    p = proxy(max_outstanding=1)
    p.on_attempt(attempt(0), 0.0)
    p.on_attempt(attempt(1), 0.0)
    assert p.on_engine_event(0, "refused", 0.0) == [Notify((0, 0), "refused", status=503), Dispatch(1)]


def test_engine_events_for_a_queued_execution_are_ignored() -> None:
    p = proxy(max_outstanding=1)
    p.on_attempt(attempt(0), 0.0)
    p.on_attempt(attempt(1), 0.0)
    assert p.on_engine_event(1, "completed", 1.0) == []
    assert p.executions[1].state == "queued"
    assert p.outstanding == 1


@pytest.mark.parametrize("mode", ["off", "immediate", "deferred"])
def test_queued_execution_whose_subscriber_leaves_is_dropped(mode: str) -> None:
    p = proxy(max_outstanding=1, cancellation=mode)
    p.on_attempt(attempt(0), 0.0)
    p.on_attempt(attempt(1), 1.0)
    p.on_attempt(attempt(2), 2.0)
    assert p.on_subscriber_left((1, 0), 21.0) == [Drop(1)]  # never a timer or a Cancel
    assert p.executions[1].state == "dropped"
    assert p.counts.executions_dropped == 1
    assert p.counts.executions_cancelled == 0
    assert p.waiting == 1
    assert p.outstanding == 1
    # The freed place goes to the next one; the dropped execution is never dispatched.
    assert p.on_engine_event(0, "completed", 22.0) == [Notify((0, 0), "completed"), Dispatch(2)]
    assert p.on_engine_event(2, "completed", 23.0) == [Notify((2, 0), "completed")]
    assert p.executions[1].state == "dropped"
    assert p.waiting == 0
    assert p.outstanding == 0


def test_a_retry_after_a_drop_creates_a_new_execution() -> None:
    p = proxy(max_outstanding=1, coalescing=True)
    p.on_attempt(attempt(0), 0.0)
    p.on_attempt(attempt(1, 0), 1.0)
    assert p.on_subscriber_left((1, 0), 21.0) == [Drop(1)]
    assert p.on_attempt(attempt(1, 1), 22.0) == Create(2, dispatch=False)


def test_fifo_dispatches_the_oldest() -> None:
    p = proxy(max_outstanding=1)
    for call in range(5):
        p.on_attempt(attempt(call), float(call))
    dispatched = []
    current = 0
    for t in range(4):
        actions = p.on_engine_event(current, "completed", 10.0 + t)
        (nxt,) = [a.execution_id for a in actions if isinstance(a, Dispatch)]
        dispatched.append(nxt)
        current = nxt
    assert dispatched == [1, 2, 3, 4]


def test_lifo_serves_the_newest_while_over_the_threshold_then_the_oldest() -> None:
    p = proxy(max_outstanding=1, queue_order="lifo", lifo_threshold=2)
    for call in range(5):  # 0 dispatched; 1, 2, 3, 4 queued
        p.on_attempt(attempt(call), float(call))
    assert p.waiting == 4
    order: list[tuple[int, int]] = []
    current = 0
    while p.waiting:
        waiting_before = p.waiting
        actions = p.on_engine_event(current, "completed", 10.0 + len(order))
        (nxt,) = [a.execution_id for a in actions if isinstance(a, Dispatch)]
        order.append((waiting_before, nxt))
        current = nxt
    # 4 and 3 wait (> 2): newest first; 2 or fewer wait: oldest first.
    assert order == [(4, 4), (3, 3), (2, 1), (1, 2)]


def test_lifo_threshold_zero_is_pure_newest_first() -> None:
    p = proxy(max_outstanding=1, queue_order="lifo", lifo_threshold=0)
    for call in range(4):
        p.on_attempt(attempt(call), float(call))
    assert p.on_engine_event(0, "completed", 10.0)[-1] == Dispatch(3)
    assert p.on_engine_event(3, "completed", 11.0)[-1] == Dispatch(2)
    assert p.on_engine_event(2, "completed", 12.0)[-1] == Dispatch(1)


def test_immediate_cancellation_of_a_dispatched_execution_frees_its_slot() -> None:
    p = proxy(max_outstanding=1, cancellation="immediate")
    p.on_attempt(attempt(0), 0.0)
    p.on_attempt(attempt(1), 1.0)
    assert p.on_subscriber_left((0, 0), 20.0) == [Cancel(0), Dispatch(1)]
    assert p.outstanding == 1
    assert p.waiting == 0
    assert p.executions[1].state == "live"


def test_deferred_cancellation_of_a_dispatched_execution_frees_its_slot() -> None:
    p = proxy(max_outstanding=1, cancellation="deferred", defer_s=10.0)
    p.on_attempt(attempt(0), 0.0)
    p.on_attempt(attempt(1), 1.0)
    assert p.on_subscriber_left((0, 0), 20.0) == [SetTimer(30.0, 0)]
    assert p.outstanding == 1  # the deferral keeps the slot
    assert p.on_timer(0, 30.0) == [Cancel(0), Dispatch(1)]


def test_an_orphan_keeps_its_slot_when_cancellation_is_off() -> None:
    p = proxy(max_outstanding=1, cancellation="off")
    p.on_attempt(attempt(0), 0.0)
    p.on_attempt(attempt(1), 1.0)
    assert p.on_subscriber_left((0, 0), 20.0) == []
    assert p.outstanding == 1
    assert p.waiting == 1
    assert p.on_engine_event(0, "completed", 30.0) == [Dispatch(1)]


# == the deadline check =============================================================================


def test_deadline_check_refuses_an_attempt_estimated_to_miss_its_deadline() -> None:
    p = proxy(max_outstanding=100, deadline_check=True, attempt_deadline_s=120.0)
    # No observations: 1 first token per s, so the wait is engine_waiting + 1 own slot.
    assert p.on_attempt(attempt(0), 0.0, engine_waiting=200) == Refuse(503)
    assert p.counts.deadline_refused == 1
    assert p.executions == {}
    assert p.on_attempt(attempt(1), 0.0, engine_waiting=0) == Create(0, dispatch=True)
    assert p.counts.deadline_refused == 1


def test_deadline_check_boundary_is_strictly_greater() -> None:
    p = proxy(max_outstanding=100, deadline_check=True, attempt_deadline_s=120.0)
    assert p.on_attempt(attempt(0), 0.0, engine_waiting=119) == Create(0, dispatch=True)  # 120 s: on time
    assert p.on_attempt(attempt(1), 0.0, engine_waiting=120) == Refuse(503)  # 121 s: late


def test_deadline_check_counts_the_proxy_queue_ahead() -> None:
    p = proxy(max_outstanding=1, deadline_check=True, attempt_deadline_s=3.0)
    decisions = [p.on_attempt(attempt(call), 0.0) for call in range(5)]
    # Ahead: 0, 0, 1, 2 queued -> waits 1, 1, 2, 3 s; the fifth would have 3 ahead: 4 s > 3 s.
    assert decisions == [Create(0), Create(1, dispatch=False), Create(2, dispatch=False),
                         Create(3, dispatch=False), Refuse(503)]
    assert p.counts.deadline_refused == 1


def test_deadline_check_uses_the_observed_rate() -> None:
    p = proxy(max_outstanding=100, deadline_check=True, attempt_deadline_s=10.0)
    for call in range(40):  # 40 first tokens over 10 s: 4 per s
        p.on_attempt(attempt(call), call / 4)
        p.on_engine_event(call, "first_token", call / 4)
        p.on_engine_event(call, "completed", call / 4)
    # 30 ahead at 4 per s = 7.5 s plus 0.25 s own: on time; 40 ahead = 10.25 s: late.
    assert isinstance(p.on_attempt(attempt(100), 10.0, engine_waiting=30), Create)
    assert p.on_attempt(attempt(101), 10.0, engine_waiting=40) == Refuse(503)


# == property: invariants of the proxy's bookkeeping =================================================


@st.composite
def policies(draw: st.DrawFn) -> ProxyPolicy:
    cap = draw(st.one_of(st.none(), st.integers(1, 3)))
    queued = cap is not None
    return ProxyPolicy(
        cancellation=draw(st.sampled_from(["off", "immediate", "deferred"])),
        defer_s=draw(st.sampled_from([0.0, 1.0, 3.0])),
        retry_budget=draw(st.booleans()),
        budget_ratio=draw(st.sampled_from([0.0, 0.5, 1.0, 10.0])),
        budget_window_s=draw(st.sampled_from([5.0, 60.0])),
        coalescing=draw(st.booleans()),
        order=draw(st.sampled_from(["budget-first", "lookup-first"])),
        max_outstanding=cap,
        queue_order=draw(st.sampled_from(["fifo", "lifo"])) if queued else "fifo",
        lifo_threshold=draw(st.integers(0, 3)),
        deadline_check=draw(st.booleans()) if queued else False,
        attempt_deadline_s=draw(st.sampled_from([3.0, 120.0])),
    )


OPS = st.lists(
    st.tuples(st.sampled_from(["attempt"] * 4 + ["leave"] * 3 + ["timer"] * 2 + ["done"] * 2
                              + ["first", "refuse", "stale"]),
              st.integers(0, 30), st.integers(0, 8), st.booleans()),
    min_size=20, max_size=80)


def check_invariants(p: ProxyCore, dispatched: set[int]) -> None:
    policy = p.policy
    executions = p.executions
    queued = [eid for eid, e in executions.items() if e.state == "queued"]
    live = [eid for eid, e in executions.items() if e.state == "live"]
    assert p.outstanding >= 0
    if policy.max_outstanding is not None:
        assert p.outstanding <= policy.max_outstanding
    assert p.outstanding == len(live)
    assert p.waiting == len(queued)
    assert sorted(p._queue) == sorted(queued)
    assert len(set(p._queue)) == len(p._queue)
    for eid in dispatched:
        assert executions[eid].state != "queued"
        assert eid not in p._queue
    assert set(live) <= dispatched
    # Every subscriber belongs to at most one execution, and the index agrees.
    owner: dict[tuple[int, int], int] = {}
    for eid, e in executions.items():
        for subscriber in e.subscribers:
            assert subscriber not in owner, f"{subscriber} in executions {owner[subscriber]} and {eid}"
            owner[subscriber] = eid
        if e.state not in ("live", "queued"):
            assert e.subscribers == set()
    assert owner == p._by_subscriber
    if policy.coalescing:
        active_keys = [e.key for e in executions.values() if e.state in ("live", "queued")]
        assert len(active_keys) == len(set(active_keys))


@settings(max_examples=300, database=None, deadline=None)
@given(policy=policies(), ops=OPS)
def test_random_sequences_keep_the_proxys_invariants(policy: ProxyPolicy,
                                                    ops: list[tuple[str, int, int, bool]]) -> None:
    p = ProxyCore(policy)
    now = 0.0
    next_no = [0, 0, 0]
    waiting_subscribers: list[tuple[int, int]] = []
    timers: list[SetTimer] = []
    dispatched: set[int] = set()
    for op, x, y, flag in ops:
        now += y / 4
        states_before = {eid: e.state for eid, e in p.executions.items()}
        if op == "attempt":
            call = x % 3
            no = next_no[call]
            next_no[call] += 1
            key = f"call-{call}" + ("/other-body" if flag and no > 0 else "")
            decision = p.on_attempt(attempt(call, no, key=key, prompt=1000 + 1000 * y), now, engine_waiting=y // 3)
            if isinstance(decision, Create):
                assert decision.execution_id not in states_before
                assert p.executions[decision.execution_id].state == ("live" if decision.dispatch else "queued")
                if policy.max_outstanding is None:
                    assert decision.dispatch
                if decision.dispatch:
                    dispatched.add(decision.execution_id)
                waiting_subscribers.append((call, no))
            elif isinstance(decision, Attach):
                assert policy.coalescing
                assert no > 0  # only a retry can find its call's execution
                assert states_before[decision.execution_id] in ("live", "queued")
                assert p.executions[decision.execution_id].key == key
                assert decision.first_token == p.executions[decision.execution_id].first_token
                waiting_subscribers.append((call, no))
            else:
                assert isinstance(decision, Refuse)
                if decision.status == 429:
                    assert policy.retry_budget and no > 0
                    assert decision.retry_after_s is not None and decision.retry_after_s > 0
                    assert not decision.live or (policy.coalescing and policy.order == "budget-first")
                else:
                    assert decision.status == 503 and policy.deadline_check
                assert (call, no) not in p._by_subscriber
            actions: list[Any] = []
        elif op == "leave":
            if not waiting_subscribers:
                continue
            actions = p.on_subscriber_left(waiting_subscribers.pop(x % len(waiting_subscribers)), now)
        elif op == "timer":
            if not timers:
                continue
            timer = timers.pop(x % len(timers))
            now = max(now, timer.at_s)
            actions = p.on_timer(timer.execution_id, now)
        elif op == "stale":  # an engine event for an execution that is not live: ignored
            others = [eid for eid, e in p.executions.items() if e.state != "live"]
            if not others:
                continue
            kind = ["first_token", "completed", "refused"][y % 3]
            assert p.on_engine_event(others[x % len(others)], kind, now) == []
            actions = []
        else:
            live = sorted(eid for eid, e in p.executions.items() if e.state == "live")
            if not live:
                continue
            eid = live[x % len(live)]
            kind = {"first": "first_token", "done": "completed", "refuse": "refused"}[op]
            subscribers = set(p.executions[eid].subscribers)
            actions = p.on_engine_event(eid, kind, now)
            notified = {a.subscriber for a in actions if isinstance(a, Notify)}
            assert notified == subscribers
            if kind != "first_token":
                waiting_subscribers = [s for s in waiting_subscribers if s not in subscribers]
        for action in actions:
            if isinstance(action, Dispatch):
                assert states_before.get(action.execution_id) == "queued", "Dispatch of a non-queued execution"
                assert action.execution_id not in dispatched
                dispatched.add(action.execution_id)
            elif isinstance(action, Cancel):
                assert policy.cancellation != "off"
                assert states_before[action.execution_id] == "live"
                assert p.executions[action.execution_id].state == "cancelled"
            elif isinstance(action, Drop):
                assert states_before[action.execution_id] == "queued"
                assert p.executions[action.execution_id].state == "dropped"
            elif isinstance(action, SetTimer):
                assert policy.cancellation == "deferred"
                assert action.at_s == now + policy.defer_s
                timers.append(action)
            else:
                assert isinstance(action, Notify)
        check_invariants(p, dispatched)
    assert p.counts.executions_dropped == sum(1 for e in p.executions.values() if e.state == "dropped")
    assert p.counts.executions_cancelled == sum(1 for e in p.executions.values() if e.state == "cancelled")
    if policy.cancellation == "off":
        assert p.counts.executions_cancelled == 0


# == policy files ===================================================================================

POLICY_DIR = Path(retrybench.__file__).parent / "conditions" / "policies"
POLICY_FILES = sorted(POLICY_DIR.glob("*.toml"))


def test_there_are_policy_files() -> None:
    assert len(POLICY_FILES) >= 18


@pytest.mark.parametrize("path", POLICY_FILES, ids=[p.stem for p in POLICY_FILES])
def test_every_policy_file_loads_by_name_and_by_path(path: Path) -> None:
    by_name = load_condition(path.stem)
    assert by_name.name == path.stem
    assert isinstance(by_name.proxy, ProxyPolicy)
    assert by_name.description
    by_path = load_condition(str(path))
    assert by_path.proxy == by_name.proxy
    assert by_path.client == by_name.client
    assert by_path.engine_cap == by_name.engine_cap
    ProxyCore(by_name.proxy)  # every policy can drive the proxy


def test_control_policies_have_the_papers_settings() -> None:
    assert load_condition("retry-budget").proxy == ProxyPolicy(retry_budget=True)
    budget = load_condition("retry-budget").proxy
    assert (budget.budget_ratio, budget.budget_window_s) == (0.1, 60.0)
    assert load_condition("coalescing").proxy == ProxyPolicy(coalescing=True)
    assert load_condition("budget-first").proxy == ProxyPolicy(retry_budget=True, coalescing=True,
                                                               order="budget-first")
    assert load_condition("lookup-first").proxy == ProxyPolicy(retry_budget=True, coalescing=True,
                                                               order="lookup-first")
    assert load_condition("deferred-cancellation").proxy == ProxyPolicy(cancellation="deferred", defer_s=10.0,
                                                                        coalescing=True)
    assert load_condition("coalescing-cancel-on").proxy == ProxyPolicy(cancellation="immediate", coalescing=True)
    assert load_condition("proxy-cap").proxy == ProxyPolicy(cancellation="immediate", max_outstanding=100)
    assert load_condition("lifo").proxy == ProxyPolicy(cancellation="immediate", max_outstanding=100,
                                                       queue_order="lifo", lifo_threshold=50)
    assert load_condition("deadline-check").proxy == ProxyPolicy(cancellation="immediate", max_outstanding=100,
                                                                 deadline_check=True)


def proxy_toml(body: str) -> str:
    return f'description = "test"\n[proxy]\n{body}\n'


@pytest.mark.parametrize(("body", "must_name"), [
    ('cancellation = "sometimes"', ["cancellation", "off", "immediate", "deferred", "sometimes"]),
    ('order = "random"', ["order", "budget-first", "lookup-first", "random"]),
    ("max_outstanding = 0", ["max_outstanding", "positive integer"]),
    ("max_outstanding = -3", ["max_outstanding", "positive integer"]),
    ("max_outstanding = 1.5", ["max_outstanding", "int", "1.5"]),
    ('queue_order = "lifo"', ["queue_order", "lifo", "max_outstanding"]),
    ("deadline_check = true", ["deadline_check", "max_outstanding"]),
    ('queue_order = "stack"\nmax_outstanding = 5', ["queue_order", "fifo", "lifo", "stack"]),
    ("defer_s = -1.0", ["defer_s", ">= 0"]),
    ("cancel_delay_s = 0.5", ["cancel_delay_s", "[0, 0.5)"]),
    ("budget_ratio = 11", ["budget_ratio", "[0, 10]"]),
    ("budget_window_s = 0", ["budget_window_s", "> 0"]),
    ("lifo_threshold = -1\nmax_outstanding = 5", ["lifo_threshold", ">= 0"]),
])
def test_a_bad_value_names_the_field_and_the_allowed_values(body: str, must_name: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        condition_from_toml(proxy_toml(body), "bad", where="bad.toml")
    message = str(caught.value)
    assert "bad.toml" in message
    assert "[proxy]" in message
    for word in must_name:
        assert word in message, f"{word!r} missing from {message!r}"


def test_an_unknown_field_names_it_and_the_allowed_fields() -> None:
    with pytest.raises(ConfigError) as caught:
        condition_from_toml(proxy_toml("coalesce = true"), "bad", where="bad.toml")
    message = str(caught.value)
    assert "unknown field 'coalesce'" in message
    assert "bad.toml [proxy]" in message
    for name in ("coalescing", "cancellation", "max_outstanding", "queue_order", "retry_budget", "order"):
        assert name in message


def test_an_unknown_top_level_key_is_refused() -> None:
    allowed = "breaker, client, description, engine_cap, proxy"
    with pytest.raises(ConfigError, match=rf"unknown key 'prox'; allowed: {allowed}"):
        condition_from_toml('[prox]\ncoalescing = true\n', "bad", where="bad.toml")


def test_a_bad_policy_file_on_disk_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text(proxy_toml('cancellation = "sometimes"'))
    with pytest.raises(ConfigError) as caught:
        load_condition(str(path))
    assert str(path) in str(caught.value)
    assert "cancellation must be one of off, immediate, deferred" in str(caught.value)


def test_an_unknown_condition_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown condition 'no-such-policy'; known: .*lookup-first"):
        load_condition("no-such-policy")


def test_a_string_for_a_bool_field_is_refused() -> None:
    """Once a bug: coalescing = "false" (a string) was accepted and, being truthy, turned coalescing on."""
    with pytest.raises(ConfigError, match="coalescing"):
        condition_from_toml(proxy_toml('coalescing = "false"'), "bad", where="bad.toml")


def test_a_string_for_a_number_field_names_the_field() -> None:
    """Once a bug: the TypeError of the comparison became a ConfigError that did not name the field."""
    with pytest.raises(ConfigError, match="defer_s"):
        condition_from_toml(proxy_toml('defer_s = "10"'), "bad", where="bad.toml")


def test_a_bool_for_max_outstanding_is_refused() -> None:
    """Once a bug: bool passes isinstance(x, int), so max_outstanding = true was a cap of 1."""
    with pytest.raises(ConfigError, match="max_outstanding"):
        condition_from_toml(proxy_toml("max_outstanding = true"), "bad", where="bad.toml")
