"""WaitEstimator: fallback rate, the observed first-token rate, and the wait it predicts."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrybench.control.estimate import WaitEstimator


def observed(times: list[float], tokens: int | list[int] = 1000, *, window_s: float = 60.0) -> WaitEstimator:
    estimator = WaitEstimator(window_s=window_s)
    counts = tokens if isinstance(tokens, list) else [tokens] * len(times)
    for t, n in zip(times, counts, strict=True):
        estimator.observe_first_token(t, n)
    return estimator


# -- no observations --------------------------------------------------------------------------------


def test_no_observations_use_the_fallback_rate() -> None:
    assert WaitEstimator().first_token_rate(0.0) == 1.0
    assert WaitEstimator(fallback_rate_per_s=4.0).first_token_rate(100.0) == 4.0


def test_no_observations_wait_is_ahead_plus_one_own_prefill_at_the_fallback_rate() -> None:
    # With nothing observed the attempt's own prompt is the mean, so its own part is one slot.
    assert WaitEstimator().wait_s(0.0, ahead=0, prompt_tokens=12_000) == 1.0
    assert WaitEstimator().wait_s(0.0, ahead=5, prompt_tokens=12_000) == 6.0
    assert WaitEstimator(fallback_rate_per_s=2.0).wait_s(0.0, ahead=5, prompt_tokens=3_000) == 3.0


# -- the observed rate ------------------------------------------------------------------------------


def test_rate_is_first_tokens_over_time_since_the_first_observation() -> None:
    estimator = observed([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])  # 10 first tokens
    assert estimator.first_token_rate(10.0) == pytest.approx(1.0)
    assert estimator.first_token_rate(20.0) == pytest.approx(0.5)


def test_rate_over_less_than_a_second_uses_a_one_second_span() -> None:
    estimator = observed([0.0, 0.1, 0.2])
    assert estimator.first_token_rate(0.2) == pytest.approx(3.0)
    assert estimator.first_token_rate(0.9) == pytest.approx(3.0)


def test_rate_span_is_capped_at_the_window() -> None:
    estimator = observed([100.0 + i for i in range(30)])  # first observed at 100 s
    # At 160 s: observations at <= 100 s have expired, 29 remain, over at most 60 s.
    assert estimator.first_token_rate(160.0) == pytest.approx(29 / 60)


def test_old_observations_expire_and_the_fallback_returns() -> None:
    estimator = observed([0.0, 1.0, 2.0])
    assert estimator.first_token_rate(61.0) == pytest.approx(1 / 60)  # only the one at 2 s is left
    assert estimator.first_token_rate(62.0) == 1.0  # all expired: the fallback
    assert estimator.wait_s(62.0, ahead=2, prompt_tokens=500) == 3.0  # and the own part is one slot again


def test_a_faster_engine_gives_a_shorter_wait() -> None:
    slow = observed([float(i) for i in range(10)])  # 1 per s
    fast = observed([i / 4 for i in range(40)])  # 4 per s
    assert slow.wait_s(10.0, 10, 1000) > fast.wait_s(10.0, 10, 1000)
    assert fast.wait_s(10.0, 10, 1000) == pytest.approx((10 + 1) / 4)


# -- the wait ---------------------------------------------------------------------------------------


def test_wait_grows_with_ahead_by_one_over_the_rate() -> None:
    estimator = observed([i / 2 for i in range(20)])  # 20 in 10 s: 2 per s
    rate = estimator.first_token_rate(10.0)
    assert rate == pytest.approx(2.0)
    waits = [estimator.wait_s(10.0, ahead, 1000) for ahead in range(6)]
    assert waits == sorted(waits)
    assert len(set(waits)) == len(waits)
    for before, after in itertools.pairwise(waits):
        assert after - before == pytest.approx(1 / rate)


def test_own_part_is_proportional_to_prompt_length() -> None:
    estimator = observed([float(i) for i in range(10)], [1000, 3000] * 5)  # mean 2000 tokens, 1 per s
    assert estimator.wait_s(10.0, 0, 2000) == pytest.approx(1.0)
    assert estimator.wait_s(10.0, 0, 4000) == pytest.approx(2.0)
    assert estimator.wait_s(10.0, 0, 500) == pytest.approx(0.25)
    # The own part adds to the queue part: ahead 3 at 1 per s, plus 2 x the mean prompt.
    assert estimator.wait_s(10.0, 3, 4000) == pytest.approx(5.0)


def test_zero_prompt_tokens_observed_gives_no_own_part() -> None:
    estimator = observed([0.0, 1.0], [0, 0])
    assert estimator.wait_s(2.0, 4, 1000) == pytest.approx(4.0)


@settings(max_examples=150, database=None, deadline=None)
@given(times=st.lists(st.floats(0, 200, allow_nan=False), min_size=1, max_size=30),
       tokens=st.integers(1, 30_000), later=st.floats(0, 59, allow_nan=False),
       ahead=st.integers(0, 500), prompt=st.integers(1, 30_000))
def test_wait_is_linear_in_ahead_and_in_prompt(times: list[float], tokens: int, later: float, ahead: int,
                                                prompt: int) -> None:
    """While observations are in the window (the newest is under 60 s old): linear in both."""
    times = sorted(times)
    estimator = observed(times, tokens)
    now = times[-1] + later
    rate = estimator.first_token_rate(now)
    assert rate > 0
    base = estimator.wait_s(now, 0, prompt)
    assert base > 0
    assert estimator.wait_s(now, ahead, prompt) == pytest.approx(ahead / rate + base)
    assert estimator.wait_s(now, ahead + 1, prompt) > estimator.wait_s(now, ahead, prompt)
    assert estimator.wait_s(now, 0, 2 * prompt) == pytest.approx(2 * base)
