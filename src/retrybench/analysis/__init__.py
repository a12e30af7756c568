"""The paper's metrics (Section 3.2), computed from a RunLog only: pure functions, no I/O, no clock.

`summarize` flattens them into one typed row (results.Metrics), the part of a run's result that a
report or a comparison against the paper's figures (paper_values.toml) reads.
"""

from __future__ import annotations

import math

from retrybench.analysis.breaker import drain_to_full_service_s, open_s_after
from retrybench.analysis.delivery import (
    CohortDelivery,
    Recovery,
    Window,
    cohort_delivery,
    cohorts,
    delivered_per_window,
    recovery,
)
from retrybench.analysis.rates import Rates, rate_window, rates
from retrybench.records.results import Metrics
from retrybench.records.runlog import (
    FATE_CANCELLED,
    FATE_DROPPED,
    FATE_REFUSED,
    RunLog,
)

__all__ = [
    "CohortDelivery",
    "Rates",
    "Recovery",
    "Window",
    "clean",
    "cohort_delivery",
    "cohorts",
    "delivered_per_window",
    "rate_window",
    "rates",
    "recovery",
    "summarize",
]

_DIGITS = 4


def clean(value: float | None) -> float | None:
    """Round to a stable number of digits, and NaN to None, so json.dumps emits valid JSON."""
    if value is None or math.isnan(value):
        return None
    return round(value, _DIGITS)


def summarize(log: RunLog) -> Metrics:
    """One flat row of a run's metrics: recovery, cohort delivery, rates and raw counts, with what the
    overload controls did (Section 6)."""
    rec = recovery(log)
    groups = cohorts(log)
    pulse, hold, primary = groups["pulse"], groups["hold"], groups["primary"]
    r = rates(log)
    retries = [a for a in log.attempts if a.attempt_no >= 1]
    attached = sum(1 for a in retries if a.attached)
    metrics = Metrics(
        recovered=rec.recovered,
        recovery_s=clean(rec.recovery_s),
        pulse_delivered_pct=clean(pulse.delivered_pct),
        pulse_timely_pct=clean(pulse.timely_pct),
        hold_delivered_pct=clean(hold.delivered_pct),
        hold_timely_pct=clean(hold.timely_pct),
        primary_delivered_pct=clean(primary.delivered_pct),
        primary_timely_pct=clean(primary.timely_pct),
        created_x=clean(r.created_x),
        accepted_x=clean(r.accepted_x),
        completed_x=clean(r.completed_x),
        retry_share_pct=clean(r.retry_share_pct),
        mean_waiting=clean(r.mean_waiting),
        littles_law_waiting=clean(r.littles_law_waiting),
        mean_waiting_pct_of_littles_law=clean(r.mean_waiting_pct_of_littles_law),
        # raw record counts, to check the metrics against and to spot a truncated log
        attempts=len(log.attempts),
        retries=len(retries),
        executions_created=len(log.executions),
        executions_accepted=sum(1 for e in log.executions if e.accepted_s is not None),
        executions_refused=sum(1 for e in log.executions if e.refused_s is not None),
        executions_cancelled=sum(1 for e in log.executions if e.fate == FATE_CANCELLED),
        calls=len(log.calls),
        calls_delivered=sum(1 for c in log.calls if c.delivered_s is not None),
        calls_failed=sum(1 for c in log.calls if c.failed_s is not None),
        # what the overload controls did: refused, attached, dropped, cancelled
        retries_refused=sum(1 for a in retries if a.refusal_source == "budget"),
        retries_refused_live=sum(1 for a in retries if a.refusal_source == "budget" and a.refused_live),
        retries_attached=attached,
        retries_attached_pct=clean(100.0 * attached / len(retries)) if retries else None,
        attempts_refused_deadline=sum(1 for a in log.attempts if a.refusal_source == "deadline"),
        executions_dropped=sum(1 for e in log.executions if e.fate == FATE_DROPPED),
        engine_refused=sum(1 for e in log.executions if e.fate == FATE_REFUSED),
        gave_up_retry_after=sum(1 for c in log.calls if c.failed_reason == "retry_after_too_long"),
    )
    served = sum(1 for a in log.attempts if a.retained)
    if served:  # result retention: a run without it has no such figure
        metrics["attempts_served_retained"] = served
    breaker_refused = sum(1 for a in log.attempts if a.refusal_source == "breaker")
    if breaker_refused:  # a circuit breaker: a run without one has no such figure
        metrics["attempts_refused_breaker"] = breaker_refused
    if log.samples.breaker_state:
        metrics["drain_to_full_service_s"] = drain_to_full_service_s(log)
        metrics["breaker_not_closed_s"] = open_s_after(log.samples.breaker_state, 0)
    return metrics
