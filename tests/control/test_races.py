"""Races in virtual time: ProxyCore fed events that share one instant, in both orders.

Events of one instant reach the core in an order its drivers choose (the simulator by event kind,
the live proxy by arrival), so each race is played both ways. A small model of the proxy's rules
predicts every decision and action; one checker compares the core with it after every step and
holds the invariants that must survive any interleaving. Calls 0 and 1 are the same call id and
body sent under two API keys: their keys come from `call_identity` and `coalescing_key`, as the
live proxy builds them, so every run also checks that tenants never share an execution or a
retained response.

Only one order independence is asserted: `expire` and `forget` are housekeeping (the core keeps
deciding the same whenever a driver calls them). The core promises nothing about two attempts of one
instant swapping places: execution ids, the queue and the budget depend on arrival order.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrybench.conditions.config import ProxyPolicy
from retrybench.control.proxy import (
    Action,
    Attach,
    AttemptIn,
    Cancel,
    Create,
    Decision,
    Dispatch,
    Drop,
    Notify,
    ProxyCore,
    Refuse,
    Release,
    Retain,
    Serve,
    SetTimer,
)
from retrybench.serving.openai_api import call_digest, call_identity, coalescing_key

Subscriber = tuple[int, int]
Op = tuple[str, int, int]
Step = Callable[["Race"], object]

DEFER_S = 2.0
RETAIN_S = 3.0
STEPS_S = (0.5, 1.0, DEFER_S, RETAIN_S)  # on a 0.5 s lattice: timers and windows meet other events exactly
RACE_S = 1.0  # when a scenario's race happens
MAX_BYTES = 4  # all retained responses; sizes 1-4 fill it, evict, or exceed RESULT_MAX_BYTES
RESULT_MAX_BYTES = 3
LIVE = ("live", "queued")
ENDS = ("completed", "refused")
COMBOS = list(itertools.product(("off", "immediate", "deferred"), (False, True), (False, True), (False, True)))
COMBO_IDS = [f"{c}-{'coal' if co else 'nocoal'}-{'keep' if r else 'nokeep'}-{'budget' if b else 'nobudget'}"
             for c, co, r, b in COMBOS]
RACE_SETTINGS = settings(max_examples=25, deadline=None)


def tenant_keys(auth_a: str = "Bearer key-a", auth_b: str = "Bearer key-b") -> list[str]:
    """Keys of three calls: 0 and 1 the same call id and body under two API keys, 2 another call of
    tenant a."""
    body = b'{"model": "m", "prompt": "hello", "max_tokens": 8}'
    keys = []
    for auth, call_id in ((auth_a, "call-42"), (auth_b, "call-42"), (auth_a, "call-7")):
        tenant, given_id = call_identity({"Authorization": auth, "Idempotency-Key": call_id})
        assert given_id == call_digest(call_id)  # the proxy keeps a digest, never the key in clear
        keys.append(coalescing_key(tenant, given_id, "/v1/completions", body))
    return keys


# -- the model ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """The model's view of one execution."""

    key: str
    state: str  # live | queued | completed | refused | cancelled | dropped
    subscribers: set[Subscriber] = field(default_factory=set)
    first_token: bool = False
    last_left_s: float | None = None
    forgotten: bool = False


@dataclass(frozen=True, slots=True)
class Kept:
    execution_id: int
    until_s: float
    size: int


