"""ProxyCore: pass-through executions, the three cancellation policies, engine events to subscribers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrybench.conditions.config import ProxyPolicy
from retrybench.control.proxy import AttemptIn, Cancel, Create, Notify, ProxyCore, SetTimer


def attempt(call: int, no: int = 0, *, prompt: int = 12_000, max_tokens: int = 300) -> AttemptIn:
    return AttemptIn(call_index=call, attempt_no=no, key=f"call-{call}", prompt_tokens=prompt,
                     max_tokens=max_tokens)


def core(mode: str = "off", defer_s: float = 10.0) -> ProxyCore:
    return ProxyCore(ProxyPolicy(cancellation=mode, defer_s=defer_s))


# -- pass-through -----------------------------------------------------------------------------------


def test_each_attempt_gets_its_own_execution_dispatched_at_once() -> None:
    proxy = core()
    created = [proxy.on_attempt(attempt(0, 0), 0.0), proxy.on_attempt(attempt(0, 1), 5.0),
               proxy.on_attempt(attempt(1, 0), 5.0)]
    assert created == [Create(0, dispatch=True), Create(1, dispatch=True), Create(2, dispatch=True)]
    assert len(proxy.executions) == 3
    retry = proxy.executions[1]
    assert retry.creator == (0, 1)
    assert retry.subscribers == {(0, 1)}
    assert retry.key == "call-0"  # same call, yet no coalescing in pass-through
    assert retry.created_s == 5.0
    assert retry.state == "live"
    assert proxy.waiting == 0


def test_attempt_subscriber_is_call_and_attempt() -> None:
    assert attempt(3, 2).subscriber == (3, 2)


# -- cancellation policies ---------------------------------------------------------------------------


def test_off_orphans_the_execution() -> None:
    proxy = core("off")
    proxy.on_attempt(attempt(0), 0.0)
    assert proxy.on_subscriber_left((0, 0), 120.0) == []
    execution = proxy.executions[0]
    assert execution.state == "live"  # keeps running for nobody
    assert execution.subscribers == set()
    assert execution.last_left_s == 120.0
    assert execution.abort_requested_s is None


def test_immediate_cancels_when_the_last_subscriber_leaves() -> None:
    proxy = core("immediate")
    proxy.on_attempt(attempt(0), 0.0)
    assert proxy.on_subscriber_left((0, 0), 120.0) == [Cancel(0)]
    execution = proxy.executions[0]
    assert execution.state == "cancelled"
    assert execution.abort_requested_s == 120.0
    # Engine output after the cancel reaches nobody.
    assert proxy.on_engine_event(0, "first_token", 120.1) == []
    assert proxy.on_engine_event(0, "completed", 121.0) == []


def test_deferred_sets_a_timer_then_cancels_if_no_one_came_back() -> None:
    proxy = core("deferred", defer_s=10.0)
    proxy.on_attempt(attempt(0), 0.0)
    assert proxy.on_subscriber_left((0, 0), 120.0) == [SetTimer(130.0, 0)]
    assert proxy.executions[0].state == "live"
    assert proxy.on_timer(0, 130.0) == [Cancel(0)]
    assert proxy.executions[0].state == "cancelled"
    assert proxy.executions[0].abort_requested_s == 130.0
    assert proxy.on_timer(0, 131.0) == []  # already cancelled


def test_deferred_timer_does_nothing_if_a_subscriber_is_attached() -> None:
    proxy = core("deferred", defer_s=10.0)
    proxy.on_attempt(attempt(0), 0.0)
    proxy.on_subscriber_left((0, 0), 120.0)
    # A subscriber attaches meanwhile (what coalescing does).
    proxy.executions[0].subscribers.add((0, 1))
    assert proxy.on_timer(0, 130.0) == []
    assert proxy.executions[0].state == "live"


def test_deferred_timer_from_an_older_departure_waits_for_the_newer_one() -> None:
    proxy = core("deferred", defer_s=10.0)
    proxy.on_attempt(attempt(0), 0.0)
    proxy.on_subscriber_left((0, 0), 120.0)
    execution = proxy.executions[0]
    execution.subscribers.add((0, 1))  # someone attached ...
    proxy._by_subscriber[(0, 1)] = 0
    assert proxy.on_subscriber_left((0, 1), 125.0) == [SetTimer(135.0, 0)]  # ... and left again
    assert proxy.on_timer(0, 130.0) == []  # the first timer: too early for the latest departure
    assert execution.state == "live"
    assert proxy.on_timer(0, 135.0) == [Cancel(0)]


def test_deferred_with_zero_delay_cancels_at_the_same_time() -> None:
    proxy = core("deferred", defer_s=0.0)
    proxy.on_attempt(attempt(0), 0.0)
    assert proxy.on_subscriber_left((0, 0), 50.0) == [SetTimer(50.0, 0)]
    assert proxy.on_timer(0, 50.0) == [Cancel(0)]


@pytest.mark.parametrize("mode", ["off", "immediate", "deferred"])
def test_leaving_after_completion_does_nothing(mode: str) -> None:
    proxy = core(mode)
    proxy.on_attempt(attempt(0), 0.0)
    proxy.on_engine_event(0, "completed", 10.0)
    assert proxy.on_subscriber_left((0, 0), 120.0) == []
    assert proxy.executions[0].state == "completed"


@pytest.mark.parametrize("mode", ["off", "immediate", "deferred"])
def test_unknown_subscriber_leaving_is_ignored(mode: str) -> None:
    proxy = core(mode)
    assert proxy.on_subscriber_left((9, 9), 1.0) == []
    proxy.on_attempt(attempt(0), 0.0)
    proxy.on_subscriber_left((0, 0), 1.0)
    assert proxy.on_subscriber_left((0, 0), 2.0) == []  # leaving twice


def test_timer_for_unknown_execution_is_ignored() -> None:
    assert core("deferred").on_timer(7, 1.0) == []


# -- engine events ----------------------------------------------------------------------------------


def test_engine_events_notify_the_subscribers() -> None:
    proxy = core()
    proxy.on_attempt(attempt(0), 0.0)
    assert proxy.on_engine_event(0, "first_token", 1.0) == [Notify((0, 0), "first_token")]
    assert proxy.executions[0].first_token
    assert proxy.executions[0].subscribers == {(0, 0)}  # still streaming
    assert proxy.on_engine_event(0, "completed", 5.0) == [Notify((0, 0), "completed")]
    assert proxy.executions[0].state == "completed"
    assert proxy.executions[0].subscribers == set()
    assert proxy.on_engine_event(0, "completed", 6.0) == []  # only once


def test_several_subscribers_are_notified_in_order() -> None:
    proxy = core()
    proxy.on_attempt(attempt(0, 0), 0.0)
    proxy.executions[0].subscribers.update({(0, 2), (0, 1)})
    actions = proxy.on_engine_event(0, "completed", 3.0)
    assert actions == [Notify((0, 0), "completed"), Notify((0, 1), "completed"),
                       Notify((0, 2), "completed")]


def test_refused_notifies_503() -> None:
    proxy = core("immediate")
    proxy.on_attempt(attempt(0), 0.0)
    actions = proxy.on_engine_event(0, "refused", 0.0)
    assert actions == [Notify((0, 0), "refused", status=503)]
    note = actions[0]
    assert isinstance(note, Notify) and note.retry_after_s is None  # vLLM sends no Retry-After
    assert proxy.executions[0].state == "refused"
    # The subscriber is gone: its later deadline does not cancel anything.
    assert proxy.on_subscriber_left((0, 0), 120.0) == []


def test_orphaned_execution_completes_for_nobody() -> None:
    proxy = core("off")
    proxy.on_attempt(attempt(0), 0.0)
    proxy.on_subscriber_left((0, 0), 120.0)
    assert proxy.on_engine_event(0, "completed", 200.0) == []
    assert proxy.executions[0].state == "completed"


def test_unknown_engine_event_raises() -> None:
    proxy = core()
    proxy.on_attempt(attempt(0), 0.0)
    with pytest.raises(ValueError, match="unknown engine event"):
        proxy.on_engine_event(0, "exploded", 1.0)


@settings(max_examples=100, deadline=None, database=None)
@given(mode=st.sampled_from(["off", "immediate", "deferred"]),
       ops=st.lists(st.tuples(st.sampled_from(["attempt", "leave", "first", "done", "refuse", "timer"]),
                              st.integers(0, 5)), max_size=40))
def test_random_event_sequences(mode: str, ops: list[tuple[str, int]]) -> None:
    """Random arrivals, departures and engine events; timers fire only as the proxy set them."""
    proxy = core(mode, defer_s=2.0)
    now = 0.0
    next_call = 0
    cancels: list[int] = []
    timers: list[SetTimer] = []
    for op, x in ops:
        now += 1.0
        if op == "attempt":
            decision = proxy.on_attempt(attempt(next_call), now)
            assert isinstance(decision, Create) and decision.execution_id == next_call
            next_call += 1
            continue
        if op == "timer":
            if not timers:
                continue
            timer = timers.pop(x % len(timers))
            now = max(now, timer.at_s)
            actions = proxy.on_timer(timer.execution_id, now)
        elif not proxy.executions:
            continue
        elif op == "leave":
            actions = proxy.on_subscriber_left((x % len(proxy.executions), 0), now)
        else:
            kind = {"first": "first_token", "done": "completed", "refuse": "refused"}[op]
            actions = proxy.on_engine_event(x % len(proxy.executions), kind, now)
        for action in actions:
            if isinstance(action, Cancel):
                assert mode != "off"
                cancels.append(action.execution_id)
                assert proxy.executions[action.execution_id].abort_requested_s == now
            elif isinstance(action, SetTimer):
                assert mode == "deferred"
                assert action.at_s == now + 2.0
                timers.append(action)
            else:
                assert isinstance(action, Notify)
    assert len(cancels) == len(set(cancels))  # each execution is cancelled at most once
    for execution in proxy.executions.values():
        if execution.state == "cancelled":
            assert execution.subscribers == set()
            assert execution.abort_requested_s is not None
            assert execution.abort_requested_s >= (execution.last_left_s or 0.0)
        if execution.state in ("completed", "refused"):
            assert execution.subscribers == set()
    if mode == "off":
        assert all(e.state != "cancelled" for e in proxy.executions.values())
