"""When retries reach the engine (Section 5.2) and what vLLM's prompt-token counter sees (Section 5.3).

Both are computed from a RunLog only. A retry here is an attempt with attempt_no >= 1 that created its
own execution (not one attached to its call's live execution). Its predecessor is the execution that
served the call's previous attempt; its deadline is sent_s + attempt_timeout_s.

Sample convention: the simulator appends the sample for second t once the clock passes t, so
samples[t] holds the counters after every event at times <= t, and samples[b] - samples[a] counts the
events in (a, b]. The counter check therefore predicts from first tokens in (a, b], where a and b are
the sample indices int(pulse_end_s) and int(hold_end_s) clamped to the samples taken; with integer
phase bounds inside the run that is exactly (pulse_end_s, hold_end_s].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retrybench.analysis.delivery import meta_s
from retrybench.records.runlog import ExecutionRecord, RunLog

__all__ = ["CounterCheck", "RetryTiming", "counter_check", "retry_timing"]


@dataclass(frozen=True, kw_only=True)
class RetryTiming:
    """Section 5.2: how long retries waited for their first step, and how close to their deadline."""

    retries: int  # retries that created an execution
    never_scheduled_pct: float  # of those, executions never first-scheduled
    first_scheduled_after_predecessor_abort_median_s: float  # scheduled retries with an aborted predecessor
    time_left_at_first_step_median_s: float  # deadline - first_scheduled_s, scheduled retries
    time_left_at_first_step_p90_s: float  # the same, 90th percentile over aborted scheduled retries
    abort_after_first_step_median_s: float  # aborted_s - first_scheduled_s, aborted scheduled retries


@dataclass(frozen=True, kw_only=True)
class CounterCheck:
    """Section 5.3: vLLM's prompt-token counter over the hold, against its rule and the admission counter."""

    prompt_counter_increase: int  # vllm:prompt_tokens_total
    predicted_increase: int  # full prompt lengths of executions whose first token falls in the window
    admission_increase: int  # vllm:prefix_cache_queries_total
    rule_error_pct: float  # 100 |counter - predicted| / predicted; NaN if nothing was predicted
    gap_pct: float  # 100 (admission - counter) / admission; NaN if nothing was admitted


def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if values else math.nan


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def _ratio(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else math.nan


def retry_timing(log: RunLog) -> RetryTiming:
    """First scheduling, time left and abort delay of the retries that created executions; NaN if none."""
    timeout = meta_s(log, "attempt_timeout_s")
    by_id = {e.execution_id: e for e in log.executions}
    served = {(a.call_index, a.attempt_no): a.execution_id for a in log.attempts}

    retries: list[tuple[float, ExecutionRecord, ExecutionRecord | None]] = []  # (deadline, own, predecessor)
    for a in log.attempts:
        own = by_id.get(a.execution_id) if a.execution_id is not None else None
        if a.attempt_no < 1 or own is None or own.attempt_no != a.attempt_no or own.call_index != a.call_index:
            continue
        previous = served.get((a.call_index, a.attempt_no - 1))
        retries.append((a.sent_s + timeout, own, by_id.get(previous) if previous is not None else None))

    after_abort: list[float] = []
    time_left: list[float] = []
    time_left_aborted: list[float] = []
    abort_after: list[float] = []
    never = 0
    for deadline, own, predecessor in retries:
        first = own.first_scheduled_s
        if first is None:
            never += 1
            continue
        if predecessor is not None and predecessor.aborted_s is not None:
            after_abort.append(first - predecessor.aborted_s)
        time_left.append(deadline - first)
        if own.aborted_s is not None:
            time_left_aborted.append(deadline - first)
            abort_after.append(own.aborted_s - first)
    return RetryTiming(
        retries=len(retries),
        never_scheduled_pct=_ratio(never, len(retries)),
        first_scheduled_after_predecessor_abort_median_s=_median(after_abort),
        time_left_at_first_step_median_s=_median(time_left),
        time_left_at_first_step_p90_s=_percentile(time_left_aborted, 90.0),
        abort_after_first_step_median_s=_median(abort_after),
    )


def _sample_window(n: int, start_s: float, end_s: float) -> tuple[int, int]:
    """The sample indices int(start_s) and int(end_s), clamped to [0, n - 1]."""
    last = max(n - 1, 0)
    return min(max(int(start_s), 0), last), min(max(int(end_s), 0), last)


def _increase(series: Sequence[int], lo: int, hi: int) -> int:
    return int(series[hi] - series[lo]) if series else 0


def counter_check(log: RunLog) -> CounterCheck:
    """The prompt-token counter over the hold, what its first-token rule predicts, and its admission gap."""
    samples = log.samples
    start, end = meta_s(log, "pulse_end_s"), meta_s(log, "hold_end_s")
    lo, hi = _sample_window(len(samples.prompt_tokens_total), start, end)
    counter = _increase(samples.prompt_tokens_total, lo, hi)
    admitted = _increase(samples.prefix_cache_queries_total,
                         *_sample_window(len(samples.prefix_cache_queries_total), start, end))
    predicted = sum(
        e.prompt_tokens for e in log.executions if e.first_token_s is not None and lo < e.first_token_s <= hi
    )
    return CounterCheck(
        prompt_counter_increase=counter,
        predicted_increase=predicted,
        admission_increase=admitted,
        rule_error_pct=_ratio(abs(counter - predicted), predicted),
        gap_pct=_ratio(admitted - counter, admitted),
    )