class Model:
    """The proxy's rules stated directly, one input at a time: what the core must decide and do."""

    def __init__(self, policy: ProxyPolicy, keys: Sequence[str]) -> None:
        self.policy = policy
        self.keys = list(keys)
        self.now = 0.0
        self.runs: dict[int, Run] = {}
        self.queue: list[int] = []
        self.kept: OrderedDict[str, Kept] = OrderedDict()  # by completion, oldest first
        self.attached: dict[Subscriber, int] = {}
        self.ended: dict[Subscriber, str] = {}  # how it ended: completed, refused, 429/503, served, left
        self.next_id = 0
        self.firsts = 0
        self.admitted = 0

    # -- counts --------------------------------------------------------------------------------

    def live_count(self) -> int:
        return sum(run.state == "live" for run in self.runs.values())

    def live_of(self, key: str) -> int | None:
        return next((e for e, run in self.runs.items() if run.key == key and run.state in LIVE), None)

    # -- attempts ------------------------------------------------------------------------------

    def decide(self, attempt: AttemptIn) -> Decision:
        """Kept response, then budget and lookup in the configured order, then a new execution."""
        policy = self.policy
        retry = attempt.attempt_no > 0
        budget = policy.retry_budget and retry
        if policy.retry_budget and not retry:
            self.firsts += 1
        kept = self.kept.get(attempt.key)
        if kept is not None and self.now < kept.until_s:
            self.ended[attempt.subscriber] = "served"
            return Serve(kept.execution_id)
        live = self.live_of(attempt.key) if policy.coalescing else None
        if budget and policy.order == "budget-first" and not self._admit():
            self.ended[attempt.subscriber] = "429"
            return Refuse(429, live=live is not None)
        if live is not None:
            return self._attach(attempt, live)
        if budget and policy.order == "lookup-first" and not self._admit():
            self.ended[attempt.subscriber] = "429"
            return Refuse(429)
        return self._create(attempt)

    def _admit(self) -> bool:
        """The budget with a window longer than any run here: nothing expires."""
        if self.admitted + 1 <= self.policy.budget_ratio * self.firsts:
            self.admitted += 1
            return True
        return False

    def _attach(self, attempt: AttemptIn, execution_id: int) -> Attach:
        run = self.runs[execution_id]
        run.subscribers.add(attempt.subscriber)
        self.attached[attempt.subscriber] = execution_id
        return Attach(execution_id, run.first_token)

    def _create(self, attempt: AttemptIn) -> Create:
        execution_id = self.next_id
        self.next_id += 1
        cap = self.policy.max_outstanding
        dispatch = cap is None or self.live_count() < cap
        self.runs[execution_id] = Run(attempt.key, "live" if dispatch else "queued", {attempt.subscriber})
        if not dispatch:
            self.queue.append(execution_id)
        self.attached[attempt.subscriber] = execution_id
        return Create(execution_id, dispatch)

    # -- subscribers leave, timers fire --------------------------------------------------------

    def leave(self, subscriber: Subscriber) -> list[Action]:
        execution_id = self.attached.pop(subscriber, None)
        if execution_id is None:
            return []
        self.ended[subscriber] = "left"
        run = self.runs[execution_id]
        run.subscribers.discard(subscriber)
        if run.subscribers:
            return []
        if run.state == "queued":
            self.queue.remove(execution_id)
            run.state = "dropped"
            return [Drop(execution_id)]
        run.last_left_s = self.now
        if self.policy.cancellation == "immediate":
            return self._cancel(execution_id)
        if self.policy.cancellation == "deferred":
            return [SetTimer(self.now + self.policy.defer_s, execution_id)]
        return []

    def timer(self, execution_id: int) -> list[Action]:
        run = self.runs.get(execution_id)
        if self.policy.cancellation != "deferred" or run is None or run.state != "live" or run.subscribers:
            return []
        if run.last_left_s is None or self.now < run.last_left_s + self.policy.defer_s:
            return []
        return self._cancel(execution_id)

    def _cancel(self, execution_id: int) -> list[Action]:
        self.runs[execution_id].state = "cancelled"
        return [Cancel(execution_id), *self._dispatch()]

    def _dispatch(self) -> list[Action]:
        cap = self.policy.max_outstanding
        actions: list[Action] = []
        while self.queue and (cap is None or self.live_count() < cap):
            newest = self.policy.queue_order == "lifo" and len(self.queue) > self.policy.lifo_threshold
            execution_id = self.queue.pop() if newest else self.queue.pop(0)
            self.runs[execution_id].state = "live"
            actions.append(Dispatch(execution_id))
        return actions

    # -- the engine reports --------------------------------------------------------------------

    def engine(self, execution_id: int, kind: str, size: int | None) -> list[Action]:
        run = self.runs[execution_id]
        if run.state != "live":
            return []  # e.g. cancelled, its abort not yet at the engine: the output reaches nobody
        if kind == "first_token":
            run.first_token = True
            return [Notify(s, kind) for s in sorted(run.subscribers)]
        actions: list[Action] = [Notify(s, kind, status=503 if kind == "refused" else 200)
                                 for s in sorted(run.subscribers)]
        for subscriber in run.subscribers:
            del self.attached[subscriber]
            self.ended[subscriber] = kind
        run.subscribers.clear()
        run.state = kind
        if kind == "completed" and size is not None and self.policy.retain_s > 0:
            actions += self._retain(execution_id, size)
        return actions + self._dispatch()

    def _retain(self, execution_id: int, size: int) -> list[Action]:
        actions = self.expire()
        if size > self.policy.retain_result_max_bytes or size > self.policy.retain_max_bytes:
            return actions
        key = self.runs[execution_id].key
        older = self.kept.pop(key, None)
        if older is not None:
            actions.append(Release(older.execution_id))
        while sum(k.size for k in self.kept.values()) + size > self.policy.retain_max_bytes:
            _key, evicted = self.kept.popitem(last=False)
            actions.append(Release(evicted.execution_id))
        self.kept[key] = Kept(execution_id, self.now + self.policy.retain_s, size)
        return [*actions, Retain(execution_id)]

    def expire(self) -> list[Action]:
        """Every kept response whose window has passed, oldest first (all of them, not only a prefix)."""
        gone = [key for key, kept in self.kept.items() if self.now >= kept.until_s]
        return [Release(self.kept.pop(key).execution_id) for key in gone]


