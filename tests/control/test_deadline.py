"""Deadline propagation in the proxy's core: the deadline headers, the policy keys, the estimate of the
last token, and what the core does once an execution's deadline passes (beyond the paper)."""

from __future__ import annotations

import pytest

from retrybench.conditions.config import ConfigError, ProxyPolicy
from retrybench.control.deadline import DeadlineHeaderError, forward_timeout_ms, timeout_from_headers
from retrybench.control.estimate import WaitEstimator
from retrybench.control.proxy import Attach, AttemptIn, Cancel, Create, Drop, Notify, ProxyCore, Refuse, SetTimer

pytestmark = pytest.mark.beyond


class Headers(dict[str, str]):
    """Case-insensitive look-up, as aiohttp's and httpx's headers do it."""

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        lowered = {key.lower(): value for key, value in self.items()}
        return lowered.get(name.lower(), default)


def attempt(call: int, no: int = 0, deadline_s: float | None = None, max_tokens: int = 300) -> AttemptIn:
    return AttemptIn(call, no, f"call-{call}", 12_000, max_tokens, deadline_s)


def core(**policy: object) -> ProxyCore:
    return ProxyCore(ProxyPolicy(**{"deadline_propagation": True, **policy}))  # type: ignore[arg-type]


# -- the headers ---------------------------------------------------------------------------------------


def test_request_timeout_ms_is_read_first_in_milliseconds() -> None:
    headers = Headers({"request-timeout-ms": "2500", "x-stainless-timeout": "600"})
    assert timeout_from_headers(headers, stream=True) == 2.5


def test_the_stainless_timeout_is_seconds_and_the_read_timeout_only_for_whole_responses() -> None:
    assert timeout_from_headers(Headers({"X-Stainless-Timeout": "600.0"}), stream=True) == 600.0
    read = Headers({"x-stainless-read-timeout": "60"})
    assert timeout_from_headers(read, stream=False) == 60.0
    assert timeout_from_headers(read, stream=True) is None  # a per-read timeout bounds no stream
    assert timeout_from_headers(Headers(), stream=False) is None


@pytest.mark.parametrize("value", ["soon", "", "-5", "0", "nan", "inf", "1e12"])
def test_a_bad_deadline_header_is_refused_naming_the_header(value: str) -> None:
    with pytest.raises(DeadlineHeaderError, match="Request-Timeout-Ms must be") as caught:
        timeout_from_headers(Headers({"Request-Timeout-Ms": value}), stream=False)
    assert caught.value.header == "Request-Timeout-Ms"


def test_the_time_left_is_forwarded_in_wall_milliseconds() -> None:
    assert forward_timeout_ms(130.0, 100.0) == 30_000
    assert forward_timeout_ms(130.0, 100.0, time_scale=0.1) == 3_000
    assert forward_timeout_ms(100.0, 130.0) == 1  # passed: the least a header can say


# -- the policy keys --------------------------------------------------------------------------------------


def test_the_deadline_keys_are_off_by_default() -> None:
    policy = ProxyPolicy()
    assert (policy.deadline_propagation, policy.default_deadline_s, policy.deadline_admission) == (False, None, False)


