"""Delivery, cohorts and recovery (Section 3.2 of the paper), computed from a RunLog alone.

Every function here is pure: it reads the log and its `meta` (phase boundaries, deadline, horizon),
never a clock or a file, so the simulator's logs and the live load generator's logs are scored by
the same code.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from retrybench.records.runlog import RunLog

__all__ = [
    "CohortDelivery",
    "Recovery",
    "Window",
    "cohort_delivery",
    "cohorts",
    "delivered_per_window",
    "meta_s",
    "recovery",
    "sample_times",
    "samples_in",
    "waiting_total",
]

FloatArray = npt.NDArray[np.float64]

# Times come from float arithmetic (arrival + 840 need not subtract back to exactly 840), so the
# inclusive limits "within 840 s" and "within 120 s" get this much slack; it is far below any
# time resolution the client or the engine has.
_TIME_EPS_S = 1e-9
# A queue that grows by exactly the limit must not fail on rounding in the least-squares fit.
_SLOPE_EPS = 1e-12


def meta_s(log: RunLog, key: str) -> float:
    """A time (or rate) from the log's meta; the metrics use these, never the paper's literals."""
    try:
        return float(log.meta[key])
    except KeyError:
        raise KeyError(f"RunLog.meta lacks {key!r}, which the metrics need") from None


# ---------------------------------------------------------------------------------------------------
# Per-call delivery


@dataclass(frozen=True, kw_only=True)
class CohortDelivery:
    """How many calls planned in a span were delivered by the horizon, and within the deadline."""

    calls: int
    delivered: int
    timely: int
    delivered_pct: float  # NaN when the cohort has no calls
    timely_pct: float


@dataclass(frozen=True)
class _CallTimes:
    """The calls' arrivals and delivery flags as arrays, built once so cohorts and windows are cheap."""

    arrival_s: FloatArray
    delivered_s: FloatArray  # NaN for calls never delivered
    delivered: npt.NDArray[np.bool_]  # within the delivery horizon of the planned arrival
    timely: npt.NDArray[np.bool_]  # within the first attempt's deadline


def _call_times(log: RunLog) -> _CallTimes:
    """Classify every call once: delivered (by the horizon) and timely (by the first deadline)."""
    horizon = meta_s(log, "delivery_horizon_s")
    deadline = meta_s(log, "attempt_timeout_s")
    arrival = np.fromiter((c.arrival_s for c in log.calls), dtype=np.float64, count=len(log.calls))
    delivered_at = np.fromiter(
        (math.nan if c.delivered_s is None else c.delivered_s for c in log.calls),
        dtype=np.float64,
        count=len(log.calls),
    )
    # NaN (never delivered) compares False, so undelivered calls fall out of both masks.
    took = delivered_at - arrival
    return _CallTimes(
        arrival_s=arrival,
        delivered_s=delivered_at,
        delivered=took <= horizon + _TIME_EPS_S,
        timely=took <= deadline + _TIME_EPS_S,
    )


def _pct(part: int, whole: int) -> float:
    """Percent of a count, NaN for an empty whole (0 of 0 is no evidence either way)."""
    return 100.0 * part / whole if whole else math.nan


def _in_span(values: FloatArray, start_s: float, end_s: float) -> npt.NDArray[np.bool_]:
    """Half-open [start, end), as the paper's cohorts and windows are."""
    return (values >= start_s) & (values < end_s)


def _cohort(times: _CallTimes, start_s: float, end_s: float) -> CohortDelivery:
    planned = _in_span(times.arrival_s, start_s, end_s)
    calls = int(planned.sum())
    delivered = int((planned & times.delivered).sum())
    timely = int((planned & times.timely).sum())
    return CohortDelivery(
        calls=calls,
        delivered=delivered,
        timely=timely,
        delivered_pct=_pct(delivered, calls),
        timely_pct=_pct(timely, calls),
    )


def cohort_delivery(log: RunLog, start_s: float, end_s: float) -> CohortDelivery:
    """Delivery of the calls planned in [start_s, end_s): the paper scores calls by planned arrival."""
    return _cohort(_call_times(log), start_s, end_s)


def cohorts(log: RunLog) -> dict[str, CohortDelivery]:
    """The pulse, hold and primary cohorts; primary drops the hold's first deadline after the pulse."""
    times = _call_times(log)
    pulse_start = meta_s(log, "pulse_start_s")
    pulse_end = meta_s(log, "pulse_end_s")
    hold_end = meta_s(log, "hold_end_s")
    primary_start = pulse_end + meta_s(log, "attempt_timeout_s")
    return {
        "pulse": _cohort(times, pulse_start, pulse_end),
        "hold": _cohort(times, pulse_end, hold_end),
        "primary": _cohort(times, primary_start, hold_end),
    }


def delivered_per_window(log: RunLog, window_s: float = 60.0) -> list[tuple[float, int]]:
    """Calls delivered per window of wall time since the run's start (Figure 1(a)), empty windows too.

    Counts only calls delivered by the horizon, the same "delivered" as the cohorts use.
    """
    if window_s <= 0:
        raise ValueError("window_s must be positive")
    times = _call_times(log)
    delivered_at = times.delivered_s[times.delivered]
    index = np.floor(delivered_at / window_s).astype(np.int64)
    n_windows = max(math.ceil(log.end_s / window_s), int(index.max()) + 1 if index.size else 0)
    counts = np.bincount(index, minlength=n_windows)
    return [(i * window_s, int(n)) for i, n in enumerate(counts)]


