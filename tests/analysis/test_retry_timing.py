"""Retry timing (Section 5.2) and the prompt-token counter check (Section 5.3) on hand-made RunLogs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from retrybench.analysis.retry_timing import counter_check, retry_timing
from retrybench.conditions.config import ClientPolicy, ProxyPolicy, WorkloadSpec
from retrybench.engine.profiles import profile_for
from retrybench.records.runlog import (
    FATE_CANCELLED,
    FATE_COMPLETED,
    REFUSED_429,
    TIMED_OUT,
    AttemptOutcome,
    AttemptRecord,
    ExecutionRecord,
    Fate,
    QueueSamples,
    RunLog,
)
from retrybench.sim.run import simulate
from retrybench.traffic.workload import generate_trace

META: dict[str, Any] = {
    "chat": 2.78,
    "pulse_start_s": 120.0,
    "pulse_end_s": 227.0,
    "hold_end_s": 947.0,
    "attempt_timeout_s": 120.0,
    "delivery_horizon_s": 840.0,
}


class Log:
    """Attempts and the executions they create, one call at a time."""

    def __init__(self) -> None:
        self.attempts: list[AttemptRecord] = []
        self.executions: list[ExecutionRecord] = []

    def attempt(self, call: int, no: int, sent_s: float, execution_id: int | None = None, *,
                attached: bool = False, outcome: AttemptOutcome = TIMED_OUT) -> Log:
        self.attempts.append(AttemptRecord(call_index=call, attempt_no=no, sent_s=sent_s, ended_s=sent_s + 120.0,
                                           outcome=outcome, execution_id=execution_id, attached=attached))
        return self

    def execution(self, call: int, no: int, created_s: float, *, scheduled_s: float | None = None,
                  aborted_s: float | None = None, first_token_s: float | None = None, prompt_tokens: int = 12000,
                  fate: Fate = FATE_CANCELLED) -> int:
        """Add an execution; returns its id."""
        eid = len(self.executions)
        self.executions.append(ExecutionRecord(
            execution_id=eid, call_index=call, attempt_no=no, created_s=created_s, accepted_s=created_s,
            refused_s=None, first_scheduled_s=scheduled_s, first_token_s=first_token_s, finished_s=None,
            abort_requested_s=None if aborted_s is None else aborted_s - 0.05, aborted_s=aborted_s, fate=fate,
            prompt_tokens=prompt_tokens, computed_prompt_tokens=prompt_tokens))
        return eid

    def retry(self, call: int, no: int, sent_s: float, **kwargs: Any) -> Log:
        """A retry that creates its own execution."""
        return self.attempt(call, no, sent_s, self.execution(call, no, sent_s, **kwargs))

    def build(self, samples: QueueSamples | None = None, **meta: Any) -> RunLog:
        return RunLog(meta={**META, **meta}, calls=[], attempts=list(self.attempts),
                      executions=list(self.executions), samples=samples or QueueSamples(), end_s=1787.0)


def paper_example() -> Log:
    """First attempt sent at 1, its execution aborted at 121; the retry sent at 122 is first scheduled at
    241.5, half a second before its 242-s deadline, and aborted 0.7 s later."""
    log = Log()
    log.attempt(0, 0, 1.0, log.execution(0, 0, 1.0, scheduled_s=100.0, aborted_s=121.0))
    return log.retry(0, 1, 122.0, scheduled_s=241.5, aborted_s=242.2)


def test_the_paper_example() -> None:
    timing = retry_timing(paper_example().build())
    assert timing.retries == 1
    assert timing.never_scheduled_pct == 0.0
    assert timing.first_scheduled_after_predecessor_abort_median_s == pytest.approx(120.5)
    assert timing.time_left_at_first_step_median_s == pytest.approx(0.5)
    assert timing.time_left_at_first_step_p90_s == pytest.approx(0.5)
    assert timing.abort_after_first_step_median_s == pytest.approx(0.7)


def test_attached_and_refused_retries_are_not_counted() -> None:
    log = paper_example()
    log.attempt(0, 2, 243.0, execution_id=1, attached=True)  # joined execution 1, which attempt 1 created
    log.attempt(0, 3, 250.0, outcome=REFUSED_429)  # refused by the budget: no execution
    assert retry_timing(log.build()) == retry_timing(paper_example().build())


def test_never_scheduled_percentage() -> None:
    log = paper_example()
    log.retry(1, 1, 130.0, scheduled_s=200.0)
    log.retry(2, 1, 140.0, scheduled_s=None, aborted_s=260.0)  # aborted in the queue: not scheduled
    log.retry(3, 1, 150.0)
    timing = retry_timing(log.build())
    assert timing.retries == 4
    assert timing.never_scheduled_pct == pytest.approx(50.0)
    # Only the scheduled ones enter the time left: 0.5 (call 0) and 50 (call 1).
    assert timing.time_left_at_first_step_median_s == pytest.approx(25.25)


def test_after_abort_needs_an_aborted_predecessor() -> None:
    log = Log()
    log.attempt(0, 0, 0.0, log.execution(0, 0, 0.0, scheduled_s=10.0, fate=FATE_COMPLETED))  # orphaned, not aborted
    log.retry(0, 1, 121.0, scheduled_s=230.0)
    log.attempt(1, 0, 5.0, outcome=REFUSED_429)  # no predecessor execution at all
    log.retry(1, 1, 126.0, scheduled_s=240.0)
    timing = retry_timing(log.build())
    assert timing.retries == 2
    assert math.isnan(timing.first_scheduled_after_predecessor_abort_median_s)
    assert timing.time_left_at_first_step_median_s == pytest.approx(8.5)  # 11 and 6
    assert math.isnan(timing.time_left_at_first_step_p90_s)  # none was aborted
    assert math.isnan(timing.abort_after_first_step_median_s)


def test_p90_is_over_aborted_scheduled_retries_only() -> None:
    log = Log()
    for k in range(10):  # aborted, with 0..9 s left at the first step
        log.retry(k, 1, 100.0, scheduled_s=220.0 - k, aborted_s=220.5)
    for k in range(10, 15):  # not aborted, with 100 s left: in the median, not in the p90
        log.retry(k, 2, 100.0, scheduled_s=120.0)
    timing = retry_timing(log.build())
    assert timing.retries == 15
    assert timing.time_left_at_first_step_p90_s == pytest.approx(8.1)  # linear interpolation
    assert timing.time_left_at_first_step_median_s == pytest.approx(7.0)
    assert timing.abort_after_first_step_median_s == pytest.approx(5.0)


def test_empty_populations_give_nan() -> None:
    log = Log()
    log.attempt(0, 0, 0.0, log.execution(0, 0, 0.0, scheduled_s=1.0, fate=FATE_COMPLETED))
    timing = retry_timing(log.build())
    assert timing.retries == 0
    for value in (timing.never_scheduled_pct, timing.first_scheduled_after_predecessor_abort_median_s,
                  timing.time_left_at_first_step_median_s, timing.time_left_at_first_step_p90_s,
                  timing.abort_after_first_step_median_s):
        assert math.isnan(value)
    check = counter_check(Log().build())
    assert (check.prompt_counter_increase, check.predicted_increase, check.admission_increase) == (0, 0, 0)
    assert math.isnan(check.rule_error_pct)
    assert math.isnan(check.gap_pct)


def series(events: Sequence[tuple[float, int]], n: int = 1800) -> list[int]:
    """A counter sampled as the simulator does: samples[t] includes every event at a time <= t."""
    return [sum(tokens for at, tokens in events if at <= t) for t in range(n)]


def test_counter_rule_exact_match_gives_zero_error() -> None:
    log = Log()
    # First tokens at 226.5 and exactly 227 fall before the window (sample 227 already holds them);
    # 227.01, 500.3 and exactly 947 fall inside; 947.5 after; an execution without a first token never counts.
    first_tokens = {226.5: 11000, 227.0: 12000, 227.01: 13000, 500.3: 14000, 947.0: 15000, 947.5: 16000}
    for k, (at, tokens) in enumerate(first_tokens.items()):
        log.execution(k, 0, at - 10.0, scheduled_s=at - 1.0, first_token_s=at, prompt_tokens=tokens)
    log.execution(9, 0, 300.0, scheduled_s=301.0, aborted_s=302.0, prompt_tokens=17000)
    admissions = [(at - 1.0, tokens) for at, tokens in first_tokens.items()] + [(301.0, 17000)]
    samples = QueueSamples(prompt_tokens_total=series(list(first_tokens.items())),
                           prefix_cache_queries_total=series(admissions))
    check = counter_check(log.build(samples))
    assert check.prompt_counter_increase == check.predicted_increase == 13000 + 14000 + 15000
    assert check.rule_error_pct == 0.0
    # Admitted in the hold: at 499.3, 946.0, 946.5 and 301 (the one aborted before its first token).
    assert check.admission_increase == 14000 + 15000 + 16000 + 17000
    assert check.gap_pct == pytest.approx(100.0 * (62000 - 42000) / 62000)


def test_gap_and_rule_error() -> None:
    log = Log()
    log.execution(0, 0, 300.0, scheduled_s=301.0, first_token_s=302.0, prompt_tokens=500)
    samples = QueueSamples(prompt_tokens_total=series([(302.0, 400)]),
                           prefix_cache_queries_total=series([(301.0, 1000)]))
    check = counter_check(log.build(samples))
    assert (check.prompt_counter_increase, check.predicted_increase, check.admission_increase) == (400, 500, 1000)
    assert check.gap_pct == pytest.approx(60.0)
    assert check.rule_error_pct == pytest.approx(20.0)


def test_sample_indices_are_clamped_to_the_run() -> None:
    log = Log()
    log.execution(0, 0, 300.0, scheduled_s=301.0, first_token_s=302.0, prompt_tokens=700)
    log.execution(1, 0, 600.0, scheduled_s=601.0, first_token_s=602.0, prompt_tokens=900)  # after the last sample
    samples = QueueSamples(prompt_tokens_total=series([(302.0, 700)], n=500),
                           prefix_cache_queries_total=series([(301.0, 700)], n=500))
    check = counter_check(log.build(samples))
    assert (check.prompt_counter_increase, check.predicted_increase, check.admission_increase) == (700, 700, 700)
    assert check.rule_error_pct == 0.0
    assert check.gap_pct == 0.0


def test_simulated_run_counters_follow_the_rule() -> None:
    workload = WorkloadSpec(chat_calls_per_s=2.8, base_s=20, pulse_s=30, hold_s=60)
    meta = {"chat": 2.8, "pulse_start_s": 20.0, "pulse_end_s": 50.0, "hold_end_s": 110.0,
            "attempt_timeout_s": 20.0, "delivery_horizon_s": 840.0}
    log = simulate(profile_for("qwen2.5-7b-instruct"), generate_trace(workload, 1).calls,
                   client=ClientPolicy(attempt_timeout_s=20), proxy=ProxyPolicy(cancellation="immediate"),
                   seed=1, meta=meta)
    check = counter_check(log)
    assert check.predicted_increase > 0
    assert check.rule_error_pct < 1.0
    assert check.gap_pct >= 0.0
    timing = retry_timing(log)
    assert timing.retries > 0
    assert 0.0 <= timing.never_scheduled_pct <= 100.0
    medians = (timing.first_scheduled_after_predecessor_abort_median_s, timing.time_left_at_first_step_median_s,
               timing.time_left_at_first_step_p90_s, timing.abort_after_first_step_median_s)
    assert all(math.isfinite(v) for v in medians)  # retries scheduled, predecessors and retries aborted
    # A retry's first step comes before its deadline or the client has left; the abort after it.
    assert timing.abort_after_first_step_median_s >= 0.0
