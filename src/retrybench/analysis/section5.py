"""Section 5's figures for one run: retry timing and the counter check from the run log, and the
attribution of prompt work and step time from the engine trace."""

from __future__ import annotations

from retrybench.analysis import clean as _clean
from retrybench.analysis.prompt_work import TraceEvents, prompt_work
from retrybench.analysis.retry_timing import counter_check, retry_timing
from retrybench.analysis.step_time import prompt_step_time_shares
from retrybench.gcpause import cyclic_gc_paused
from retrybench.records.results import PromptWork, RetryTiming
from retrybench.records.runlog import RunLog
from retrybench.records.tracefile import TraceEvent

__all__ = ["timing_and_counters", "trace_summary"]


def timing_and_counters(log: RunLog) -> RetryTiming:
    """Section 5.2's retry timing and 5.3's counter check: from the run log, no trace needed."""
    timing = retry_timing(log)
    check = counter_check(log)
    return RetryTiming(
        retries_never_scheduled_pct=_clean(timing.never_scheduled_pct),
        retry_first_scheduled_after_abort_median_s=_clean(timing.first_scheduled_after_predecessor_abort_median_s),
        retry_time_left_at_first_step_median_s=_clean(timing.time_left_at_first_step_median_s),
        retry_time_left_at_first_step_p90_s=_clean(timing.time_left_at_first_step_p90_s),
        abort_after_first_step_median_s=_clean(timing.abort_after_first_step_median_s),
        counter_rule_error_pct=_clean(check.rule_error_pct),
        counter_gap_pct=_clean(check.gap_pct),
    )


def trace_summary(events: list[TraceEvent], log: RunLog) -> PromptWork:
    """Section 5.1's attribution of computed prompt tokens and of step time, from the engine trace."""
    hold_end = float(log.meta["hold_end_s"])
    with cyclic_gc_paused():  # the columns built from a large trace hold many small objects
        trace = TraceEvents.read(events)  # read once for both
        work = prompt_work(trace, last_window=(hold_end - 240.0, hold_end))
        shares = prompt_step_time_shares(trace)  # only the prompt shares are reported: half the work
    return PromptWork(
        aborted_prompt_share_pct=_clean(work.aborted_share_pct),
        in_flight_share_pct=_clean(work.in_flight_share_pct),
        missed_share_pct=_clean(work.missed_share_pct),
        missed_share_last240_pct=_clean(work.missed_share_last_window_pct),
        aborted_unscheduled=work.aborted_unscheduled,
        preempted_execution_prompt_tokens=work.preempted_execution_tokens,
        step_time_aborted_share_pct=[_clean(min(shares.values())), _clean(max(shares.values()))],
        step_time_aborted_share_by_rule_pct={k: _clean(v) for k, v in shares.items()},
    )
