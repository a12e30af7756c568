"""Result retention in ProxyCore: a completed response kept for late retries of its call, bounded in
time and bytes, never served across keys (tenants)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrybench.conditions.config import ConfigError, ProxyPolicy
from retrybench.control.proxy import Attach, AttemptIn, Create, Notify, ProxyCore, Refuse, Release, Retain, Serve


def attempt(call: int, no: int = 0, *, key: str | None = None) -> AttemptIn:
    return AttemptIn(call_index=call, attempt_no=no, key=key or f"call-{call}", prompt_tokens=12_000,
                     max_tokens=300)


def core(**policy: object) -> ProxyCore:
    return ProxyCore(ProxyPolicy(retain_s=10.0, **policy))  # type: ignore[arg-type]


def complete(proxy: ProxyCore, execution_id: int, now: float, size: int | None = 1_000) -> list[object]:
    proxy.on_engine_event(execution_id, "first_token", now)
    return list(proxy.on_engine_event(execution_id, "completed", now, size))


def test_a_retry_after_completion_is_served_the_kept_response() -> None:
    proxy = core()
    assert proxy.on_attempt(attempt(0, 0), 0.0) == Create(0)
    assert proxy.on_subscriber_left((0, 0), 5.0) == []  # cancellation off: it runs on for nobody
    assert complete(proxy, 0, 6.0) == [Retain(0)]  # nobody to notify; the response is kept
    assert proxy.on_attempt(attempt(0, 1), 7.0) == Serve(0)
    assert proxy.counts.served_retained == 1
    assert proxy.counts.results_retained == 1
    assert proxy.retained_bytes == 1_000
    assert len(proxy.executions) == 1  # the call was computed once


def test_subscribers_are_notified_before_the_response_is_kept() -> None:
    proxy = core()
    proxy.on_attempt(attempt(0, 0), 0.0)
    assert complete(proxy, 0, 3.0) == [Notify((0, 0), "completed"), Retain(0)]


def test_retention_is_off_by_default_and_for_responses_without_a_size() -> None:
    paper = ProxyCore(ProxyPolicy())
    paper.on_attempt(attempt(0, 0), 0.0)
    assert complete(paper, 0, 1.0) == [Notify((0, 0), "completed")]
    assert paper.on_attempt(attempt(0, 1), 2.0) == Create(1)
    proxy = core()
    proxy.on_attempt(attempt(0, 0), 0.0)
    assert complete(proxy, 0, 1.0, size=None) == [Notify((0, 0), "completed")]  # e.g. an HTTP 400
    assert proxy.on_attempt(attempt(0, 1), 2.0) == Create(1)


def test_refused_executions_are_not_kept() -> None:
    proxy = core()
    proxy.on_attempt(attempt(0, 0), 0.0)
    assert proxy.on_engine_event(0, "refused", 1.0, 500) == [Notify((0, 0), "refused", status=503)]
    assert proxy.on_attempt(attempt(0, 1), 2.0) == Create(1)


def test_the_window_is_half_open_at_its_edge() -> None:
    proxy = core()
    proxy.on_attempt(attempt(0, 0), 0.0)
    complete(proxy, 0, 5.0)
    assert proxy.on_attempt(attempt(0, 1), 14.999) == Serve(0)
    assert proxy.on_attempt(attempt(0, 2), 15.0) == Create(1)  # completed at 5 + 10 s: gone
    assert proxy.expire(15.0) == [Release(0)]
    assert proxy.retained_bytes == 0
    assert proxy.counts.retained_expired == 1


def test_expire_releases_only_what_has_passed_oldest_first() -> None:
    proxy = core()
    for call in range(3):
        proxy.on_attempt(attempt(call), float(call))
        complete(proxy, call, float(call))
    assert proxy.expire(11.5) == [Release(0), Release(1)]
    assert proxy.retained_results == 1
    assert proxy.expire(11.5) == []


def test_another_key_never_gets_the_response() -> None:
    """The key covers the tenant (API key) and the body: the same call id under another tenant is
    another call."""
    proxy = core()
    proxy.on_attempt(attempt(0, 0, key="tenant-a/call-42"), 0.0)
    complete(proxy, 0, 1.0)
    assert proxy.on_attempt(attempt(1, 1, key="tenant-b/call-42"), 2.0) == Create(1)
    assert proxy.on_attempt(attempt(0, 1, key="tenant-a/call-42"), 2.0) == Serve(0)


def test_the_oldest_responses_are_evicted_to_stay_within_the_byte_bound() -> None:
    proxy = core(retain_max_bytes=2_500)
    for call in range(3):
        proxy.on_attempt(attempt(call), 0.0)
    assert complete(proxy, 0, 1.0)[-1:] == [Retain(0)]
    assert complete(proxy, 1, 2.0)[-1:] == [Retain(1)]
    assert complete(proxy, 2, 3.0)[-2:] == [Release(0), Retain(2)]
    assert proxy.counts.retained_evicted == 1
    assert proxy.retained_bytes == 2_000
    assert proxy.on_attempt(attempt(0, 1), 4.0) == Create(3)
    assert proxy.on_attempt(attempt(1, 1), 4.0) == Serve(1)


def test_a_response_over_the_per_result_limit_is_not_kept() -> None:
    proxy = core(retain_result_max_bytes=999)
    proxy.on_attempt(attempt(0, 0), 0.0)
    assert complete(proxy, 0, 1.0) == [Notify((0, 0), "completed")]
    assert proxy.counts.retain_too_large == 1
    assert proxy.retained_bytes == 0


def test_a_newer_response_of_the_same_call_replaces_the_older() -> None:
    proxy = core()  # no coalescing: two attempts of one call run side by side
    proxy.on_attempt(attempt(0, 0), 0.0)
    proxy.on_attempt(attempt(0, 1), 1.0)
    complete(proxy, 0, 2.0)
    assert complete(proxy, 1, 3.0)[-2:] == [Release(0), Retain(1)]
    assert proxy.retained_bytes == 1_000
    assert proxy.on_attempt(attempt(0, 2), 4.0) == Serve(1)


def test_a_kept_response_comes_before_the_budget_and_the_live_lookup() -> None:
    """Serving it costs the engine nothing, so the budget is not asked (budget-first included)."""
    proxy = core(retry_budget=True, budget_ratio=0.0, coalescing=True, order="budget-first")
    proxy.on_attempt(attempt(0, 0), 0.0)
    complete(proxy, 0, 1.0)
    assert proxy.on_attempt(attempt(0, 1), 2.0) == Serve(0)
    assert isinstance(proxy.on_attempt(attempt(1, 1), 2.0), Refuse)  # no kept response: the budget refuses
    assert proxy.counts.retries_refused == 1


def test_a_live_execution_is_attached_to_while_nothing_is_kept() -> None:
    proxy = core(coalescing=True)
    proxy.on_attempt(attempt(0, 0), 0.0)
    assert proxy.on_attempt(attempt(0, 1), 1.0) == Attach(0, first_token=False)
    assert complete(proxy, 0, 2.0) == [Notify((0, 0), "completed"), Notify((0, 1), "completed"), Retain(0)]
    assert proxy.on_attempt(attempt(0, 2), 3.0) == Serve(0)


@pytest.mark.parametrize(("field", "value"), [("retain_s", -1.0), ("retain_s", float("nan")),
                                              ("retain_max_bytes", -1), ("retain_result_max_bytes", -5)])
def test_bad_retention_settings_are_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        ProxyPolicy(**{field: value})  # type: ignore[arg-type]


# -- a property: the core against a direct model of the rules ---------------------------------------

events = st.lists(st.tuples(st.sampled_from(["attempt", "complete", "expire"]), st.integers(0, 3),
                            st.integers(1, 3), st.floats(0.0, 4.0)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(events=events, retain_s=st.sampled_from([0.5, 2.0, 10.0]), max_bytes=st.sampled_from([2, 4, 100]))
def test_serve_attach_or_create_follows_the_rules(events: list[tuple[str, int, int, float]], retain_s: float,
                                                  max_bytes: int) -> None:
    """Every attempt is served exactly when its key's last completion is within the window and was
    neither evicted nor replaced; bytes never exceed the bound; released ids were retained."""
    proxy = ProxyCore(ProxyPolicy(retain_s=retain_s, retain_max_bytes=max_bytes, coalescing=True))
    now = 0.0
    kept: dict[str, tuple[int, float, int]] = {}  # the model: key -> (execution, completed at, size)
    retained: set[int] = set()
    attempts = {call: 0 for call in range(4)}
    live: dict[int, int] = {}  # call -> live execution

    def apply(actions: Sequence[object]) -> None:
        for action in actions:
            if isinstance(action, Retain):
                retained.add(action.execution_id)
            elif isinstance(action, Release):
                assert action.execution_id in retained, "released an execution that was never retained"
                retained.discard(action.execution_id)

    for kind, call, size, step in events:
        now += step
        key = f"call-{call}"
        if kind == "attempt":
            decision = proxy.on_attempt(attempt(call, attempts[call]), now)
            attempts[call] += 1
            model = kept.get(key)
            if model is not None and now < model[1] + retain_s and model[0] in retained:
                assert decision == Serve(model[0])
            elif call in live:
                assert decision == Attach(live[call], first_token=False)
            else:
                assert isinstance(decision, Create)
                live[call] = decision.execution_id
        elif kind == "complete" and call in live:
            execution_id = live.pop(call)
            actions = proxy.on_engine_event(execution_id, "completed", now, size)
            apply(actions)
            if Retain(execution_id) in actions:
                kept[key] = (execution_id, now, size)
            else:
                assert size > max_bytes
        elif kind == "expire":
            released = proxy.expire(now)
            for action in released:
                assert isinstance(action, Release)
                model_key = next(k for k, v in kept.items() if v[0] == action.execution_id)
                assert now >= kept[model_key][1] + retain_s, "released before its window passed"
            apply(released)
        assert proxy.retained_bytes <= max_bytes
        assert proxy.retained_bytes == sum(v[2] for v in kept.values() if v[0] in retained)
