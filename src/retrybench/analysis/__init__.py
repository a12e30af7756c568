"""The paper's metrics (Section 3.2), computed from a RunLog only: pure functions, no I/O, no clock.

`summarize` flattens them into one JSON-able dict, the row a report or a comparison against the
paper's figures (values.toml) reads.
"""

from __future__ import annotations

import math

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
from retrybench.runlog import (
    FATE_CANCELLED,
    FATE_DROPPED,
    FATE_REFUSED,
    REFUSED_429,
    REFUSED_503,
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


def _counts(log: RunLog) -> dict[str, object]:
    """Raw record counts, to check the metrics against and to spot a truncated log."""
    return {
        "attempts": len(log.attempts),
        "retries": sum(1 for a in log.attempts if a.attempt_no >= 1),
        "executions_created": len(log.executions),
        "executions_accepted": sum(1 for e in log.executions if e.accepted_s is not None),
        "executions_refused": sum(1 for e in log.executions if e.refused_s is not None),
        "executions_cancelled": sum(1 for e in log.executions if e.fate == FATE_CANCELLED),
        "calls": len(log.calls),
        "calls_delivered": sum(1 for c in log.calls if c.delivered_s is not None),
        "calls_failed": sum(1 for c in log.calls if c.failed_s is not None),
        **_control_counts(log),
    }


def _control_counts(log: RunLog) -> dict[str, object]:
    """What the overload controls did (Section 6): refused, attached, dropped, cancelled."""
    retries = [a for a in log.attempts if a.attempt_no >= 1]
    attached = sum(1 for a in retries if a.attached)
    return {
        "retries_refused": sum(1 for a in retries if a.outcome == REFUSED_429),
        "retries_refused_live": sum(1 for a in retries if a.outcome == REFUSED_429 and a.refused_live),
        "retries_attached": attached,
        "retries_attached_pct": clean(100.0 * attached / len(retries)) if retries else None,
        "attempts_refused_deadline": sum(
            1 for a in log.attempts if a.outcome == REFUSED_503 and a.execution_id is None),
        "executions_dropped": sum(1 for e in log.executions if e.fate == FATE_DROPPED),
        "engine_refused": sum(1 for e in log.executions if e.fate == FATE_REFUSED),
        "gave_up_retry_after": sum(1 for c in log.calls if c.failed_reason == "retry_after_too_long"),
    }


def summarize(log: RunLog) -> dict[str, object]:
    """One flat row of a run's metrics: recovery, cohort delivery, rates and raw counts."""
    rec = recovery(log)
    row: dict[str, object] = {"recovered": rec.recovered, "recovery_s": clean(rec.recovery_s)}
    for name, cohort in cohorts(log).items():
        row[f"{name}_delivered_pct"] = clean(cohort.delivered_pct)
        row[f"{name}_timely_pct"] = clean(cohort.timely_pct)
    r = rates(log)
    row.update(
        created_x=clean(r.created_x),
        accepted_x=clean(r.accepted_x),
        completed_x=clean(r.completed_x),
        retry_share_pct=clean(r.retry_share_pct),
        mean_waiting=clean(r.mean_waiting),
        littles_law_waiting=clean(r.littles_law_waiting),
        mean_waiting_pct_of_littles_law=clean(r.mean_waiting_pct_of_littles_law),
    )
    row.update(_counts(log))
    return row

