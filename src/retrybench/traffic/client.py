"""The open-loop retrying client as a sans-IO state machine: the paper's (Section 3.1, 2) by default,
or an SDK's retry policy (config.ClientPolicy, clients/*.toml).

It reads no clock, opens no socket and uses no global RNG: the driver (simulator or live load
generator) passes the time `now` and a seeded `numpy.random.Generator`, so that the same seed and
the same outcomes give the same attempts. The driver owns deadlines: it reports TIMED_OUT once an
attempt's `deadline_s` passes, and the client answers with the call's next action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from retrybench.conditions.config import ClientPolicy
from retrybench.records.runlog import (
    COMPLETED,
    ERROR,
    REFUSED_429,
    REFUSED_503,
    REFUSED_529,
    TIMED_OUT,
    FailedReason,
)

__all__ = ["CallDelivered", "CallFailed", "ClientAction", "RetryingClient", "SendAttempt"]

_OUTCOMES = frozenset({COMPLETED, TIMED_OUT, REFUSED_429, REFUSED_503, REFUSED_529, ERROR})
ATTEMPTS_EXHAUSTED: Final = "attempts_exhausted"
RETRY_AFTER_TOO_LONG: Final = "retry_after_too_long"
SHOULD_RETRY_FALSE: Final = "should_retry_false"


@dataclass(frozen=True, slots=True)
class SendAttempt:
    """Send attempt `attempt_no` (0 first, 1..R retries) at `send_s`; close it at `deadline_s`."""

    call_index: int
    attempt_no: int
    send_s: float
    deadline_s: float


@dataclass(frozen=True, slots=True)
class CallDelivered:
    """An attempt completed: the call got its response at `at_s`."""

    call_index: int
    at_s: float


@dataclass(frozen=True, slots=True)
class CallFailed:
    """The client gave the call up at `at_s`, for `reason`."""

    call_index: int
    at_s: float
    reason: FailedReason


ClientAction = SendAttempt | CallDelivered | CallFailed


@dataclass(slots=True)
class _Call:
    """Per-call state, kept tiny since a run has tens of thousands of calls."""

    attempt_no: int  # the outstanding (or last) attempt
    send_s: float
    done: bool = False


class _Backoff:
    """Uniform waits in [low, high), drawn from the generator a block at a time.

    numpy's Generator computes low + (high - low) * next_double() whether it draws one value or
    many, so a block gives the same waits in the same order as one draw per retry (the generator
    is the client's alone), at a fraction of the per-call cost.
    """

    __slots__ = ("_high", "_low", "_next", "_rng", "_waits")
    BLOCK = 64

    def __init__(self, rng: np.random.Generator, low: float, high: float) -> None:
        self._rng = rng
        self._low = low
        self._high = high
        self._waits: list[float] = []
        self._next = 0

    def draw(self) -> float:
        if self._next == len(self._waits):
            self._waits = self._rng.uniform(self._low, self._high, self.BLOCK).tolist()
            self._next = 0
        wait = self._waits[self._next]
        self._next += 1
        return wait


class _ExponentialBackoff:
    """The SDKs' waits: min(base * 2**k, cap) after attempt k, times a jitter factor of u in [0, 1).

    The factor is computed as the SDKs write it (1 - fraction * u, or u for full jitter), so that the
    same u gives the same float; the u come from the generator a block at a time, in order (numpy's
    uniform(0, 1) is its next double itself). No jitter draws nothing.
    """

    __slots__ = ("_base", "_cap", "_fraction", "_jitter", "_uniform")

    def __init__(self, rng: np.random.Generator, policy: ClientPolicy) -> None:
        self._base = policy.backoff_base_s
        self._cap = policy.backoff_cap_s
        self._fraction = policy.jitter_fraction
        self._jitter = policy.jitter
        self._uniform = _Backoff(rng, 0.0, 1.0)

    def wait(self, attempt_no: int) -> float:
        """The wait after attempt `attempt_no` failed (0 the first attempt); the SDKs cap k at 1000."""
        delay = min(self._base * pow(2.0, min(attempt_no, 1000)), self._cap)
        if self._jitter == "none":
            return delay
        u = self._uniform.draw()
        wait = delay * (1 - self._fraction * u if self._jitter == "reduce" else u)
        return wait if wait >= 0 else 0.0


class RetryingClient:
    """Decides, per reported attempt outcome, whether to retry, deliver or give the call up."""

    def __init__(self, policy: ClientPolicy, rng: np.random.Generator) -> None:
        self._policy = policy
        self._max_attempts = policy.max_attempts
        self._retry_on = frozenset(policy.retried_outcomes)
        self._backoff = _Backoff(rng, policy.backoff_min_s, policy.backoff_max_s)
        self._exponential = _ExponentialBackoff(rng, policy) if policy.backoff == "exponential" else None
        self._calls: dict[int, _Call] = {}
        self._outstanding = 0

    def start_call(self, call_index: int, now: float) -> SendAttempt:
        """The call's first attempt, sent at once (the trace is open-loop)."""
        if call_index in self._calls:
            raise ValueError(f"call {call_index} already started")
        self._calls[call_index] = _Call(attempt_no=0, send_s=now)
        self._outstanding += 1
        return self._attempt(call_index, 0, now)

    def on_outcome(
        self,
        call_index: int,
        attempt_no: int,
        outcome: str,
        now: float,
        retry_after_s: float | None = None,
        no_retry: bool = False,
    ) -> ClientAction:
        """The call's next action after its outstanding attempt ended with `outcome` at `now`;
        `no_retry` says the response carried `x-should-retry: false`."""
        call = self._calls.get(call_index)
        if call is None:
            raise ValueError(f"call {call_index} was never started")
        if call.done:
            raise ValueError(f"call {call_index} already ended (attempt {attempt_no} reported late or twice)")
        if attempt_no != call.attempt_no:
            raise ValueError(
                f"call {call_index}: attempt {attempt_no} is not the outstanding attempt {call.attempt_no}"
            )
        if outcome not in _OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; expected one of {', '.join(sorted(_OUTCOMES))}")
        if now < call.send_s:
            raise ValueError(
                f"call {call_index}: outcome at {now} before the attempt was sent ({call.send_s})"
            )
        if retry_after_s is not None and not retry_after_s >= 0:
            raise ValueError(f"retry_after_s must be >= 0 or None, got {retry_after_s}")
        if outcome == COMPLETED:
            return self._end(call, CallDelivered(call_index, now))
        # Exhaustion first: a call with no attempts left fails the same way whatever refused it. An
        # outcome the policy does not retry leaves no attempt either (the run log has no other reason).
        if attempt_no + 1 >= self._max_attempts or outcome not in self._retry_on:
            return self._end(call, CallFailed(call_index, now, ATTEMPTS_EXHAUSTED))
        if no_retry and self._policy.honour_should_retry:  # the SDKs obey the header whatever the status
            return self._end(call, CallFailed(call_index, now, SHOULD_RETRY_FALSE))
        wait = self._wait(outcome, attempt_no, retry_after_s)
        if wait is None:
            return self._end(call, CallFailed(call_index, now, RETRY_AFTER_TOO_LONG))
        call.attempt_no = attempt_no + 1
        call.send_s = now + wait
        return self._attempt(call_index, call.attempt_no, call.send_s)

    def attempts_made(self, call_index: int) -> int:
        """Attempts sent (or scheduled) for the call so far, the first one included."""
        call = self._calls.get(call_index)
        if call is None:
            raise ValueError(f"call {call_index} was never started")
        return call.attempt_no + 1

    def outstanding(self) -> int:
        """Calls started but neither delivered nor failed."""
        return self._outstanding

    def _wait(self, outcome: str, attempt_no: int, retry_after_s: float | None) -> float | None:
        """The wait before the next attempt, or None when the server's Retry-After makes the client give up."""
        rule = self._policy.retry_after
        cap = self._policy.retry_after_cap_s
        if rule == "cap-or-give-up":  # the paper's client: a 429's value, whatever it is
            if outcome == REFUSED_429 and retry_after_s is not None:
                return retry_after_s if retry_after_s <= cap else None
        elif rule != "ignore" and retry_after_s is not None and retry_after_s > 0:  # the SDKs: any response's
            if retry_after_s <= cap:
                return retry_after_s
            if rule == "positive-cap-or-give-up":
                return None
            if rule == "positive-capped":
                return cap
        return self._backoff_wait(attempt_no)

    def _backoff_wait(self, attempt_no: int) -> float:
        """The client's own wait after attempt `attempt_no` failed."""
        if self._exponential is None:
            return self._backoff.draw()
        return self._exponential.wait(attempt_no)

    def _attempt(self, call_index: int, attempt_no: int, send_s: float) -> SendAttempt:
        return SendAttempt(call_index, attempt_no, send_s, send_s + self._policy.attempt_timeout_s)

    def _end(self, call: _Call, action: CallDelivered | CallFailed) -> ClientAction:
        call.done = True
        self._outstanding -= 1
        return action
