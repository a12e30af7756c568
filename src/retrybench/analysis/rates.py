"""Execution rates and the waiting queue over the rate window (Sections 3.2 and 4.1, Figure 3).

The window is [pulse_end + one deadline, hold_end), 347-947 s in the paper: the hold after its first
deadline, when every retry of a pulse call has had its chance to be sent. Rates are reported in
multiples of C-hat so runs on models of different capacity compare directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from retrybench.analysis.delivery import meta_s, samples_in
from retrybench.records.runlog import FATE_COMPLETED, FATE_ORPHANED, RunLog

__all__ = ["Rates", "rate_window", "rates"]

# The engine produced the execution's last token, whether or not a subscriber was still waiting.
_FINISHED_FATES = frozenset({FATE_COMPLETED, FATE_ORPHANED})


@dataclass(frozen=True, kw_only=True)
class Rates:
    """Executions per second in the rate window, as multiples of C-hat, and the queue against Little's law."""

    created_x: float  # created at the proxy
    accepted_x: float  # accepted into the engine's queue
    completed_x: float  # last token produced (completed or orphaned)
    retry_share_pct: float  # of the window's created executions, those a retry created; NaN if none
    attempt_rate: float  # attempts sent per second
    mean_waiting: float  # engine waiting queue, mean of the 1-s samples
    littles_law_waiting: float  # attempt_rate x attempt timeout: each execution waits out its deadline
    mean_waiting_pct_of_littles_law: float


def rate_window(log: RunLog) -> tuple[float, float]:
    """[pulse_end + attempt timeout, hold_end): the hold without its first deadline."""
    start = meta_s(log, "pulse_end_s") + meta_s(log, "attempt_timeout_s")
    return start, meta_s(log, "hold_end_s")


def _in(t: float | None, start_s: float, end_s: float) -> bool:
    """Half-open membership; None (the event did not happen) is never in."""
    return t is not None and start_s <= t < end_s


def _ratio(part: float, whole: float, scale: float = 1.0) -> float:
    """scale * part / whole, NaN when the whole is zero rather than an error or an infinity."""
    return scale * part / whole if whole else math.nan


def rates(log: RunLog) -> Rates:
    """Creation, acceptance and completion rates over the rate window, and the mean engine queue."""
    start, end = rate_window(log)
    span = end - start
    chat = meta_s(log, "chat")
    timeout = meta_s(log, "attempt_timeout_s")

    created = [e for e in log.executions if _in(e.created_s, start, end)]
    n_retries = sum(1 for e in created if e.attempt_no >= 1)
    n_accepted = sum(1 for e in log.executions if _in(e.accepted_s, start, end))
    n_completed = sum(
        1 for e in log.executions if e.fate in _FINISHED_FATES and _in(e.finished_s, start, end)
    )
    n_attempts = sum(1 for a in log.attempts if _in(a.sent_s, start, end))

    attempt_rate = _ratio(n_attempts, span)
    waiting = samples_in(log.samples.engine_waiting, start, end)
    mean_waiting = float(np.mean(waiting)) if waiting.size else math.nan
    littles = attempt_rate * timeout
    return Rates(
        created_x=_ratio(len(created), span * chat),
        accepted_x=_ratio(n_accepted, span * chat),
        completed_x=_ratio(n_completed, span * chat),
        retry_share_pct=_ratio(n_retries, len(created), 100.0),
        attempt_rate=attempt_rate,
        mean_waiting=mean_waiting,
        littles_law_waiting=littles,
        mean_waiting_pct_of_littles_law=_ratio(mean_waiting, littles, 100.0),
    )
