"""Several engine replicas behind a router, and several proxy instances behind a front balancer, in
one virtual-time run.

The paper ran one engine behind one proxy. Here each attempt reaches one of M proxy instances (the
front balancer picks it: `control.router.FrontBalancer`), each instance with its own coalescing table,
retry budget and queue (per-instance state) or all of them reading one shared state (one `ProxyCore`,
what a shared store would give); each execution an instance dispatches goes to one of N `EngineCore`
replicas (that instance's `control.router.Router` picks it). A retry that reaches an instance other
than the one holding its call's execution finds nothing there to attach to.

It drives the same cores as `sim.run`, and reuses its driver for everything a deployment does not
change (the client, notifications, the run log's records). Execution ids are the deployment's own,
numbered in creation order; each instance's core keeps its local ids. With one replica and one
instance it replays `sim.run.simulate` event for event (tests/sim/test_deployment.py compares the
digests), though `simulate` keeps its own loop for that case: the single engine's hot path stays as
fast as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heappop

import numpy as np

from retrybench.conditions.config import ClientPolicy, ProxyPolicy
from retrybench.control.proxy import (
    Action,
    Attach,
    AttemptIn,
    Cancel,
    Create,
    Dispatch,
    Notify,
    ProxyCore,
    Refuse,
    Serve,
    SetTimer,
)
from retrybench.control.router import (
    FRONT_POLICIES,
    ROUTER_POLICIES,
    FrontBalancer,
    PrefixSegment,
    Router,
    prompt_prefix,
)
from retrybench.engine.core import EngineCore
from retrybench.engine.profiles import EngineProfile
from retrybench.gcpause import cyclic_gc_paused
from retrybench.records import runlog
from retrybench.records.runlog import AttemptOutcome, ExecutionRecord, RunLog, RunMeta
from retrybench.records.tracefile import TraceEvent
from retrybench.sim.run import _ABORT, _ARRIVAL, _DEADLINE, _EXPIRY, _SEND, _TIMER, _Attempt, _Sim
from retrybench.traffic.workload import Call

__all__ = ["Deployment", "simulate_deployment"]


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """How the replicas and the proxy tier are put together (the engines themselves are profiles)."""

    router: str = "round-robin"
    proxies: int = 1
    shared_state: bool = False  # one ProxyCore for every instance (a shared store), else one each
    front: str = "random"

    def __post_init__(self) -> None:
        if self.router not in ROUTER_POLICIES:
            raise ValueError(f"router must be one of {', '.join(ROUTER_POLICIES)}, got {self.router!r}")
        if self.front not in FRONT_POLICIES:
            raise ValueError(f"front must be one of {', '.join(FRONT_POLICIES)}, got {self.front!r}")
        if self.proxies < 1:
            raise ValueError(f"proxies must be >= 1, got {self.proxies}")

    @property
    def cores(self) -> int:
        """How many proxy cores (states) the instances hold between them."""
        return 1 if self.shared_state else self.proxies


class _DeploymentSim(_Sim):
    def __init__(self, profiles: Sequence[EngineProfile], calls: Sequence[Call], client: ClientPolicy,
                 proxy: ProxyPolicy, seed: int, prefix_tokens: int, trace: list[TraceEvent] | None,
                 deployment: Deployment) -> None:
        if not profiles:
            raise ValueError("a deployment needs at least one engine replica")
        if trace is not None and len(profiles) > 1:
            raise ValueError("the engine trace is kept for one replica only")
        super().__init__(profiles[0], calls, client, proxy, seed, prefix_tokens, trace)
        self.engines = [self.engine, *(EngineCore(p, prefix_tokens=prefix_tokens) for p in profiles[1:])]
        self.proxies = [self.proxy, *(ProxyCore(proxy) for _ in range(deployment.cores - 1))]
        names = [f"replica-{i}" for i in range(len(self.engines))]
        self.routers = [Router(deployment.router, names) for _ in self.proxies]
        self.front = FrontBalancer(deployment.front, [f"proxy-{i}" for i in range(deployment.cores)],
                                   np.random.default_rng([seed, 20]) if deployment.front == "random" else None)
        self.open_streams = [[0] * len(self.engines) for _ in self.proxies]  # per core, per replica
        self.prefix_tokens = prefix_tokens
        self.instance_of: dict[tuple[int, int], int] = {}  # subscriber -> the core its attempt reached
        self.global_id: dict[tuple[int, int], int] = {}  # (core, local id) -> execution id
        self.local_id: list[tuple[int, int]] = []  # execution id -> (core, local id)
        self.replica_of: dict[int, int] = {}  # execution id -> replica, once dispatched
        self.streaming: dict[int, tuple[int, int]] = {}  # execution id -> (core, replica) while its stream is open

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop_s: float | None = None) -> float:
        """sim.run's loop over several engines: the due batch completion of the lowest-numbered replica
        goes first, before any heap event at the same time."""
        loop = self.loop
        heap = loop.heap
        engines = self.engines
        client = self.client
        for i, item in enumerate(self.calls):
            loop.push(item.call.arrival_s, _ARRIVAL, i)
        now = 0.0
        total = len(self.calls)
        while True:
            due = -1
            at = 0.0
            for index, engine in enumerate(engines):
                inflight = engine.inflight
                if inflight and (due < 0 or inflight[0].end_s < at):
                    due, at = index, inflight[0].end_s
            if due >= 0:
                engine_next = not heap or at <= heap[0][0]
                if not engine_next:
                    at = heap[0][0]
            elif heap:
                at = heap[0][0]
                engine_next = False
            else:
                break
            if stop_s is not None and at > stop_s:
                now = stop_s
                break
            if at > self.next_sample:
                self._sample_until(at)
            now = at
            if engine_next:
                for event in engines[due].on_batch_done(now):
                    completed = event.kind == "finished"
                    result_bytes = self._result_bytes(event.rid) if completed else None
                    if completed:
                        self._close_stream(event.rid)
                    core, local = self.local_id[event.rid]
                    actions = self.proxies[core].on_engine_event(local, "completed" if completed else event.kind,
                                                                 now, result_bytes)
                    self._apply_from(core, actions, now)
            else:
                _at, kind, _seq, payload = heappop(heap)
                if kind == _DEADLINE:
                    self._deadline(payload, now)
                elif kind == _SEND:
                    self._send(payload, now)
                elif kind == _ABORT:
                    engines[self.replica_of[payload]].abort(payload, now)
                elif kind == _ARRIVAL:
                    self.arrived += 1
                    self._client_action(client.start_call(payload, now), now)
                elif kind == _EXPIRY:
                    core, local = payload
                    self._apply_from(core, self.proxies[core].on_deadline(local, now), now)
                else:
                    core, local = payload
                    self._apply_from(core, self.proxies[core].on_timer(local, now), now)
            if self.arrived == total and client.outstanding() == 0:
                break
        end_s = now
        self._sample_until(end_s + 1e-9)
        self._settle_cancellations()
        return end_s

    def _settle_cancellations(self) -> None:
        loop = self.loop
        while loop:
            now, kind, payload = loop.pop()
            if kind == _ABORT:
                self.engines[self.replica_of[payload]].abort(payload, now)
            elif kind == _TIMER:
                core, local = payload
                self._apply_from(core, self.proxies[core].on_timer(local, now), now)
            elif kind == _EXPIRY:
                core, local = payload
                self._apply_from(core, self.proxies[core].on_deadline(local, now), now)

    def _sample_until(self, now: float) -> None:
        samples = self.samples
        engines = self.engines
        while self.next_sample < now:
            samples.engine_waiting.append(sum(e.num_waiting for e in engines))
            samples.engine_running.append(sum(e.num_running for e in engines))
            samples.proxy_waiting.append(sum(p.waiting for p in self.proxies))
            samples.prompt_tokens_total.append(sum(e.scheduler.counters.prompt_tokens_total for e in engines))
            samples.prefix_cache_queries_total.append(
                sum(e.scheduler.counters.prefix_cache_queries_total for e in engines))
            self.next_sample += 1

    # -- client side -------------------------------------------------------------------------

    def _send(self, record: _Attempt, now: float) -> None:
        call = self.calls[record.call_index].call
        core = self.front.pick(call.call_id) if len(self.proxies) > 1 else 0
        self.instance_of[(call.index, record.attempt_no)] = core
        attempt = AttemptIn(call.index, record.attempt_no, call.call_id, call.prompt_tokens, call.response_tokens,
                            record.deadline_s if self.sends_deadline else None)
        waiting = sum(e.num_waiting for e in self.engines)  # the proxy reads every replica's gauge
        decision = self.proxies[core].on_attempt(attempt, now, engine_waiting=waiting)
        if isinstance(decision, Refuse):
            record.refused_live = decision.live
            record.refused_by = decision.source
            record.no_retry = decision.no_retry
            refused: AttemptOutcome = runlog.REFUSED_BY_STATUS[decision.status]
            self._end_attempt(record, refused, now, decision.retry_after_s)
            return
        if isinstance(decision, Create):
            execution_id = len(self.local_id)
            self.local_id.append((core, decision.execution_id))
            self.global_id[(core, decision.execution_id)] = execution_id
        else:
            execution_id = self.global_id[(core, decision.execution_id)]
        record.execution_id = execution_id
        if isinstance(decision, Serve):
            record.retained = True
            record.first_token_s = now
            self.delivered_to_subscriber.add(execution_id)
            self._end_attempt(record, runlog.COMPLETED, now)
            return
        self.loop.push(record.deadline_s, _DEADLINE, record)
        if decision.expire_at_s is not None:
            self.loop.push(decision.expire_at_s, _EXPIRY, (core, decision.execution_id))
        if isinstance(decision, Attach):
            record.attached = True
            if decision.first_token:
                record.first_token_s = now
            return
        self.execution_created[execution_id] = (call.index, record.attempt_no, now)
        if decision.dispatch:
            self._route(execution_id, now)

    def _deadline(self, record: _Attempt, now: float) -> None:
        if record.outcome is not None:
            return
        self._end_attempt(record, runlog.TIMED_OUT, now)
        subscriber = (record.call_index, record.attempt_no)
        core = self.instance_of[subscriber]
        self._apply_from(core, self.proxies[core].on_subscriber_left(subscriber, now), now)

    # -- proxy decisions ---------------------------------------------------------------------

    def _apply_from(self, core: int, actions: list[Action], now: float) -> None:
        global_id = self.global_id
        for action in actions:
            if isinstance(action, Notify):
                self._notify(action, now)
            elif isinstance(action, Cancel):
                execution_id = global_id[(core, action.execution_id)]
                self._close_stream(execution_id)
                self.loop.push(now + self.cancel_delay_s, _ABORT, execution_id)
            elif isinstance(action, Dispatch):
                self._route(global_id[(core, action.execution_id)], now)
            elif isinstance(action, SetTimer):
                self.loop.push(action.at_s, _TIMER, (core, action.execution_id))

    def _prefix(self, call: Call) -> tuple[PrefixSegment, ...]:
        """The prompt as a router sees it: the shared system prompt, then the call's own part."""
        return prompt_prefix(call.call_id, call.prompt_tokens, self.prefix_tokens)

    def _route(self, execution_id: int, now: float) -> None:
        """The instance's router picks the replica; the execution is submitted there."""
        call_index, _attempt_no, _created = self.execution_created[execution_id]
        call = self.calls[call_index].call
        core, local = self.local_id[execution_id]
        streams = self.open_streams[core]
        replica = self.routers[core].choose(call.call_id, self._prefix(call), streams)
        self.replica_of[execution_id] = replica
        accepted = self.engines[replica].submit(execution_id, prompt_len=call.prompt_tokens,
                                                max_tokens=call.response_tokens, prompt_key=call_index, now=now)
        if not accepted:
            self.refused[execution_id] = now
            self._apply_from(core, self.proxies[core].on_engine_event(local, "refused", now), now)
            return
        streams[replica] += 1
        self.streaming[execution_id] = (core, replica)

    def _close_stream(self, execution_id: int) -> None:
        open_stream = self.streaming.pop(execution_id, None)
        if open_stream is not None:
            core, replica = open_stream
            self.open_streams[core][replica] -= 1

    # -- the log -----------------------------------------------------------------------------

    def log(self, end_s: float, meta: RunMeta) -> RunLog:
        for engine in self.engines[1:]:
            engine.snapshot()
        log = super().log(end_s, meta)  # snapshots engine 0, reads its counters: the others' are added
        for engine in self.engines[1:]:
            counters = engine.scheduler.counters
            for name in log.counters:
                log.counters[name] += getattr(counters, name)
        return log

    def _execution_record(self, eid: int) -> ExecutionRecord:
        """sim.run's record, read from the replica and the core that hold the execution."""
        core, local = self.local_id[eid]
        replica = self.replica_of.get(eid)
        stats = self.engines[replica].stats.get(eid) if replica is not None else None
        return self._record_of(eid, stats, self.proxies[core].executions[local])

    def routed(self) -> list[int]:
        """Executions dispatched to each replica (refused ones included)."""
        counts = [0] * len(self.engines)
        for replica in self.replica_of.values():
            counts[replica] += 1
        return counts


def simulate_deployment(profiles: Sequence[EngineProfile], calls: Sequence[Call], *, client: ClientPolicy,
                        proxy: ProxyPolicy, seed: int, meta: RunMeta, deployment: Deployment,
                        prefix_tokens: int = 2000, trace: list[TraceEvent] | None = None,
                        stop_s: float | None = None) -> RunLog:
    """One run on a deployment: `profiles` are the engine replicas (one per replica, GPUs may differ).
    The log's samples and counters are the deployment's totals; `meta["routed"]` counts the executions
    dispatched to each replica."""
    with cyclic_gc_paused():
        sim = _DeploymentSim(profiles, calls, client, proxy, seed, prefix_tokens, trace, deployment)
        end_s = sim.run(stop_s)
        if len(profiles) > 1 or deployment.proxies > 1:
            meta = {**meta, "routed": sim.routed()}
        return sim.log(end_s, meta)
