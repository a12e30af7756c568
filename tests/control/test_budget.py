"""RetryBudget: the sliding window, the ratio, what is counted, and argument checks."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrybench.control.budget import RetryBudget


def budget_with_firsts(n: int, *, ratio: float = 0.1, window_s: float = 60.0, at: float = 0.0) -> RetryBudget:
    budget = RetryBudget(ratio, window_s)
    for _ in range(n):
        budget.first_attempt(at)
    return budget


# -- defaults and state -----------------------------------------------------------------------------


def test_defaults_are_the_papers_ten_percent_over_sixty_seconds() -> None:
    budget = RetryBudget()
    assert budget.ratio == 0.1
    assert budget.window_s == 60.0
    assert budget.state(0.0) == (0, 0)


def test_state_counts_first_attempts_and_admitted_retries() -> None:
    budget = budget_with_firsts(20, at=1.0)
    assert budget.state(1.0) == (20, 0)
    assert budget.try_retry(2.0)
    assert budget.state(2.0) == (20, 1)
    budget.first_attempt(3.0)
    assert budget.state(3.0) == (21, 1)


# -- the ratio --------------------------------------------------------------------------------------


def test_no_first_attempts_admits_no_retry() -> None:
    budget = RetryBudget(0.1, 60.0)
    assert not budget.try_retry(0.0)
    assert budget.state(0.0) == (0, 0)


def test_ten_first_attempts_admit_exactly_one_retry() -> None:
    budget = budget_with_firsts(10)
    assert budget.try_retry(1.0)
    assert not budget.try_retry(1.0)
    assert not budget.try_retry(2.0)
    assert budget.state(2.0) == (10, 1)


def test_nine_first_attempts_admit_none() -> None:
    budget = budget_with_firsts(9)
    assert not budget.try_retry(1.0)
    assert budget.state(1.0) == (9, 0)


def test_twenty_first_attempts_admit_exactly_two_retries() -> None:
    budget = budget_with_firsts(20)
    assert [budget.try_retry(1.0) for _ in range(4)] == [True, True, False, False]
    assert budget.state(1.0) == (20, 2)


def test_ratio_zero_admits_nothing_and_ratio_one_admits_one_per_first() -> None:
    zero = budget_with_firsts(100, ratio=0.0)
    assert not zero.try_retry(1.0)
    one = budget_with_firsts(3, ratio=1.0)
    assert [one.try_retry(1.0) for _ in range(4)] == [True, True, True, False]


def test_refused_retries_are_not_counted() -> None:
    budget = budget_with_firsts(10)
    assert budget.try_retry(1.0)
    for _ in range(50):
        assert not budget.try_retry(1.5)
    assert budget.state(2.0) == (10, 1)  # the 50 refusals left no trace
    # Ten more first attempts make room for exactly one more retry; had the refusals counted, none.
    for _ in range(10):
        budget.first_attempt(3.0)
    assert budget.try_retry(4.0)
    assert not budget.try_retry(4.0)
    assert budget.state(4.0) == (20, 2)


# -- the window edges -------------------------------------------------------------------------------


def test_a_first_attempt_exactly_window_old_has_expired() -> None:
    budget = budget_with_firsts(1, at=0.0)
    assert budget.state(60.0) == (0, 0)


def test_a_first_attempt_just_inside_the_window_counts() -> None:
    budget = budget_with_firsts(1, at=0.0)
    assert budget.state(math.nextafter(60.0, 0.0)) == (1, 0)


def test_window_edge_decides_whether_a_retry_is_admitted() -> None:
    inside = budget_with_firsts(10, at=0.0)
    assert inside.try_retry(math.nextafter(60.0, 0.0))  # the ten still count
    expired = budget_with_firsts(10, at=0.0)
    assert not expired.try_retry(60.0)  # the ten are exactly 60 s old: gone
    assert expired.state(60.0) == (0, 0)


def test_admitted_retries_expire_with_the_window() -> None:
    budget = budget_with_firsts(10, at=0.0)
    for _ in range(10):
        budget.first_attempt(30.0)
    assert budget.try_retry(30.0)
    assert budget.try_retry(30.0)  # 20 firsts: two
    assert not budget.try_retry(59.0)
    # At 60 s the first ten expire (10 firsts left), and the two retries from 30 s still count.
    assert budget.state(60.0) == (10, 2)
    assert not budget.try_retry(60.0)
    # At 90 s everything from 30 s expired too.
    assert budget.state(90.0) == (0, 0)


def test_a_custom_window() -> None:
    budget = budget_with_firsts(10, window_s=5.0, at=0.0)
    assert budget.state(4.999) == (10, 0)
    assert budget.state(5.0) == (0, 0)


# -- argument checks --------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [-0.1, -1.0, 10.000001, 11.0, float("nan"), float("inf")])
def test_invalid_ratio_raises(ratio: float) -> None:
    with pytest.raises(ValueError, match="budget ratio must be in \\[0, 10\\]"):
        RetryBudget(ratio, 60.0)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 10.0])
def test_ratio_bounds_are_inclusive(ratio: float) -> None:
    assert RetryBudget(ratio, 60.0).ratio == ratio


@pytest.mark.parametrize("window_s", [0.0, -1.0, -60.0, float("-inf")])
def test_invalid_window_raises(window_s: float) -> None:
    with pytest.raises(ValueError, match="budget window must be > 0 s"):
        RetryBudget(0.1, window_s)


def test_nan_window_raises() -> None:
    """Once a bug: `window_s <= 0` is False for NaN, so a NaN window was accepted and nothing expired."""
    with pytest.raises(ValueError, match="budget window"):
        RetryBudget(0.1, float("nan"))


# -- property: the admitted count is the rule, event by event ----------------------------------------


@settings(max_examples=150, database=None, deadline=None)
@given(ratio=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 2.0]),
       window_s=st.sampled_from([1.0, 5.0, 60.0]),
       events=st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=60))
def test_admitted_retries_never_exceed_ratio_of_firsts_in_window(
        ratio: float, window_s: float, events: list[tuple[bool, int]]) -> None:
    budget = RetryBudget(ratio, window_s)
    now = 0.0
    firsts: list[float] = []
    admitted: list[float] = []
    for is_first, step in events:
        now += step / 4
        if is_first:
            budget.first_attempt(now)
            firsts.append(now)
        else:
            in_firsts = sum(1 for t in firsts if t > now - window_s)
            in_retries = sum(1 for t in admitted if t > now - window_s)
            expected = in_retries + 1 <= ratio * in_firsts
            assert budget.try_retry(now) == expected
            if expected:
                admitted.append(now)
        assert budget.state(now) == (sum(1 for t in firsts if t > now - window_s),
                                     sum(1 for t in admitted if t > now - window_s))
