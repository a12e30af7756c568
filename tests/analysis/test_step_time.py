"""Step-time attribution (Section 5.1) on hand-made engine traces of a few steps."""

from __future__ import annotations

from typing import Any

import pytest

from retrybench.analysis.step_time import RULES, StepCostFit, fit_step_costs, step_time_shares

FIT = StepCostFit(fixed_s=0.01, per_execution_s=0.002, per_token_s=1e-5, r2=1.0)
PROPORTIONAL = ("tokens", "attention", "fitted_cost")


def step(
    sid: int,
    start_s: float,
    duration_s: float,
    prompt: dict[int, int] | None = None,
    decode: list[int] | None = None,
    cached: dict[int, int] | None = None,
) -> dict[str, Any]:
    return {
        "t": start_s, "event": "step", "step": sid, "start_s": start_s, "end_s": start_s + duration_s,
        "prompt_tokens": {str(k): v for k, v in (prompt or {}).items()}, "decode": list(decode or []),
        "cached_tokens": {str(k): v for k, v in (cached or {}).items()}, "preempted": [],
    }


def aborted(eid: int, t: float = 100.0) -> dict[str, Any]:
    return {"t": t, "event": "aborted", "execution": eid, "computed_prompt_tokens": 0,
            "in_flight_prompt_tokens": 0, "unscheduled": False}


def linear(fit: StepCostFit, n_exec: int, n_tokens: int) -> float:
    return fit.fixed_s + fit.per_execution_s * n_exec + fit.per_token_s * n_tokens


def test_fit_recovers_known_coefficients() -> None:
    shapes: list[tuple[dict[int, int], list[int]]] = [
        ({1: 100}, []), ({1: 50, 2: 200}, [3]), ({}, [1, 2, 3, 4]), ({5: 1000}, [1])]
    events = []
    t = 0.0
    for sid, (prompt, decode) in enumerate(shapes):
        d = linear(FIT, len(prompt) + len(decode), sum(prompt.values()) + len(decode))
        events.append(step(sid, t, d, prompt, decode))
        t += d
    fit = fit_step_costs(events)
    assert fit.fixed_s == pytest.approx(FIT.fixed_s)
    assert fit.per_execution_s == pytest.approx(FIT.per_execution_s)
    assert fit.per_token_s == pytest.approx(FIT.per_token_s)
    assert fit.r2 == pytest.approx(1.0)


def test_fit_clips_negative_coefficients() -> None:
    # Longer steps with fewer tokens: a free fit gives a negative per-token cost.
    events = [step(0, 0.0, 0.05, {1: 10}), step(1, 1.0, 0.04, {1: 500}), step(2, 2.0, 0.03, {1: 900}),
              step(3, 3.0, 0.02, {1: 2000})]
    fit = fit_step_costs(events)
    assert min(fit.fixed_s, fit.per_execution_s, fit.per_token_s) >= 0.0
    assert fit.per_token_s == 0.0


def test_only_execution_aborted_gives_full_share_under_proportional_rules() -> None:
    events = [step(0, 0.0, linear(FIT, 1, 200), {1: 200}), step(1, 1.0, linear(FIT, 1, 300), {1: 300}),
              aborted(1)]
    shares = step_time_shares(events, FIT)
    assert shares.total_s == pytest.approx(linear(FIT, 1, 200) + linear(FIT, 1, 300))
    for rule in PROPORTIONAL:
        assert shares.aborted_share_pct[rule] == pytest.approx(100.0)
        assert shares.aborted_prompt_share_pct[rule] == pytest.approx(100.0)
    # Paying the fixed cost too makes the aborted execution pay the whole (exactly fitted) step.
    assert shares.aborted_share_pct["aborted_pay_fixed"] == pytest.approx(100.0)
    assert shares.high_pct == pytest.approx(100.0)


