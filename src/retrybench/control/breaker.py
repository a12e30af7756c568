"""A circuit breaker in front of the proxy, sans-IO: which attempts it answers itself, and when.

Beyond the paper. Routers put a breaker before their workers; counting an overloaded engine's "busy"
answers (429, 503, 529) as worker faults makes one open on plain overload and keep shedding after the
engine has drained (sglang's router did). `BreakerCore` decides from the time and the outcomes the
driver reports, so the simulator and the live proxy run the same code:

  closed    -> open       `failures` faults within `window_s` seconds;
  open      -> half-open  `open_s` seconds later; meanwhile every attempt is refused by the breaker;
  half-open -> closed     a probe (one of the first `probes` attempts let through) succeeds;
  half-open -> open       a probe faults.

A timeout or an error is a fault; a busy answer is one only with `busy_is_fault`. An outcome that is
neither a success nor a fault (a busy answer not counted) frees its probe's place for another probe.
Outcomes of attempts let through in an earlier state (a closed period before it opened) are not
probes: in half-open only the probes decide.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

from retrybench.conditions.config import BreakerPolicy
from retrybench.control.proxy import Refuse
from retrybench.records.runlog import COMPLETED, ERROR, REFUSED_429, REFUSED_503, REFUSED_529, TIMED_OUT

__all__ = ["BUSY", "CLOSED", "FAULT", "HALF_OPEN", "OPEN", "STATE_CODES", "SUCCESS", "BreakerCore",
           "BreakerCounts", "result_of"]

CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half-open"
# A state's code in the run log's per-second samples (QueueSamples.breaker_state).
STATE_CODES: Final = {CLOSED: 0, OPEN: 1, HALF_OPEN: 2}

SUCCESS: Final = "success"
BUSY: Final = "busy"
FAULT: Final = "fault"
_RESULTS: Final = {COMPLETED: SUCCESS, REFUSED_429: BUSY, REFUSED_503: BUSY, REFUSED_529: BUSY,
                   TIMED_OUT: FAULT, ERROR: FAULT}

Subscriber = tuple[int, int]  # (call index, attempt number), as the proxy core names an attempt


def result_of(outcome: str) -> str:
    """An attempt outcome (records/runlog.py) as the breaker reads it: success, busy or fault."""
    try:
        return _RESULTS[outcome]
    except KeyError:
        raise ValueError(f"unknown attempt outcome {outcome!r}; expected one of {', '.join(_RESULTS)}") from None


@dataclass(slots=True)
class BreakerCounts:
    refused: int = 0  # attempts the breaker answered itself
    opened: int = 0  # closed or half-open -> open
    closed: int = 0  # half-open -> closed
    probes: int = 0  # attempts let through while half-open
    transitions: list[tuple[float, str]] = field(default_factory=list)  # (time, new state)


class BreakerCore:
    """The breaker's state machine; time is an argument, decisions are return values."""

    def __init__(self, policy: BreakerPolicy) -> None:
        self.policy = policy
        self.counts = BreakerCounts()
        self._state: str = CLOSED
        self._opened_s = 0.0
        self._faults: deque[float] = deque()  # fault times while closed, within the window
        self._probes: set[Subscriber] = set()  # probes let through and not yet answered
        self._probes_left = 0

    def state(self, now: float) -> str:
        """The state at `now` (an open breaker's cool-down ends by itself)."""
        if self._state == OPEN and now >= self._opened_s + self.policy.open_s:
            self._move(HALF_OPEN, self._opened_s + self.policy.open_s)
            self._probes.clear()
            self._probes_left = self.policy.probes
        return self._state

    def on_attempt(self, subscriber: Subscriber, now: float) -> Refuse | None:
        """None lets the attempt through to the proxy; a Refuse is the breaker's own answer."""
        state = self.state(now)
        if state == CLOSED:
            return None
        if state == HALF_OPEN and self._probes_left > 0:
            self._probes_left -= 1
            self._probes.add(subscriber)
            self.counts.probes += 1
            return None
        self.counts.refused += 1
        policy = self.policy
        retry_after = None
        if policy.retry_after:  # the cool-down left; a half-open breaker waits on its probes: a full one
            retry_after = (self._opened_s + policy.open_s - now) if state == OPEN else policy.open_s
        return Refuse(policy.status, retry_after_s=retry_after, no_retry=policy.no_retry, source="breaker")

    def on_result(self, subscriber: Subscriber, outcome: str, now: float) -> None:
        """An attempt it let through ended with `outcome` (an attempt outcome) at `now`."""
        result = result_of(outcome)
        fault = result == FAULT or (result == BUSY and self.policy.busy_is_fault)
        state = self.state(now)
        if state == CLOSED:
            if fault:
                self._fault(now)
            return
        if state == OPEN or subscriber not in self._probes:
            return  # only the probes decide a half-open breaker
        self._probes.discard(subscriber)
        if result == SUCCESS:
            self._probes.clear()
            self._faults.clear()
            self.counts.closed += 1
            self._move(CLOSED, now)
        elif fault:
            self._open(now)
        else:
            self._probes_left += 1  # neither: another attempt may probe

    def on_not_judged(self, subscriber: Subscriber, now: float) -> None:
        """An attempt it let through ended in a way that says nothing of what is behind it (the request was
        malformed: a 4xx): nothing is counted, and a probe's place is freed for another attempt."""
        if self.state(now) == HALF_OPEN and subscriber in self._probes:
            self._probes.discard(subscriber)
            self._probes_left += 1

    def _fault(self, now: float) -> None:
        faults = self._faults
        faults.append(now)
        while faults and faults[0] <= now - self.policy.window_s:
            faults.popleft()
        if len(faults) >= self.policy.failures:
            self._open(now)

    def _open(self, now: float) -> None:
        self._faults.clear()
        self._probes.clear()
        self._probes_left = 0
        self._opened_s = now
        self.counts.opened += 1
        self._move(OPEN, now)

    def _move(self, state: str, at_s: float) -> None:
        self._state = state
        self.counts.transitions.append((at_s, state))