# -- the checker -------------------------------------------------------------------------------------


def check(race: Race, actions: Sequence[Action] = ()) -> None:
    """Every invariant, after every step: the step's actions, then the core's state against the model."""
    _check_actions(race, actions)
    _check_subscribers(race)
    _check_executions(race)
    _check_counts(race)
    _check_retained(race)


def _check_actions(race: Race, actions: Sequence[Action]) -> None:
    core, policy = race.core, race.model.policy
    for action in actions:
        if isinstance(action, Cancel):
            execution = core.executions[action.execution_id]
            assert policy.cancellation != "off", "cancellation off never cancels"
            assert execution.state == "cancelled" and not execution.subscribers, "cancelled with a subscriber"
        elif isinstance(action, Drop):
            execution = core.executions[action.execution_id]
            assert execution.state == "dropped" and not execution.subscribers, "dropped with a subscriber"
        elif isinstance(action, SetTimer):
            assert policy.cancellation == "deferred" and action.at_s == race.now + policy.defer_s
            assert not core.executions[action.execution_id].subscribers
        elif isinstance(action, Notify) and action.kind in ENDS:
            assert all(action.subscriber not in e.subscribers for e in core.executions.values())
        elif isinstance(action, Retain):
            assert core.executions[action.execution_id].state == "completed"


def _check_subscribers(race: Race) -> None:
    """Each subscriber is attached to exactly one live or queued execution of its own key, or has
    ended (notified, refused, served, or left): never both, never neither."""
    core, model = race.core, race.model
    holders: dict[Subscriber, list[int]] = {}
    for execution in core.executions.values():
        for subscriber in execution.subscribers:
            holders.setdefault(subscriber, []).append(execution.execution_id)
            assert execution.state in LIVE, f"{subscriber} is on an execution that is {execution.state}"
            assert execution.key == model.keys[subscriber[0]], "an execution shared across keys (tenants)"
    for subscriber, execution_id in model.attached.items():
        assert holders.get(subscriber) == [execution_id], f"{subscriber} must be on {execution_id} alone"
    for subscriber in model.ended:
        assert subscriber not in holders, f"{subscriber} ended ({model.ended[subscriber]}) yet is attached"
    assert not model.attached.keys() & model.ended.keys()
    assert set(holders) == set(model.attached)
    assert len(model.attached) + len(model.ended) == sum(race.attempts)


