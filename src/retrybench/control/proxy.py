"""The proxy's decisions, sans-IO: what happens to each attempt and to each execution.

`ProxyCore` never touches a socket or a clock. Its inputs are events with their time (an attempt
arrives, a subscriber leaves, the engine reports, a timer fires); its outputs are decisions for
the driver to carry out (dispatch an execution upstream, cancel it, tell a subscriber). The
simulator and the live proxy drive the same object.

The paper's vocabulary (Section 2): a call's attempts each become a *subscriber* of an
*execution*; when the last subscriber leaves, the cancellation policy leaves the execution
running (orphaned), cancels it at once, or cancels it `defer_s` later unless someone attached.

Beyond the paper, result retention (`retain_s`): a completed execution's response is kept under
its key for `retain_s`, and an attempt of that key arriving meanwhile is served from it. The core
decides what is kept and for how long from the response's size in bytes, which the driver reports;
the driver holds the bytes and frees them when told (`Retain`, `Release`).

Beyond the paper, deadline propagation (`deadline_propagation`, docs/deadlines.md): an attempt may
carry its absolute deadline (`AttemptIn.deadline_s`, else `default_deadline_s` after arrival). An
execution's deadline is the latest of its subscribers' (none if any has none). A `Create` or
`Attach` whose `expire_at_s` is set asks the driver to call `on_deadline` then; once the deadline has
passed, a queued execution is dropped and a running one cancelled, whatever `cancellation` says,
except that "deferred" starts its deferral there (a retry may still attach). `deadline_admission`
refuses (503) an attempt whose estimated last token comes after its deadline.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from retrybench.conditions.config import ProxyPolicy
from retrybench.control.budget import RetryBudget
from retrybench.control.estimate import WaitEstimator

__all__ = [
    "Action", "Attach", "AttemptIn", "Cancel", "Create", "Decision", "Dispatch", "Drop", "Execution", "Notify",
    "ProxyCore", "ProxyCounts", "Refuse", "Release", "Retain", "Serve", "SetTimer",
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
    deadline_s: float | None = None  # when its client gives up, on the core's clock (None: not said)

    @property
    def subscriber(self) -> Subscriber:
        return (self.call_index, self.attempt_no)


@dataclass(frozen=True, slots=True)
class Create:
    """A new execution for the attempt; `dispatch` False means it waits in the proxy's queue."""

    execution_id: int
    dispatch: bool = True
    expire_at_s: float | None = None  # call on_deadline(execution_id) at this time (deadline propagation)


@dataclass(frozen=True, slots=True)
class Attach:
    """The retry joins its call's live execution as a new subscriber; it receives the output from
    the start (`first_token` True: the first token is replayed at once), then live."""

    execution_id: int
    first_token: bool
    expire_at_s: float | None = None  # the execution's deadline moved later: call on_deadline then


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer the attempt at once: 429 (retry budget, with Retry-After) or 503 (deadline check), or
    the status and headers the policy configures for that source. `live` says whether the call still
    had a live execution (budget-first refusals); `no_retry` asks for `x-should-retry: false`;
    `source` is what refused: "budget", "deadline" or "breaker"."""

    status: int
    retry_after_s: float | None = None
    live: bool = False
    no_retry: bool = False
    source: str = field(default="", compare=False)  # who refused, for the run log: not part of the answer


@dataclass(frozen=True, slots=True)
class Serve:
    """Answer the attempt at once with its call's retained response (the execution that computed
    it completed earlier, maybe with nobody subscribed)."""

    execution_id: int


Decision = Create | Attach | Refuse | Serve


@dataclass(frozen=True, slots=True)
class Drop:
    """A queued execution whose subscribers all left: it never reaches the engine."""

    execution_id: int


@dataclass(frozen=True, slots=True)
class Dispatch:
    execution_id: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """Close the execution's upstream stream; the engine aborts it."""

    execution_id: int


@dataclass(frozen=True, slots=True)
class Notify:
    """Tell a subscriber about its execution: first_token, completed, or refused (with status, and
    the headers the policy configures for the engine's refusals)."""

    subscriber: Subscriber
    kind: str
    status: int = 200
    retry_after_s: float | None = None
    no_retry: bool = False