def test_equal_tokens_split_evenly() -> None:
    shares = step_time_shares([step(0, 0.0, 0.1, {1: 100, 2: 100}), aborted(1)], FIT)
    for rule in PROPORTIONAL:
        assert shares.aborted_share_pct[rule] == pytest.approx(50.0)


def test_attention_favours_long_context_chunks() -> None:
    # Execution 1 has 1,000 tokens of context before the second step; execution 2 starts fresh.
    events = [step(0, 0.0, 0.1, {1: 1000}), step(1, 1.0, 0.1, {1: 100, 2: 100}), aborted(1)]
    shares = step_time_shares(events, FIT, start_s=1.0)
    assert shares.aborted_share_pct["tokens"] == pytest.approx(50.0)
    weight_1, weight_2 = 100 * 1000 + 100 * 101 / 2, 100 * 101 / 2
    assert shares.aborted_share_pct["attention"] == pytest.approx(100.0 * weight_1 / (weight_1 + weight_2))


def test_cached_tokens_count_as_context() -> None:
    events = [step(0, 0.0, 0.1, {1: 100, 2: 100}, cached={1: 4000, 2: 0}), aborted(1)]
    assert step_time_shares(events, FIT).aborted_share_pct["attention"] > 90.0


def test_marginal_shares_sum_to_less_than_total() -> None:
    events = [step(0, 0.0, linear(FIT, 2, 300), {1: 100, 2: 200}), step(1, 1.0, linear(FIT, 2, 2), decode=[1, 2]),
              aborted(1), aborted(2)]
    shares = step_time_shares(events, FIT)
    assert shares.aborted_share_pct["tokens"] == pytest.approx(100.0)
    assert 0.0 < shares.aborted_share_pct["marginal"] < 100.0


def test_aborted_pay_fixed_is_at_least_fitted_cost() -> None:
    events = [step(0, 0.0, 0.05, {1: 100, 2: 900}), step(1, 1.0, 0.03, {1: 50}, [2, 3]),
              step(2, 2.0, 0.02, decode=[1, 2, 3]), aborted(1)]
    shares = step_time_shares(events, FIT)
    assert shares.aborted_share_pct["aborted_pay_fixed"] >= shares.aborted_share_pct["fitted_cost"]
    assert shares.aborted_share_pct["aborted_pay_fixed"] >= shares.aborted_share_pct["marginal"]
    assert shares.high_pct == max(shares.aborted_prompt_share_pct.values())
    assert shares.low_pct <= shares.high_pct


def test_execution_without_aborted_event_is_never_charged() -> None:
    events = [step(0, 0.0, 0.05, {2: 500}), step(1, 1.0, 0.02, decode=[2]),
              {"t": 0.5, "event": "abort_requested", "execution": 2}]
    shares = step_time_shares(events, FIT)
    assert set(shares.aborted_share_pct) == set(RULES)
    assert all(v == 0.0 for v in shares.aborted_share_pct.values())
    assert all(v == 0.0 for v in shares.aborted_prompt_share_pct.values())


def test_decode_of_aborted_execution_is_not_prompt_work() -> None:
    events = [step(0, 0.0, 0.02, decode=[1, 2]), aborted(1)]
    shares = step_time_shares(events, FIT)
    assert shares.aborted_share_pct["tokens"] == pytest.approx(50.0)
    assert all(v == 0.0 for v in shares.aborted_prompt_share_pct.values())


def test_window_filters_steps_by_start() -> None:
    events = [step(0, 0.0, 0.1, {1: 100}), step(1, 1.0, 0.2, {2: 100}), step(2, 2.0, 0.4, {1: 100}), aborted(1)]
    shares = step_time_shares(events, FIT, start_s=1.0, end_s=2.0)
    assert shares.total_s == pytest.approx(0.2)
    assert shares.aborted_share_pct["tokens"] == 0.0
    assert step_time_shares(events, FIT, start_s=2.0).aborted_share_pct["tokens"] == pytest.approx(100.0)