def _check_executions(race: Race) -> None:
    core, model = race.core, race.model
    for execution_id, run in model.runs.items():
        if run.forgotten:
            assert execution_id not in core.executions
            continue
        execution = core.executions[execution_id]
        assert (execution.state, execution.key, execution.subscribers) == (run.state, run.key, run.subscribers)
    if model.policy.coalescing:
        live_keys = [e.key for e in core.executions.values() if e.state in LIVE]
        assert len(live_keys) == len(set(live_keys)), "two live executions of one key while coalescing"


def _check_counts(race: Race) -> None:
    core, model = race.core, race.model
    assert core.outstanding == model.live_count()
    assert core.waiting == len(model.queue)
    cap = model.policy.max_outstanding
    if cap is not None:
        assert core.outstanding <= cap
        assert not model.queue or core.outstanding == cap, "an execution waits while the engine has room"


def _check_retained(race: Race) -> None:
    """Every Retain is released once or still held; the bytes are the held ones', within the bound."""
    core, model = race.core, race.model
    held = {kept.execution_id: kept.size for kept in model.kept.values()}
    assert race.held == set(held), "the Retain/Release stream disagrees with what is kept"
    assert race.retained == race.held | race.released and not race.held & race.released
    assert core.retained_results == len(held)
    assert core.retained_bytes == sum(held.values()) <= model.policy.retain_max_bytes


# -- the harness -------------------------------------------------------------------------------------