@dataclass(frozen=True, slots=True)
class SetTimer:
    at_s: float
    execution_id: int


@dataclass(frozen=True, slots=True)
class Retain:
    """Keep the completed execution's response: an attempt of its key may be served from it."""

    execution_id: int


@dataclass(frozen=True, slots=True)
class Release:
    """Free a retained response: its window passed, or room was needed for a newer one."""

    execution_id: int


Action = Dispatch | Cancel | Notify | SetTimer | Drop | Retain | Release


@dataclass(frozen=True, slots=True)
class _Kept:
    execution_id: int
    until_s: float  # served while now < until_s
    size: int  # bytes, as the driver reported them


@dataclass(slots=True)
class Execution:
    execution_id: int
    key: str
    creator: Subscriber
    created_s: float
    prompt_tokens: int
    subscribers: set[Subscriber] = field(default_factory=set)
    state: str = "live"  # live (in the engine) | queued (in the proxy) | completed | cancelled | refused | dropped
    first_token: bool = False
    abort_requested_s: float | None = None
    last_left_s: float | None = None
    attached: int = 0
    deadline_s: float | None = None  # the latest of its subscribers' deadlines (None: one had none)
    max_tokens: int = 0
    first_token_s: float | None = None


@dataclass(slots=True)
class ProxyCounts:
    retries_refused: int = 0  # by the budget (429)
    retries_refused_live: int = 0  # of which the call still had a live execution
    retries_attached: int = 0
    deadline_refused: int = 0  # by the deadline check (503)
    executions_dropped: int = 0
    executions_cancelled: int = 0
    served_retained: int = 0  # attempts answered from a retained response
    results_retained: int = 0
    retained_expired: int = 0
    retained_evicted: int = 0  # released early to stay within retain_max_bytes
    retain_too_large: int = 0  # completed responses over retain_result_max_bytes, not kept
    deadline_admission_refused: int = 0  # 503: estimated to end after the attempt's deadline
    deadline_dropped: int = 0  # queued executions dropped at their deadline (also in executions_dropped)
    deadline_cancelled: int = 0  # running executions cancelled at their deadline (also in executions_cancelled)