@pytest.mark.parametrize("keys, message", [
    ({"deadline_propagation": True, "default_deadline_s": 0.0}, r"default_deadline_s must be in \(0, 604800\]"),
    ({"deadline_admission": True}, "need deadline_propagation"),
    ({"default_deadline_s": 30.0}, "need deadline_propagation"),
])
def test_bad_deadline_keys_are_refused_by_name(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ProxyPolicy(**keys)  # type: ignore[arg-type]


# -- the estimate of the last token ---------------------------------------------------------------------


def test_the_last_token_adds_the_observed_decode_pace() -> None:
    estimator = WaitEstimator()
    assert estimator.decode_s_per_token(0.0) == 0.0  # nothing observed: the first token's wait alone
    estimator.observe_first_token(10.0, 12_000)
    estimator.observe_completion(20.0, 10.0, 101)  # 100 tokens after the first in 10 s
    assert estimator.decode_s_per_token(20.0) == pytest.approx(0.1)
    first = estimator.wait_s(20.0, 4, 12_000)
    assert estimator.last_token_s(20.0, 4, 12_000, 301) == pytest.approx(first + 30.0)
    assert estimator.decode_s_per_token(200.0) == 0.0  # out of the window


# -- the core -----------------------------------------------------------------------------------------------


def test_with_propagation_off_a_deadline_changes_nothing() -> None:
    proxy = ProxyCore(ProxyPolicy())
    assert proxy.on_attempt(attempt(0, deadline_s=5.0), 0.0) == Create(0, dispatch=True)
    assert proxy.on_deadline(0, 10.0) == []
    assert proxy.executions[0].state == "live"


def test_a_queued_execution_is_dropped_once_its_deadline_passes() -> None:
    proxy = core(max_outstanding=1)
    assert proxy.on_attempt(attempt(0, deadline_s=100.0), 0.0) == Create(0, dispatch=True, expire_at_s=100.0)
    assert proxy.on_attempt(attempt(1, deadline_s=30.0), 1.0) == Create(1, dispatch=False, expire_at_s=30.0)
    assert proxy.on_deadline(1, 29.0) == []  # early: nothing
    actions = proxy.on_deadline(1, 30.0)
    assert actions == [Notify((1, 0), "refused", status=503), Drop(1)]
    assert proxy.executions[1].state == "dropped" and proxy.waiting == 0
    assert proxy.counts.deadline_dropped == 1


def test_a_running_execution_is_cancelled_at_its_deadline_with_cancellation_off() -> None:
    proxy = core(cancellation="off")
    proxy.on_attempt(attempt(0, deadline_s=120.0), 0.0)
    assert proxy.on_subscriber_left((0, 0), 120.0) == []  # off: a disconnect alone changes nothing
    assert proxy.on_deadline(0, 120.0) == [Cancel(0)]
    assert proxy.executions[0].state == "cancelled"
    assert proxy.counts.deadline_cancelled == 1


def test_a_running_execution_waits_for_its_latest_subscribers_deadline() -> None:
    proxy = core(cancellation="off", coalescing=True)
    proxy.on_attempt(attempt(0, 0, deadline_s=120.0), 0.0)
    assert proxy.on_attempt(attempt(0, 1, deadline_s=250.0), 130.0) == Attach(0, False, expire_at_s=250.0)
    assert proxy.on_subscriber_left((0, 0), 120.0) == []
    assert proxy.on_deadline(0, 120.0) == []  # the retry's deadline is later
    assert proxy.on_deadline(0, 250.0) == [Notify((0, 1), "refused", status=503), Cancel(0)]


def test_a_subscriber_without_a_deadline_keeps_the_execution() -> None:
    proxy = core(cancellation="off", coalescing=True)
    proxy.on_attempt(attempt(0, 0, deadline_s=120.0), 0.0)
    assert proxy.on_attempt(attempt(0, 1), 10.0) == Attach(0, False, expire_at_s=None)
    assert proxy.on_deadline(0, 120.0) == []
    assert proxy.executions[0].state == "live"


def test_the_default_deadline_counts_from_arrival() -> None:
    proxy = core(default_deadline_s=30.0)
    assert proxy.on_attempt(attempt(0), 5.0) == Create(0, dispatch=True, expire_at_s=35.0)


def test_deferred_cancellation_counts_its_deferral_from_the_deadline() -> None:
    proxy = core(cancellation="deferred", defer_s=10.0, coalescing=True)
    proxy.on_attempt(attempt(0, 0, deadline_s=120.0), 0.0)
    assert proxy.on_deadline(0, 120.0) == [Notify((0, 0), "refused", status=503), SetTimer(130.0, 0)]
    retry = proxy.on_attempt(attempt(0, 1, deadline_s=245.0), 125.0)  # within the deferral: it attaches
    assert retry == Attach(0, False, expire_at_s=245.0)
    assert proxy.on_timer(0, 130.0) == []  # a subscriber came back
    assert proxy.on_deadline(0, 245.0) == [Notify((0, 1), "refused", status=503), SetTimer(255.0, 0)]
    assert proxy.on_timer(0, 255.0) == [Cancel(0)]
    assert proxy.counts.deadline_cancelled == 0 and proxy.counts.executions_cancelled == 1


def test_admission_refuses_a_call_that_cannot_finish_before_its_deadline() -> None:
    proxy = core(deadline_admission=True)
    # Observed: a first token per second for 60 s, then a completion at 0.1 s per token.
    for second in range(60):
        proxy.estimator.observe_first_token(float(second), 12_000)
    proxy.estimator.observe_completion(60.0, 50.0, 101)
    # 20 waiting, 1 first token a second: about 21 s to the first token, then 299 tokens at 0.1 s.
    assert proxy.on_attempt(attempt(0, deadline_s=60.0 + 40.0), 60.0, engine_waiting=20) == Refuse(503)
    assert proxy.counts.deadline_admission_refused == 1
    assert isinstance(proxy.on_attempt(attempt(1, deadline_s=60.0 + 60.0), 60.0, engine_waiting=20), Create)
    assert isinstance(proxy.on_attempt(attempt(2), 60.0, engine_waiting=20), Create)  # no deadline: admitted


def test_admission_learns_the_decode_pace_from_completions() -> None:
    proxy = core(deadline_admission=True)
    proxy.on_attempt(attempt(0, deadline_s=1000.0, max_tokens=201), 0.0)
    proxy.on_engine_event(0, "first_token", 2.0)
    proxy.on_engine_event(0, "completed", 12.0)
    assert proxy.estimator.decode_s_per_token(12.0) == pytest.approx(0.05)