class Race:
    """A ProxyCore and its model fed the same inputs at the same virtual time."""

    def __init__(self, policy: ProxyPolicy, keys: Sequence[str]) -> None:
        self.core = ProxyCore(policy)
        self.model = Model(policy, keys)
        self.now = 0.0
        self.attempts = [0] * len(keys)
        self.timers: list[SetTimer] = []  # set by the core, not yet fired
        self.retained: set[int] = set()  # every execution the core said to retain
        self.held: set[int] = set()
        self.released: set[int] = set()
        self.first_token_seen: set[Subscriber] = set()  # told of the first token, live or replayed
        self.trace: list[object] = []  # decisions and actions, in order

    # -- inputs ----------------------------------------------------------------------------------

    def attempt(self, call: int) -> Decision:
        no = self.attempts[call]
        self.attempts[call] += 1
        attempt = AttemptIn(call, no, self.model.keys[call], prompt_tokens=100, max_tokens=10)
        expected = self.model.decide(attempt)
        decision = self.core.on_attempt(attempt, self.now)
        self.trace.append(decision)
        assert _plain(decision) == expected, f"{attempt.subscriber} at {self.now}"
        if isinstance(decision, Attach | Serve):
            target = self.core.executions.get(decision.execution_id)
            assert target is None or target.key == attempt.key, "joined another key's execution"
        if isinstance(decision, Attach):
            assert self.core.executions[decision.execution_id].state in LIVE, "attached to an ended execution"
            if decision.first_token:
                self.first_token_seen.add(attempt.subscriber)
        if isinstance(decision, Serve):
            assert decision.execution_id in self.held, "served a response that is not held"
            assert target is None or target.state == "completed", "served an execution that did not complete"
        check(self)
        return decision

    def leave(self, subscriber: Subscriber) -> list[Action]:
        return self._step(self.model.leave(subscriber), self.core.on_subscriber_left(subscriber, self.now))

    def engine(self, execution_id: int, kind: str, size: int | None = None) -> list[Action]:
        expected = self.model.engine(execution_id, kind, size)
        return self._step(expected, self.core.on_engine_event(execution_id, kind, self.now, size))

    def timer(self, execution_id: int, stray: bool = False) -> list[Action]:
        """Fire the execution's timer due now; `stray` (or with none due) fires one the core did not
        set, as a driver that armed a timer twice would."""
        due = [t for t in self.timers if t.execution_id == execution_id and t.at_s <= self.now]
        if due and not stray:
            self.timers.remove(due[0])
        run = self.model.runs.get(execution_id)
        gone = run is None or run.forgotten or run.state not in LIVE
        actions = self._step(self.model.timer(execution_id), self.core.on_timer(execution_id, self.now))
        assert not (gone and actions), "a timer of an execution that is gone acted"
        return actions

    def expire(self) -> list[Action]:
        return self._step(self.model.expire(), self.core.expire(self.now))

    def forget(self, execution_id: int) -> None:
        run = self.model.runs[execution_id]
        self.core.forget(execution_id)
        run.forgotten = run.state not in LIVE
        self.trace.append(("forget", execution_id))
        check(self)

    def advance(self, dt: float) -> None:
        """Move time on, firing on the way each timer due before the new instant; those due at it
        stay pending, so that other events of that instant can come before them."""
        target = self.now + dt
        while pending := sorted((t.at_s, t.execution_id) for t in self.timers if t.at_s < target):
            self._at(pending[0][0])
            self.timer(pending[0][1])
        self._at(target)

    def _at(self, now: float) -> None:
        assert now >= self.now
        self.now = self.model.now = now

    def _step(self, expected: list[Action], actions: list[Action]) -> list[Action]:
        self.trace.extend(actions)
        self._settle(actions)
        check(self, actions)
        assert actions == expected, f"at {self.now}"
        return actions

    def _settle(self, actions: Sequence[Action]) -> None:
        """What a driver does with the actions: arm timers, hold and free retained responses."""
        for action in actions:
            if isinstance(action, SetTimer):
                assert action.at_s >= self.now, "a timer set in the past"
                self.timers.append(action)
            elif isinstance(action, Retain):
                assert action.execution_id not in self.retained, "retained twice"
                self.retained.add(action.execution_id)
                self.held.add(action.execution_id)
            elif isinstance(action, Release):
                assert action.execution_id in self.held, "released what is not held"
                self.held.remove(action.execution_id)
                self.released.add(action.execution_id)
            elif isinstance(action, Notify) and action.kind == "first_token":
                assert action.subscriber not in self.first_token_seen, "told of the first token twice"
                self.first_token_seen.add(action.subscriber)

    # -- random inputs ---------------------------------------------------------------------------

    def play(self, ops: Sequence[Op]) -> None:
        for op in ops:
            self.op(op)

    def op(self, op: Op) -> None:
        """One input picked by (kind, a, b); one that does not apply now is skipped."""
        kind, a, b = op
        model = self.model
        live = sorted(e for e, run in model.runs.items() if run.state == "live")
        if kind == "attempt":
            self.attempt(a % len(self.attempts))
        elif kind == "leave":
            choices = sorted(model.attached) if b else sorted(model.attached) + sorted(model.ended)
            if choices:
                self.leave(choices[a % len(choices)])
        elif kind == "first" and live:
            execution_id = live[a % len(live)]
            if not model.runs[execution_id].first_token:
                self.engine(execution_id, "first_token")
        elif kind == "complete" and live:
            self.engine(live[a % len(live)], "completed", b or None)
        elif kind == "refuse" and live:
            self.engine(live[a % len(live)], "refused")
        elif kind == "late":
            cancelled = sorted(e for e, run in model.runs.items() if run.state == "cancelled" and not run.forgotten)
            if cancelled:
                self.engine(cancelled[a % len(cancelled)], ("first_token", "completed", "refused")[b % 3], 1)
        elif kind == "advance":
            self.advance(STEPS_S[b % len(STEPS_S)])
        elif kind == "fire" and (due := [t for t in self.timers if t.at_s <= self.now]):
            self.timer(due[a % len(due)].execution_id)  # timers due at one instant, in any order
        elif kind == "stray":
            self.timer(a % (model.next_id + 2), stray=True)  # maybe an id never created
        elif kind == "expire":
            self.expire()
        elif kind == "forget" and model.runs:
            self.forget(sorted(model.runs)[a % len(model.runs)])


def _plain(decision: Decision) -> Decision:
    """The decision without its Retry-After: that is the wait estimator's, not modelled here."""
    if isinstance(decision, Refuse):
        assert decision.status == 429 and decision.retry_after_s is not None
        return replace(decision, retry_after_s=None)
    return decision


