"""A circuit breaker's cost after overload, from a run log: time from drain to full service (pure).

Beyond the paper. A breaker that opened during the pulse should close once the engine has nothing
left to do; one that counts the engine's busy answers as faults may keep shedding (or keep
reopening) after that. The run log samples the engine's gauges and the breaker's state once per
second (QueueSamples, at t = 0, 1, 2, ... s), and the metric reads those samples:

  drain_s        the first sample at or after the pulse's end at which the backlog is gone: nothing
                 waiting in the engine nor in the proxy's queue (the hold phase's base load keeps a
                 few calls running at every sample, so "nothing running" too would never be seen);
  full_service_s the first sample from which the breaker is closed at every later sample of the run;
  drain_to_full_service_s = max(0, full_service_s - drain_s).

It is None when the backlog never drains after the pulse, or when the breaker is not closed at the
run's last sample (service never returned in full within the run); 0 when the breaker was closed
for good before the engine drained.
"""

from __future__ import annotations

from collections.abc import Sequence

from retrybench.records.runlog import RunLog

__all__ = ["BREAKER_CLOSED", "drain_s", "drain_to_full_service_s", "full_service_s", "open_s_after"]

BREAKER_CLOSED = 0  # QueueSamples.breaker_state's code for closed (control/breaker.py STATE_CODES)


def drain_s(engine_waiting: Sequence[int], proxy_waiting: Sequence[int], after_s: float) -> int | None:
    """The first 1-s sample at or after `after_s` with nothing waiting in the engine or the proxy."""
    start = max(0, -int(-after_s // 1))  # ceil: the first sample at or after after_s
    for t in range(start, min(len(engine_waiting), len(proxy_waiting))):
        if engine_waiting[t] == 0 and proxy_waiting[t] == 0:
            return t
    return None


def full_service_s(states: Sequence[int]) -> int | None:
    """The first sample from which every sample is closed; None if the last one is not."""
    if not states or states[-1] != BREAKER_CLOSED:
        return None
    t = len(states)
    while t > 0 and states[t - 1] == BREAKER_CLOSED:
        t -= 1
    return t


def open_s_after(states: Sequence[int], after_s: int) -> int:
    """Seconds (samples) from `after_s` on at which the breaker was not closed."""
    return sum(1 for state in states[max(0, after_s):] if state != BREAKER_CLOSED)


def drain_to_full_service_s(log: RunLog) -> int | None:
    """Seconds from the backlog's drain after the pulse to the breaker's closing for good."""
    samples = log.samples
    drained = drain_s(samples.engine_waiting, samples.proxy_waiting, float(log.meta["pulse_end_s"]))
    closed = full_service_s(samples.breaker_state)
    if drained is None or closed is None:
        return None
    return max(0, closed - drained)