class ProxyCore:
    """Every control of the paper's Table 1 on one attempt path (Figure 2b): key, budget and lookup
    in the configured order, the deadline check, the proxy queue, then the cancellation policy."""

    def __init__(self, policy: ProxyPolicy) -> None:
        self.policy = policy
        self.executions: dict[int, Execution] = {}
        self.counts = ProxyCounts()
        self.budget = RetryBudget(policy.budget_ratio, policy.budget_window_s) if policy.retry_budget else None
        self.estimator = WaitEstimator()
        self._by_subscriber: dict[Subscriber, int] = {}
        self._live_by_key: dict[str, int] = {}
        self._queue: deque[int] = deque()
        self._retained: OrderedDict[str, _Kept] = OrderedDict()  # by key, oldest completion first
        self.retained_bytes = 0
        self._outstanding = 0  # executions with an open upstream stream (dispatched, not ended or cancelled)
        self._next_id = 0

    @property
    def waiting(self) -> int:
        """Executions held in the proxy's own queue."""
        return len(self._queue)

    @property
    def outstanding(self) -> int:
        return self._outstanding

    @property
    def retained_results(self) -> int:
        """Completed responses kept (some may have expired, not yet released)."""
        return len(self._retained)

    # -- attempts -------------------------------------------------------------------------------

    def on_attempt(self, attempt: AttemptIn, now: float, engine_waiting: int = 0) -> Decision:
        """Decide an attempt. engine_waiting is the engine's waiting gauge as the proxy last saw it."""
        policy = self.policy
        is_retry = attempt.attempt_no > 0
        budget = self.budget
        if budget is not None and not is_retry:
            budget.first_attempt(now)
        kept = self._retained.get(attempt.key) if self._retained else None
        if kept is not None and now < kept.until_s:  # costs the engine nothing: before the budget
            self.counts.served_retained += 1
            return Serve(kept.execution_id)
        live = self._lookup(attempt.key) if policy.coalescing else None
        if budget is not None and is_retry and policy.order == "budget-first" and not budget.try_retry(now):
            return self._refuse_retry(attempt, now, engine_waiting, live is not None)
        if live is not None:
            return self._attach(live, attempt, now)
        if budget is not None and is_retry and policy.order == "lookup-first" and not budget.try_retry(now):
            return self._refuse_retry(attempt, now, engine_waiting, False)
        if policy.deadline_check:
            wait = self.estimator.wait_s(now, len(self._queue) + engine_waiting, attempt.prompt_tokens)
            if wait > policy.attempt_deadline_s:
                self.counts.deadline_refused += 1
                return Refuse(policy.deadline_status, retry_after_s=wait if policy.deadline_retry_after else None,
                              no_retry=policy.deadline_no_retry, source="deadline")
        if policy.deadline_admission and self._misses_deadline(attempt, now, engine_waiting):
            self.counts.deadline_admission_refused += 1
            wait = self.estimator.wait_s(now, len(self._queue) + engine_waiting, attempt.prompt_tokens)
            return Refuse(policy.deadline_status, retry_after_s=wait if policy.deadline_retry_after else None,
                          no_retry=policy.deadline_no_retry, source="deadline")
        return self._create(attempt, now)

    def _deadline_of(self, attempt: AttemptIn, now: float) -> float | None:
        """The attempt's deadline as the proxy holds it: its own, else the policy's default, else none."""
        if attempt.deadline_s is not None:
            return attempt.deadline_s
        default = self.policy.default_deadline_s
        return None if default is None else now + default

    def _misses_deadline(self, attempt: AttemptIn, now: float, engine_waiting: int) -> bool:
        deadline = self._deadline_of(attempt, now)
        if deadline is None:
            return False
        ahead = len(self._queue) + engine_waiting
        return now + self.estimator.last_token_s(now, ahead, attempt.prompt_tokens, attempt.max_tokens) > deadline

    def holds(self, key: str, now: float) -> bool:
        """Whether an attempt of `key` would be answered from what the proxy already holds (its call's
        execution, live or queued, with coalescing on; or its retained response): a draining proxy
        takes such attempts and refuses the rest."""
        kept = self._retained.get(key) if self._retained else None
        if kept is not None and now < kept.until_s:
            return True
        return self.policy.coalescing and self._lookup(key) is not None

    def _lookup(self, key: str) -> Execution | None:
        execution_id = self._live_by_key.get(key)
        if execution_id is None:
            return None
        execution = self.executions[execution_id]
        return execution if execution.state in ("live", "queued") else None

    def _refuse_retry(self, attempt: AttemptIn, now: float, engine_waiting: int, live: bool) -> Refuse:
        self.counts.retries_refused += 1
        self.counts.retries_refused_live += live
        policy = self.policy
        retry_after = self.estimator.wait_s(now, len(self._queue) + engine_waiting, attempt.prompt_tokens)
        return Refuse(policy.budget_status, retry_after_s=retry_after if policy.budget_retry_after else None,
                      live=live, no_retry=policy.budget_no_retry, source="budget")

    def _attach(self, execution: Execution, attempt: AttemptIn, now: float) -> Attach:
        execution.subscribers.add(attempt.subscriber)
        execution.attached += 1
        self._by_subscriber[attempt.subscriber] = execution.execution_id
        self.counts.retries_attached += 1
        expire_at = None
        if self.policy.deadline_propagation and execution.deadline_s is not None:
            deadline = self._deadline_of(attempt, now)
            if deadline is None or deadline > execution.deadline_s:
                execution.deadline_s = deadline
                expire_at = deadline
        return Attach(execution.execution_id, execution.first_token, expire_at_s=expire_at)

    def _create(self, attempt: AttemptIn, now: float) -> Create:
        execution_id = self._next_id
        self._next_id += 1
        subscriber = attempt.subscriber
        execution = Execution(execution_id, attempt.key, subscriber, now, attempt.prompt_tokens, {subscriber})
        self.executions[execution_id] = execution
        self._by_subscriber[subscriber] = execution_id
        self._live_by_key[attempt.key] = execution_id
        expire_at = None
        if self.policy.deadline_propagation:
            execution.deadline_s = expire_at = self._deadline_of(attempt, now)
            execution.max_tokens = attempt.max_tokens
        cap = self.policy.max_outstanding
        if cap is None or self._outstanding < cap:
            self._outstanding += 1
            return Create(execution_id, dispatch=True, expire_at_s=expire_at)
        execution.state = "queued"
        self._queue.append(execution_id)
        return Create(execution_id, dispatch=False, expire_at_s=expire_at)

    # -- subscribers leave, timers fire ---------------------------------------------------------

    def on_subscriber_left(self, subscriber: Subscriber, now: float) -> list[Action]:
        """The client closed its connection (its deadline passed)."""
        execution_id = self._by_subscriber.pop(subscriber, None)
        if execution_id is None:
            return []
        execution = self.executions[execution_id]
        execution.subscribers.discard(subscriber)
        if execution.subscribers:
            return []
        if execution.state == "queued":
            # Nobody waits for it: it leaves the proxy's queue without reaching the engine.
            self._queue.remove(execution_id)
            self._end(execution, "dropped")
            self.counts.executions_dropped += 1
            return [Drop(execution_id)]
        if execution.state != "live":
            return []
        execution.last_left_s = now
        mode = self.policy.cancellation
        if mode == "immediate":
            return self._cancel(execution, now)
        if mode == "deferred":
            return [SetTimer(now + self.policy.defer_s, execution_id)]
        return []  # off: keep reading for nobody; the execution is orphaned

    def on_timer(self, execution_id: int, now: float) -> list[Action]:
        """A deferred cancellation is due: cancel unless someone attached since the last left."""
        execution = self.executions.get(execution_id)
        if self.policy.cancellation != "deferred":
            return []
        if execution is None or execution.state != "live" or execution.subscribers:
            return []
        if execution.last_left_s is None or now < execution.last_left_s + self.policy.defer_s:
            return []  # someone attached and left again since; a later timer covers that
        return self._cancel(execution, now)

    def on_deadline(self, execution_id: int, now: float) -> list[Action]:
        """An execution's deadline timer fired: once every subscriber's deadline has passed, drop it
        from the queue or stop it in the engine; with deferred cancellation, the deferral starts here.
        Subscribers still attached are told (503): their client gives up now."""
        execution = self.executions.get(execution_id)
        if not self.policy.deadline_propagation or execution is None or execution.deadline_s is None:
            return []
        if now < execution.deadline_s or execution.state not in ("live", "queued"):
            return []  # a later subscriber moved the deadline (its own timer covers it), or it ended
        actions: list[Action] = [Notify(subscriber, "refused", status=503)
                                 for subscriber in sorted(execution.subscribers)]
        for subscriber in execution.subscribers:
            self._by_subscriber.pop(subscriber, None)
        execution.subscribers.clear()
        if execution.state == "queued":
            self._queue.remove(execution_id)
            self._end(execution, "dropped")
            self.counts.executions_dropped += 1
            self.counts.deadline_dropped += 1
            return [*actions, Drop(execution_id)]
        execution.last_left_s = now
        if self.policy.cancellation == "deferred":
            return [*actions, SetTimer(now + self.policy.defer_s, execution_id)]
        self.counts.deadline_cancelled += 1
        return actions + self._cancel(execution, now)

    # -- the engine reports ----------------------------------------------------------------------

    def on_engine_event(self, execution_id: int, kind: str, now: float,
                        result_bytes: int | None = None, engine_waiting: int = 0) -> list[Action]:
        """The upstream stream produced its first token, completed, or was refused (503).

        `result_bytes` is the size of a completed execution's whole response where it can be
        served again (an HTTP 200); with retention on, the response is kept if it fits. An engine's
        refusal is relayed with the policy's engine_status and headers (its Retry-After estimated from
        `engine_waiting`, the engine's waiting gauge)."""
        execution = self.executions[execution_id]
        if execution.state != "live":
            return []
        if kind == "first_token":
            execution.first_token = True
            execution.first_token_s = now
            self.estimator.observe_first_token(now, execution.prompt_tokens)
            return [Notify(subscriber, "first_token") for subscriber in sorted(execution.subscribers)]
        if kind not in ("completed", "refused"):
            raise ValueError(f"unknown engine event {kind!r}")
        actions: list[Action]
        if kind == "refused":
            actions = self._relay_refusal(execution, now, engine_waiting)
        else:
            actions = [Notify(subscriber, kind) for subscriber in sorted(execution.subscribers)]
        for subscriber in execution.subscribers:
            self._by_subscriber.pop(subscriber, None)
        execution.subscribers.clear()
        self._end(execution, kind)
        self._outstanding -= 1
        if kind == "completed" and self.policy.deadline_admission and execution.first_token_s is not None:
            self.estimator.observe_completion(now, execution.first_token_s, execution.max_tokens)
        if kind == "completed" and result_bytes is not None and self.policy.retain_s > 0:
            actions += self._retain(execution, result_bytes, now)
        return actions + self._dispatch_next()

    def expire(self, now: float) -> list[Action]:
        """Release the retained responses whose window has passed (a driver calls this now and
        then so that their bytes do not wait for the next completion to be freed)."""
        actions: list[Action] = []
        retained = self._retained
        while retained:
            key, kept = next(iter(retained.items()))
            if now < kept.until_s:
                break  # every window has the same length: the oldest completion expires first
            del retained[key]
            self.retained_bytes -= kept.size
            self.counts.retained_expired += 1
            actions.append(Release(kept.execution_id))
        return actions

    def forget(self, execution_id: int) -> None:
        """Drop an ended execution's record (a long-running proxy must not keep them all). Live
        and queued executions are kept: they still have decisions to come."""
        execution = self.executions.get(execution_id)
        if execution is not None and execution.state not in ("live", "queued"):
            del self.executions[execution_id]

    # -- helpers ---------------------------------------------------------------------------------

    def _relay_refusal(self, execution: Execution, now: float, engine_waiting: int) -> list[Action]:
        """The engine's refusal as the policy answers it: its status, Retry-After and x-should-retry."""
        policy = self.policy
        retry_after = (self.estimator.wait_s(now, len(self._queue) + engine_waiting, execution.prompt_tokens)
                       if policy.engine_retry_after else None)
        return [Notify(subscriber, "refused", status=policy.engine_status, retry_after_s=retry_after,
                       no_retry=policy.engine_no_retry) for subscriber in sorted(execution.subscribers)]

    def _retain(self, execution: Execution, size: int, now: float) -> list[Action]:
        policy = self.policy
        actions = self.expire(now)
        if size > policy.retain_result_max_bytes or size > policy.retain_max_bytes:
            self.counts.retain_too_large += 1
            return actions
        older = self._retained.pop(execution.key, None)
        if older is not None:  # an earlier execution of the same call: the newer response replaces it
            self.retained_bytes -= older.size
            actions.append(Release(older.execution_id))
        while self.retained_bytes + size > policy.retain_max_bytes:
            _key, evicted = self._retained.popitem(last=False)
            self.retained_bytes -= evicted.size
            self.counts.retained_evicted += 1
            actions.append(Release(evicted.execution_id))
        self._retained[execution.key] = _Kept(execution.execution_id, now + policy.retain_s, size)
        self.retained_bytes += size
        self.counts.results_retained += 1
        actions.append(Retain(execution.execution_id))
        return actions

    def _cancel(self, execution: Execution, now: float) -> list[Action]:
        execution.abort_requested_s = now
        self._end(execution, "cancelled")
        self.counts.executions_cancelled += 1
        self._outstanding -= 1
        cancel = Cancel(execution.execution_id)
        return [cancel, *self._dispatch_next()] if self._queue else [cancel]

    def _end(self, execution: Execution, state: str) -> None:
        execution.state = state
        if self._live_by_key.get(execution.key) == execution.execution_id:
            del self._live_by_key[execution.key]

    def _dispatch_next(self) -> list[Action]:
        """Fill free engine slots from the queue: FIFO, or newest first while over the threshold."""
        cap = self.policy.max_outstanding
        actions: list[Action] = []
        lifo = self.policy.queue_order == "lifo"
        while self._queue and (cap is None or self._outstanding < cap):
            newest_first = lifo and len(self._queue) > self.policy.lifo_threshold
            execution_id = self._queue.pop() if newest_first else self._queue.popleft()
            self.executions[execution_id].state = "live"
            self._outstanding += 1
            actions.append(Dispatch(execution_id))
        return actions