# -- strategies --------------------------------------------------------------------------------------

OP_KINDS = ("attempt", "attempt", "leave", "first", "complete", "refuse", "late", "advance", "advance", "fire",
            "stray", "expire", "forget")
ops_st = st.lists(st.tuples(st.sampled_from(OP_KINDS), st.integers(0, 7), st.integers(0, 4)), max_size=25)


@st.composite
def policies(draw: st.DrawFn, combo: tuple[str, bool, bool, bool]) -> ProxyPolicy:
    """The combination under test, with the settings around it drawn: delay, queue cap and order,
    budget ratio and order."""
    cancellation, coalescing, retention, budget = combo
    cap = draw(st.sampled_from([None, 1, 2]))
    return ProxyPolicy(
        cancellation=cancellation, defer_s=draw(st.sampled_from([0.0, DEFER_S])), coalescing=coalescing,
        retry_budget=budget, budget_ratio=draw(st.sampled_from([0.0, 0.5, 1.0])), budget_window_s=1e6,
        order=draw(st.sampled_from(["budget-first", "lookup-first"])), max_outstanding=cap,
        queue_order=draw(st.sampled_from(["fifo", "lifo"])) if cap else "fifo",
        lifo_threshold=draw(st.sampled_from([0, 1])),
        retain_s=RETAIN_S if retention else 0.0, retain_max_bytes=MAX_BYTES, retain_result_max_bytes=RESULT_MAX_BYTES)


# -- races of one instant, both orders ---------------------------------------------------------------


def start(race: Race, first_token: bool) -> None:
    """Calls 0, 1 and 2 arrive at 0 in that order: call 0's execution (0) is dispatched."""
    for call in range(3):
        race.attempt(call)
    assert race.core.executions[0].state == "live"
    if first_token:
        race.engine(0, "first_token")
    race.advance(RACE_S)


def both_orders(policy: ProxyPolicy, setup: Callable[[Race], None], steps: dict[str, Step], other_at: int,
                suffix: Sequence[Op]) -> list[tuple[Race, dict[str, object]]]:
    """Play the steps of one instant both ways after the same setup, tenant b's retry of the same call
    id among them at `other_at`, then the same random suffix; every step is checked. The results
    keep the order the steps were played in."""
    played = []
    for names in (list(steps), list(steps)[::-1]):
        race = Race(policy, tenant_keys())
        setup(race)
        order = [*names[:other_at], OTHER, *names[other_at:]]
        results = {name: (steps.get(name) or _other_tenant_retry)(race) for name in order}
        _assert_isolated(race, results[OTHER])
        race.play(suffix)
        played.append((race, results))
    return played


OTHER = "other tenant"


def _other_tenant_retry(race: Race) -> Decision:
    return race.attempt(1)


def _first(results: dict[str, object], name: str, other: str) -> bool:
    """Whether step `name` was played before step `other`."""
    order = list(results)
    return order.index(name) < order.index(other)


def _assert_isolated(race: Race, decision: object) -> None:
    """Tenant b's retry never joins or is served tenant a's execution of the same call id and body."""
    assert isinstance(decision, Create | Attach | Serve | Refuse)
    if isinstance(decision, Attach | Serve):
        assert race.model.runs[decision.execution_id].key == race.model.keys[1]


def _joined(decision: object, execution_id: int) -> bool:
    return isinstance(decision, Attach | Serve) and decision.execution_id == execution_id


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@RACE_SETTINGS
@given(data=st.data(), first_token=st.booleans(), other_at=st.integers(0, 2), suffix=ops_st)
def test_retry_at_the_instant_the_last_subscriber_leaves(combo: tuple[str, bool, bool, bool], data: st.DataObject,
                                                         first_token: bool, other_at: int, suffix: list[Op]) -> None:
    policy = data.draw(policies(combo))
    steps: dict[str, Step] = {"leave": lambda race: race.leave((0, 0)), "retry": lambda race: race.attempt(0)}
    for _race, got in both_orders(policy, lambda race: start(race, first_token), steps, other_at, suffix):
        leave, retry = _as_actions(got["leave"]), got["retry"]
        if _first(got, "leave", "retry"):
            if Cancel(0) in leave:
                assert not _joined(retry, 0), "attached to the execution its departure just cancelled"
        elif isinstance(retry, Attach):
            assert leave == [], "the execution was given up while a retry was attached"


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@RACE_SETTINGS
@given(data=st.data(), other_at=st.integers(0, 2), size=st.integers(1, 4), edge_by=st.sampled_from(["expire", "2"]),
       retry_first_at_edge=st.booleans(), suffix=ops_st)
