"""The proxy's decisions, sans-IO: what happens to each attempt and to each execution.

`ProxyCore` never touches a socket or a clock. Its inputs are events with their time (an attempt
arrives, a subscriber leaves, the engine reports, a timer fires); its outputs are decisions for
the driver to carry out (dispatch an execution upstream, cancel it, tell a subscriber). The
simulator and the live proxy drive the same object.

The paper's vocabulary (Section 2): a call's attempts each become a *subscriber* of an
*execution*; when the last subscriber leaves, the cancellation policy leaves the execution
running (orphaned), cancels it at once, or cancels it `defer_s` later unless someone attached.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from retrybench.config import ProxyPolicy

__all__ = [
    "Action", "AttemptIn", "Cancel", "Create", "Dispatch", "Execution", "Notify", "ProxyCore", "SetTimer",
]

Subscriber = tuple[int, int]  # (call index, attempt number)


@dataclass(frozen=True, slots=True)
class AttemptIn:
    """An attempt as the proxy sees it. `key` identifies the call for coalescing: tenant, call id
    and a hash of the whole request body."""

    call_index: int
    attempt_no: int
    key: str
    prompt_tokens: int
    max_tokens: int

    @property
    def subscriber(self) -> Subscriber:
        return (self.call_index, self.attempt_no)


@dataclass(frozen=True, slots=True)
class Create:
    """A new execution for the attempt; `dispatch` False means it waits in the proxy's queue."""

    execution_id: int
    dispatch: bool = True


@dataclass(frozen=True, slots=True)
class Dispatch:
    execution_id: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """Close the execution's upstream stream; the engine aborts it."""

    execution_id: int


@dataclass(frozen=True, slots=True)
class Notify:
    """Tell a subscriber about its execution: first_token, completed, or refused (with status)."""

    subscriber: Subscriber
    kind: str
    status: int = 200
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class SetTimer:
    at_s: float
    execution_id: int


Action = Dispatch | Cancel | Notify | SetTimer


@dataclass(slots=True)
class Execution:
    execution_id: int
    key: str
    creator: Subscriber
    created_s: float
    subscribers: set[Subscriber] = field(default_factory=set)
    state: str = "live"  # live | queued | completed | cancelled | refused | dropped
    first_token: bool = False
    abort_requested_s: float | None = None
    last_left_s: float | None = None


class ProxyCore:
    """Pass-through with a cancellation policy; overload controls plug in around `on_attempt`."""

    def __init__(self, policy: ProxyPolicy) -> None:
        self.policy = policy
        self.executions: dict[int, Execution] = {}
        self._by_subscriber: dict[Subscriber, int] = {}
        self._next_id = 0
        self.waiting = 0  # executions held in the proxy's own queue (none without a cap)

    def on_attempt(self, attempt: AttemptIn, now: float) -> Create:
        execution_id = self._next_id
        self._next_id += 1
        execution = Execution(execution_id, attempt.key, attempt.subscriber, now)
        execution.subscribers.add(attempt.subscriber)
        self.executions[execution_id] = execution
        self._by_subscriber[attempt.subscriber] = execution_id
        return Create(execution_id, dispatch=True)

    def on_subscriber_left(self, subscriber: Subscriber, now: float) -> list[Action]:
        """The client closed its connection (its deadline passed)."""
        execution_id = self._by_subscriber.pop(subscriber, None)
        if execution_id is None:
            return []
        execution = self.executions[execution_id]
        execution.subscribers.discard(subscriber)
        if execution.subscribers or execution.state != "live":
            return []
        execution.last_left_s = now
        mode = self.policy.cancellation
        if mode == "immediate":
            return [self._cancel(execution, now)]
        if mode == "deferred":
            return [SetTimer(now + self.policy.defer_s, execution_id)]
        return []  # off: keep reading for nobody; the execution is orphaned

    def on_timer(self, execution_id: int, now: float) -> list[Action]:
        execution = self.executions.get(execution_id)
        if self.policy.cancellation != "deferred":
            return []
        if execution is None or execution.state != "live" or execution.subscribers:
            return []
        if execution.last_left_s is None or now < execution.last_left_s + self.policy.defer_s:
            return []  # someone attached and left again since; a later timer covers that
        return [self._cancel(execution, now)]

    def on_engine_event(self, execution_id: int, kind: str, now: float) -> list[Action]:
        """The upstream stream produced its first token, completed, or was refused (503)."""
        execution = self.executions[execution_id]
        if execution.state != "live":
            return []
        if kind == "first_token":
            execution.first_token = True
        elif kind == "completed":
            execution.state = "completed"
        elif kind == "refused":
            execution.state = "refused"
        else:
            raise ValueError(f"unknown engine event {kind!r}")
        actions: list[Action] = []
        for subscriber in sorted(execution.subscribers):
            if kind == "refused":
                actions.append(Notify(subscriber, "refused", status=503))
            else:
                actions.append(Notify(subscriber, kind))
            if kind != "first_token":
                self._by_subscriber.pop(subscriber, None)
        if kind != "first_token":
            execution.subscribers.clear()
        return actions

    def _cancel(self, execution: Execution, now: float) -> Cancel:
        execution.state = "cancelled"
        execution.abort_requested_s = now
        return Cancel(execution.execution_id)
