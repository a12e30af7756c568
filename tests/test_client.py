"""The retrying client's state machine (paper Section 3.1, 2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrybench.conditions.config import ClientPolicy
from retrybench.records.runlog import COMPLETED, ERROR, REFUSED_429, REFUSED_503, TIMED_OUT
from retrybench.traffic.client import CallDelivered, CallFailed, ClientAction, RetryingClient, SendAttempt

SEED = 1234
POLICY = ClientPolicy()


def make(policy: ClientPolicy = POLICY, seed: int = SEED) -> RetryingClient:
    return RetryingClient(policy, np.random.default_rng(seed))


def first_backoff(seed: int = SEED, policy: ClientPolicy = POLICY) -> float:
    """What one rng.uniform draw on a fresh generator gives: the client must draw exactly this."""
    return float(np.random.default_rng(seed).uniform(policy.backoff_min_s, policy.backoff_max_s))


def as_send(action: ClientAction) -> SendAttempt:
    assert isinstance(action, SendAttempt), action
    return action


def test_first_attempt_is_sent_now_with_a_deadline_120_s_later() -> None:
    client = make()
    assert client.start_call(7, now=5.0) == SendAttempt(7, 0, 5.0, 125.0)
    assert client.attempts_made(7) == 1
    assert client.outstanding() == 1


@pytest.mark.parametrize("outcome", [TIMED_OUT, REFUSED_503, ERROR])
def test_failure_retries_after_one_uniform_backoff(outcome: str) -> None:
    client = make()
    client.start_call(0, now=0.0)
    send = as_send(client.on_outcome(0, 0, outcome, now=120.0))
    assert send.call_index == 0 and send.attempt_no == 1
    assert POLICY.backoff_min_s <= send.send_s - 120.0 <= POLICY.backoff_max_s
    assert send.send_s == pytest.approx(120.0 + first_backoff())
    assert send.deadline_s == pytest.approx(send.send_s + 120.0)
    assert client.attempts_made(0) == 2


def test_429_with_retry_after_within_cap_retries_at_now_plus_retry_after() -> None:
    client = make()
    client.start_call(0, now=1.0)
    assert client.on_outcome(0, 0, REFUSED_429, now=2.0, retry_after_s=30.0) == SendAttempt(0, 1, 32.0, 152.0)
    # Exactly at the cap is still allowed.
    assert as_send(client.on_outcome(0, 1, REFUSED_429, now=40.0, retry_after_s=120.0)).send_s == 160.0
    # Retry-After waits draw nothing: the next backoff is the generator's first draw.
    send = as_send(client.on_outcome(0, 2, TIMED_OUT, now=280.0))
    assert send.send_s == pytest.approx(280.0 + first_backoff())


def test_429_with_retry_after_above_cap_gives_the_call_up() -> None:
    client = make()
    client.start_call(3, now=0.0)
    assert client.on_outcome(3, 0, REFUSED_429, now=1.0, retry_after_s=120.5) == CallFailed(
        3, 1.0, "retry_after_too_long"
    )
    assert client.outstanding() == 0


def test_429_without_retry_after_uses_the_backoff() -> None:
    client = make()
    client.start_call(0, now=0.0)
    send = as_send(client.on_outcome(0, 0, REFUSED_429, now=1.0))
    assert send.send_s == pytest.approx(1.0 + first_backoff())


def test_four_failed_attempts_exhaust_the_call() -> None:
    client = make()
    send = client.start_call(0, now=0.0)
    for outcome in (TIMED_OUT, REFUSED_503, ERROR):
        send = as_send(client.on_outcome(0, send.attempt_no, outcome, now=send.deadline_s))
    assert send.attempt_no == 3
    assert client.on_outcome(0, 3, TIMED_OUT, now=send.deadline_s) == CallFailed(
        0, send.deadline_s, "attempts_exhausted"
    )
    assert client.attempts_made(0) == 4
    assert client.outstanding() == 0


def test_retries_off_fails_after_one_attempt_even_on_a_long_retry_after() -> None:
    client = make(ClientPolicy(retries=False))
    client.start_call(0, now=0.0)
    client.start_call(1, now=0.0)
    assert client.on_outcome(0, 0, TIMED_OUT, now=120.0) == CallFailed(0, 120.0, "attempts_exhausted")
    # With no attempts left, exhaustion is the reason whatever refused the attempt.
    assert client.on_outcome(1, 0, REFUSED_429, 1.0, retry_after_s=500.0) == CallFailed(
        1, 1.0, "attempts_exhausted"
    )
    assert client.attempts_made(0) == 1


def test_completed_attempt_delivers_the_call() -> None:
    client = make()
    client.start_call(0, now=0.0)
    retry = as_send(client.on_outcome(0, 0, TIMED_OUT, now=120.0))
    assert client.on_outcome(0, 1, COMPLETED, now=retry.send_s + 9.0) == CallDelivered(0, retry.send_s + 9.0)
    assert client.outstanding() == 0


def test_outstanding_counts_unfinished_calls() -> None:
    client = make()
    for i in range(3):
        client.start_call(i, now=float(i))
    client.on_outcome(1, 0, COMPLETED, now=10.0)
    assert client.outstanding() == 2


def test_double_report_and_stale_attempts_raise() -> None:
    client = make()
    client.start_call(0, now=0.0)
    client.on_outcome(0, 0, TIMED_OUT, now=120.0)
    with pytest.raises(ValueError, match="not the outstanding attempt"):
        client.on_outcome(0, 0, TIMED_OUT, now=121.0)
    client.on_outcome(0, 1, COMPLETED, now=130.0)
    with pytest.raises(ValueError, match="already ended"):
        client.on_outcome(0, 1, COMPLETED, now=131.0)
    assert client.outstanding() == 0


def test_bad_reports_raise() -> None:
    client = make()
    client.start_call(0, now=10.0)
    with pytest.raises(ValueError, match="already started"):
        client.start_call(0, now=11.0)
    with pytest.raises(ValueError, match="never started"):
        client.on_outcome(9, 0, TIMED_OUT, now=11.0)
    with pytest.raises(ValueError, match="never started"):
        client.attempts_made(9)
    with pytest.raises(ValueError, match="unknown outcome"):
        client.on_outcome(0, 0, "teapot", now=11.0)
    with pytest.raises(ValueError, match="before the attempt was sent"):
        client.on_outcome(0, 0, TIMED_OUT, now=9.0)
    with pytest.raises(ValueError, match="retry_after_s"):
        client.on_outcome(0, 0, REFUSED_429, now=11.0, retry_after_s=-1.0)
    assert client.outstanding() == 1  # nothing above changed the call


def run_script(client: RetryingClient, calls: int) -> list[ClientAction]:
    """Each call times out at every deadline until it ends."""
    actions: list[ClientAction] = []
    for i in range(calls):
        action: ClientAction = client.start_call(i, now=float(i))
        actions.append(action)
        while isinstance(action, SendAttempt):
            action = client.on_outcome(i, action.attempt_no, TIMED_OUT, now=action.deadline_s)
            actions.append(action)
    return actions


def test_same_seed_same_actions() -> None:
    assert run_script(make(seed=5), 20) == run_script(make(seed=5), 20)
    assert run_script(make(seed=5), 20) != run_script(make(seed=6), 20)


failure = st.one_of(
    st.tuples(st.sampled_from([TIMED_OUT, REFUSED_503, ERROR]), st.none()),
    st.tuples(
        st.just(REFUSED_429),
        st.none() | st.floats(POLICY.backoff_min_s, 2 * POLICY.retry_after_cap_s, allow_nan=False),
    ),
)


@given(
    retries=st.booleans(),
    max_retries=st.integers(0, 5),
    seed=st.integers(0, 2**32 - 1),
    steps=st.lists(st.tuples(failure, st.floats(0.0, 200.0, allow_nan=False)), min_size=6, max_size=12),
)
def test_failures_never_exceed_max_attempts(
    retries: bool, max_retries: int, seed: int, steps: list[tuple[tuple[str, float | None], float]]
) -> None:
    policy = ClientPolicy(retries=retries, max_retries=max_retries)
    client = make(policy, seed)
    send = client.start_call(0, now=0.0)
    sends, ends = [send], 0
    for (outcome, retry_after), delay in steps:
        now = send.send_s + delay
        if ends:
            with pytest.raises(ValueError):
                client.on_outcome(0, send.attempt_no, outcome, now, retry_after)
            continue
        action = client.on_outcome(0, send.attempt_no, outcome, now, retry_after)
        if isinstance(action, SendAttempt):
            assert action.attempt_no == send.attempt_no + 1
            assert action.send_s >= now + policy.backoff_min_s
            assert action.deadline_s == action.send_s + policy.attempt_timeout_s
            if outcome == REFUSED_429 and retry_after is not None:
                assert action.send_s == now + retry_after
            else:
                assert action.send_s <= now + policy.backoff_max_s
            send = action
            sends.append(send)
        else:
            assert isinstance(action, CallFailed) and action.at_s == now
            ends += 1
        assert len(sends) <= policy.max_attempts
    assert ends == 1  # 6+ failures always outlast max_attempts <= 6
    assert client.outstanding() == 0
    assert client.attempts_made(0) == len(sends)