def test_retry_at_the_instant_of_completion_and_at_the_window_edge(
        combo: tuple[str, bool, bool, bool], data: st.DataObject, other_at: int, size: int, edge_by: str,
        retry_first_at_edge: bool, suffix: list[Op]) -> None:
    """Completion and retry at one instant; then, RETAIN_S later (the window's half-open edge), a
    retry and an expiry or another call's completion (which expires too) at one instant."""
    policy = data.draw(policies(combo))
    steps: dict[str, Step] = {"completed": lambda race: race.engine(0, "completed", size),
                              "retry": lambda race: race.attempt(0)}
    kept = policy.retain_s > 0 and size <= RESULT_MAX_BYTES
    for race, got in both_orders(policy, lambda race: start(race, True), steps, other_at, []):
        retry = got["retry"]
        if _first(got, "completed", "retry"):
            assert not isinstance(retry, Attach) or retry.execution_id != 0, "attached to a completed execution"
            if kept:
                assert retry == Serve(0)
        elif isinstance(retry, Attach):
            assert Notify((0, 1), "completed") in _as_actions(got["completed"])
        race.advance(RETAIN_S)
        edge: dict[str, Step] = {"retry": _retry_not_served, edge_by: lambda r: _complete_if_live(r, 2, size)}
        if edge_by == "expire":
            edge[edge_by] = lambda r: r.expire()
        for name in sorted(edge, key=lambda name: (name != "retry") == retry_first_at_edge):
            edge[name](race)
        race.play(suffix)


def _retry_not_served(race: Race) -> None:
    """A retry at the instant call 0's response stops being served."""
    assert not _joined(race.attempt(0), 0), "served at the edge of the window"


def _complete_if_live(race: Race, call: int, size: int) -> None:
    execution_id = race.model.live_of(race.model.keys[call])
    if execution_id is not None and race.model.runs[execution_id].state == "live":
        race.engine(execution_id, "completed", size)


def _as_actions(value: object) -> list[Action]:
    assert isinstance(value, list)
    return value


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@RACE_SETTINGS
@given(data=st.data(), first_token=st.booleans(), other_at=st.integers(0, 2), suffix=ops_st)
def test_retry_at_the_instant_the_deferral_timer_fires(combo: tuple[str, bool, bool, bool], data: st.DataObject,
                                                       first_token: bool, other_at: int, suffix: list[Op]) -> None:
    """Under off and immediate there is no deferral timer: one fired anyway must do nothing."""
    policy = data.draw(policies(combo))

    def setup(race: Race) -> None:
        start(race, first_token)
        race.leave((0, 0))
        race.advance(policy.defer_s)  # the timer is due now and still pending

    steps: dict[str, Step] = {"timer": lambda race: race.timer(0), "retry": lambda race: race.attempt(0)}
    for _race, got in both_orders(policy, setup, steps, other_at, suffix):
        timer, retry = _as_actions(got["timer"]), got["retry"]
        if policy.cancellation != "deferred":
            assert timer == []
        elif _first(got, "timer", "retry"):
            assert timer[:1] == [Cancel(0)], "the due timer of an execution nobody joined must cancel it"
            assert not _joined(retry, 0), "attached to the execution its timer just cancelled"
        elif isinstance(retry, Attach):
            assert timer == [], "cancelled while a retry was attached"


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@RACE_SETTINGS
@given(data=st.data(), kind=st.sampled_from(["refused", "failed"]), first_token=st.booleans(),
       other_at=st.integers(0, 2), suffix=ops_st)