# ---------------------------------------------------------------------------------------------------
# Queue samples


def sample_times(start_s: float, end_s: float, n_samples: int) -> npt.NDArray[np.int64]:
    """The integer sample times t in [start_s, end_s) that the log actually has (t < n_samples)."""
    first = max(math.ceil(start_s), 0)
    stop = min(math.ceil(end_s), n_samples)
    return np.arange(first, max(stop, first), dtype=np.int64)


def samples_in(series: Sequence[int] | FloatArray, start_s: float, end_s: float) -> FloatArray:
    """The 1-s samples taken at integer t in [start_s, end_s), as floats."""
    values = np.asarray(series, dtype=np.float64)
    return values[sample_times(start_s, end_s, len(values))]


def waiting_total(log: RunLog) -> FloatArray:
    """Executions waiting in the proxy plus the engine, per 1-s sample.

    A log without a proxy gauge (no proxy in the path) counts the engine alone; otherwise both
    gauges are cut to their common length so that every sample is a true sum.
    """
    engine = np.asarray(log.samples.engine_waiting, dtype=np.float64)
    proxy = np.asarray(log.samples.proxy_waiting, dtype=np.float64)
    if proxy.size == 0:
        return engine
    n = min(engine.size, proxy.size)
    return engine[:n] + proxy[:n]


def _slope(t: npt.NDArray[np.int64], y: FloatArray) -> float:
    """Least-squares slope of y over t; NaN with fewer than two samples (no growth is measurable)."""
    if t.size < 2:
        return math.nan
    tc = t - t.mean()
    return float(np.dot(tc, y - y.mean()) / np.dot(tc, tc))


# ---------------------------------------------------------------------------------------------------
# Recovery


@dataclass(frozen=True, kw_only=True)
class Window:
    """One 60-s window of the hold and whether it meets the recovery criteria."""

    start_s: float
    end_s: float
    calls: int  # planned in [start_s, end_s)
    timely_pct: float  # NaN for a window without calls
    mean_waiting: float  # proxy + engine; NaN without samples
    growth_per_s: float  # least-squares slope; NaN with fewer than two samples
    good: bool


@dataclass(frozen=True, kw_only=True)
class Recovery:
    """Recovery time after the pulse, right-censored (recovered False, recovery_s None) at the hold's end."""

    recovered: bool
    recovery_s: float | None  # end of the second good window minus the pulse's end
    windows: tuple[Window, ...]


def _window(
    times: _CallTimes,
    waiting: FloatArray,
    start_s: float,
    end_s: float,
    *,
    min_timely: float,
    max_mean_queue: float,
    max_growth_per_s: float,
) -> Window:
    """Score one window; missing queue samples make it not good, since the criterion cannot be checked."""
    planned = _in_span(times.arrival_s, start_s, end_s)
    calls = int(planned.sum())
    timely = int((planned & times.timely).sum())
    # An empty window has no call that missed its deadline.
    delivery_ok = calls == 0 or timely / calls >= min_timely
    t = sample_times(start_s, end_s, waiting.size)
    y = waiting[t]
    mean = float(y.mean()) if y.size else math.nan
    growth = _slope(t, y)
    # NaN fails both comparisons, so a window without enough samples is never good.
    queue_ok = mean <= max_mean_queue and growth <= max_growth_per_s + _SLOPE_EPS
    return Window(
        start_s=start_s,
        end_s=end_s,
        calls=calls,
        timely_pct=_pct(timely, calls),
        mean_waiting=mean,
        growth_per_s=growth,
        good=delivery_ok and queue_ok,
    )


def _hold_windows(pulse_end: float, hold_end: float, window_s: float) -> list[tuple[float, float]]:
    """Windows [pulse_end + w*i, pulse_end + w*(i+1)) that end within the hold."""
    n = math.floor((hold_end - pulse_end) / window_s + _TIME_EPS_S)
    return [(pulse_end + window_s * i, pulse_end + window_s * (i + 1)) for i in range(max(n, 0))]


def recovery(
    log: RunLog,
    *,
    min_timely: float = 0.98,
    max_mean_queue: float = 2.0,
    max_growth_per_s: float = 0.01,
    window_s: float = 60.0,
) -> Recovery:
    """Recovered at the first two consecutive good windows of the hold; the time is the second's end.

    The per-window table is returned in full (not cut at recovery) so reports can plot it.
    """
    if window_s <= 0:
        raise ValueError("window_s must be positive")
    pulse_end = meta_s(log, "pulse_end_s")
    hold_end = meta_s(log, "hold_end_s")
    times = _call_times(log)
    waiting = waiting_total(log)
    windows = tuple(
        _window(
            times,
            waiting,
            start,
            end,
            min_timely=min_timely,
            max_mean_queue=max_mean_queue,
            max_growth_per_s=max_growth_per_s,
        )
        for start, end in _hold_windows(pulse_end, hold_end, window_s)
    )
    for first, second in itertools.pairwise(windows):
        if first.good and second.good:
            return Recovery(recovered=True, recovery_s=second.end_s - pulse_end, windows=windows)
    return Recovery(recovered=False, recovery_s=None, windows=windows)