def test_engine_error_at_the_instant_a_subscriber_joins(combo: tuple[str, bool, bool, bool], data: st.DataObject,
                                                        kind: str, first_token: bool, other_at: int,
                                                        suffix: list[Op]) -> None:
    """A 503 from the engine, or a failure (which a driver reports as completed, with no response to
    keep)."""
    policy = data.draw(policies(combo))
    event = "refused" if kind == "refused" else "completed"
    steps: dict[str, Step] = {"error": lambda race: race.engine(0, event, None), "retry": lambda race: race.attempt(0)}
    for race, got in both_orders(policy, lambda race: start(race, first_token), steps, other_at, suffix):
        retry = got["retry"]
        if _first(got, "error", "retry"):
            assert not _joined(retry, 0), "joined an execution that had failed"
        elif isinstance(retry, Attach):
            status = 503 if event == "refused" else 200
            assert Notify((0, 1), event, status=status) in _as_actions(got["error"])
        assert 0 not in race.retained, "a failed execution's output was kept"


# -- random interleavings ----------------------------------------------------------------------------


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@settings(max_examples=50, deadline=None)
@given(data=st.data(), ops=st.lists(st.tuples(st.sampled_from(OP_KINDS), st.integers(0, 7), st.integers(0, 4)),
                                    max_size=50))
def test_random_interleavings_keep_the_invariants(combo: tuple[str, bool, bool, bool], data: st.DataObject,
                                                  ops: list[Op]) -> None:
    """Arrivals, departures, engine events, timers, expiry and forgetting, many at one instant."""
    race = Race(data.draw(policies(combo)), tenant_keys())
    race.play(ops)


@settings(max_examples=60, deadline=None)
@given(auths=st.lists(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12),
                      min_size=2, max_size=2, unique=True),
       combo=st.sampled_from(COMBOS), data=st.data(), ops=ops_st)
def test_same_call_under_two_api_keys_never_shares(auths: list[str], combo: tuple[str, bool, bool, bool],
                                                   data: st.DataObject, ops: list[Op]) -> None:
    """Two Authorization headers, one call id and body: two keys; tenant b is never attached to, nor
    served, tenant a's execution, whatever happens around it."""
    keys = tenant_keys(f"Bearer {auths[0]}", f"Bearer {auths[1]}")
    assert keys[0] != keys[1]
    race = Race(data.draw(policies(combo)), keys)
    race.attempt(0)
    race.engine(0, "first_token")
    for op in ops:
        race.op(op)
        if op[0] == "advance":
            _assert_isolated(race, race.attempt(1))


# -- housekeeping does not change decisions ----------------------------------------------------------


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@settings(max_examples=15, deadline=None)
@given(data=st.data(), ops=ops_st, where=st.lists(st.integers(0, 25), max_size=8))
def test_expire_and_forget_anywhere_give_the_same_decisions(combo: tuple[str, bool, bool, bool],
                                                            data: st.DataObject, ops: list[Op],
                                                            where: list[int]) -> None:
    """`expire` only frees bytes early and `forget` only drops ended records: wherever a driver calls
    them in an instant, the decisions and every action but Release stay the same."""
    policy = data.draw(policies(combo))
    # Engine output after a cancel is not sent for a forgotten execution: a driver forgets it once its
    # stream has closed.
    housekeeping = [op for op in ops if op[0] not in ("expire", "forget", "late")]
    plain = Race(policy, tenant_keys())
    plain.play(housekeeping)
    busy = Race(policy, tenant_keys())
    for i, op in enumerate(housekeeping):
        if i in where:
            _housekeep(busy)
        busy.op(op)
    assert _decisions(busy.trace) == _decisions(plain.trace)


def _housekeep(race: Race) -> None:
    race.expire()
    for execution_id, run in sorted(race.model.runs.items()):
        if run.state not in LIVE and not run.forgotten:
            race.forget(execution_id)


def _decisions(trace: Sequence[object]) -> list[object]:
    return [item for item in trace if not isinstance(item, Release | tuple)]
