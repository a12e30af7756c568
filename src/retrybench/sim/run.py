"""Play calls through client -> proxy -> engine in virtual time and return the run log.

The client (traffic/client.py), the proxy (control/proxy.py) and the engine (engine/) are the pure
deciders; this module only carries their decisions to each other at the right virtual time.
A run ends when no call is outstanding; the engine may still hold orphaned executions then.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heappop

import numpy as np

from retrybench.conditions.client_stack import StackLayer
from retrybench.conditions.config import BreakerPolicy, ClientPolicy, ProxyPolicy
from retrybench.control.breaker import STATE_CODES, BreakerCore
from retrybench.control.proxy import (
    Action,
    Attach,
    AttemptIn,
    Cancel,
    Create,
    Dispatch,
    Drop,
    Execution,
    Notify,
    ProxyCore,
    Refuse,
    Serve,
    SetTimer,
)
from retrybench.engine.core import EngineCore, ExecutionStats
from retrybench.engine.profiles import EngineProfile
from retrybench.gcpause import cyclic_gc_paused
from retrybench.records import runlog
from retrybench.records.runlog import (
    AttemptOutcome,
    AttemptRecord,
    CallRecord,
    ExecutionRecord,
    FailedReason,
    Fate,
    QueueSamples,
    RunLog,
    RunMeta,
)
from retrybench.records.tracefile import TraceEvent
from retrybench.sim.loop import EventLoop
from retrybench.traffic.client import CallDelivered, CallFailed, ClientAction, RetryingClient, SendAttempt
from retrybench.traffic.stack import StackedClient, stack_meta
from retrybench.traffic.workload import Call

__all__ = ["simulate"]

# A completed response's size in bytes, as a vLLM completions stream carries it (one SSE event per
# token, HTTP chunk framing included: 209 bytes for a one-token event of a model named as the
# paper's; 25 for the end marker and the last chunk). Only result retention's byte bounds read it.
STREAM_BYTES_PER_TOKEN = 209
STREAM_BYTES_FIXED = 25

# Event priorities at equal times: engine output first (a response that arrives exactly at the
# deadline is delivered), then what reaches the engine, then client deadlines and sends.
_ENGINE, _ABORT, _DEADLINE, _SEND, _ARRIVAL, _TIMER = range(6)
_EXPIRY = 6  # an execution's deadline (deadline propagation): after its subscribers' own deadlines


@dataclass(slots=True)
class _Attempt:
    call_index: int
    attempt_no: int
    sent_s: float
    deadline_s: float
    execution_id: int | None = None
    first_token_s: float | None = None
    ended_s: float | None = None
    outcome: AttemptOutcome | None = None
    retry_after_s: float | None = None
    attached: bool = False
    refused_live: bool = False
    retained: bool = False
    refused_by: str | None = None
    no_retry: bool = False


@dataclass(slots=True)
class _Call:
    call: Call
    delivered_s: float | None = None
    failed_s: float | None = None
    failed_reason: FailedReason | None = None


class _Sim:
    def __init__(self, profile: EngineProfile, calls: Sequence[Call], client: ClientPolicy,
                 proxy: ProxyPolicy, seed: int, prefix_tokens: int,
                 trace: list[TraceEvent] | None, stack: Sequence[StackLayer] | None = None,
                 breaker: BreakerPolicy | None = None) -> None:
        self.loop = EventLoop()
        self.breaker = BreakerCore(breaker) if breaker is not None else None
        self.engine = EngineCore(profile, prefix_tokens=prefix_tokens, trace=trace)
        # A stacked client (a [[layer]] profile) is seeded as the one-policy client, so one layer is the same.
        self.stack = StackedClient(stack, np.random.default_rng([seed, 10])) if stack else None
        self.client: RetryingClient | StackedClient = (self.stack or
                                                       RetryingClient(client, np.random.default_rng([seed, 10])))
        self.proxy = ProxyCore(proxy)
        self.cancel_delay_s = proxy.cancel_delay_s
        # A stack sends the wire attempt's deadline (its layers' earliest) when any of its layers states one.
        self.sends_deadline = (any(layer.policy.sends_deadline for layer in stack) if stack
                               else client.sends_deadline)
        self.calls = [_Call(call) for call in calls]
        self.attempts: dict[tuple[int, int], _Attempt] = {}
        self.execution_created: dict[int, tuple[int, int, float]] = {}
        self.refused: dict[int, float] = {}
        self.delivered_to_subscriber: set[int] = set()
        self.samples = QueueSamples()
        self.next_sample = 0
        self.arrived = 0

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop_s: float | None = None) -> float:
        """Play events in (time, priority, sequence) order until no call is outstanding.

        The engine's next batch completion is not kept in the heap: there is at most one, and its
        priority (_ENGINE) is the lowest, so it goes first whenever it is due no later than the
        heap's head. Once per engine step, this saves a push and a pop.
        """
        loop = self.loop
        heap = loop.heap
        engine = self.engine
        inflight = engine.inflight
        client = self.client
        for i, item in enumerate(self.calls):
            loop.push(item.call.arrival_s, _ARRIVAL, i)
        now = 0.0
        total = len(self.calls)
        while True:
            if inflight:
                at = inflight[0].end_s
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
                events = engine.on_batch_done(now)
                if not events:
                    continue  # a step that only computed: no call can have ended
                for event in events:
                    kind_name = "completed" if event.kind == "finished" else event.kind
                    result_bytes = self._result_bytes(event.rid) if kind_name == "completed" else None
                    self._apply(self.proxy.on_engine_event(event.rid, kind_name, now, result_bytes), now)
            else:
                _at, kind, _seq, payload = heappop(heap)
                if kind == _DEADLINE:
                    self._deadline(payload, now)
                elif kind == _SEND:
                    self._send(payload, now)
                elif kind == _ABORT:
                    engine.abort(payload, now)
                elif kind == _ARRIVAL:
                    self.arrived += 1
                    self._client_action(client.start_call(payload, now), now)
                elif kind == _EXPIRY:
                    self._apply(self.proxy.on_deadline(payload, now), now)
                else:
                    self._apply(self.proxy.on_timer(payload, now), now)
            if self.arrived == total and client.outstanding() == 0:
                break
        end_s = now
        self._sample_until(end_s + 1e-9)
        self._settle_cancellations()
        return end_s

    def _settle_cancellations(self) -> None:
        """The run is over for the client, but cancellations already decided still reach the
        engine (a closed stream, a deferral timer); the engine is not stepped any further."""
        loop = self.loop
        while loop:
            now, kind, payload = loop.pop()
            if kind == _ABORT:
                self.engine.abort(payload, now)
            elif kind == _TIMER:
                self._apply(self.proxy.on_timer(payload, now), now)
            elif kind == _EXPIRY:
                self._apply(self.proxy.on_deadline(payload, now), now)

    def _sample_until(self, now: float) -> None:
        samples = self.samples
        engine = self.engine
        counters = engine.scheduler.counters
        while self.next_sample < now:
            samples.engine_waiting.append(engine.num_waiting)
            samples.engine_running.append(engine.num_running)
            samples.proxy_waiting.append(self.proxy.waiting)
            samples.prompt_tokens_total.append(counters.prompt_tokens_total)
            samples.prefix_cache_queries_total.append(counters.prefix_cache_queries_total)
            if self.breaker is not None:
                samples.breaker_state.append(STATE_CODES[self.breaker.state(float(self.next_sample))])
            self.next_sample += 1

    # -- client side -------------------------------------------------------------------------

    def _client_action(self, action: ClientAction, now: float) -> None:
        if isinstance(action, SendAttempt):
            record = _Attempt(action.call_index, action.attempt_no, action.send_s, action.deadline_s)
            self.attempts[(action.call_index, action.attempt_no)] = record
            self.loop.push(action.send_s, _SEND, record)
        elif isinstance(action, CallDelivered):
            self.calls[action.call_index].delivered_s = action.at_s
        elif isinstance(action, CallFailed):
            item = self.calls[action.call_index]
            item.failed_s = action.at_s
            item.failed_reason = action.reason

    def _send(self, record: _Attempt, now: float) -> None:
        call = self.calls[record.call_index].call
        attempt = AttemptIn(call.index, record.attempt_no, call.call_id, call.prompt_tokens,
                            call.response_tokens, record.deadline_s if self.sends_deadline else None)
        decision: Refuse | Create | Attach | Serve | None = None
        if self.breaker is not None:
            decision = self.breaker.on_attempt((call.index, record.attempt_no), now)
        if decision is None:
            decision = self.proxy.on_attempt(attempt, now, engine_waiting=self.engine.num_waiting)
        if isinstance(decision, Refuse):
            record.refused_live = decision.live
            record.refused_by = decision.source
            record.no_retry = decision.no_retry
            self._end_attempt(record, runlog.REFUSED_BY_STATUS[decision.status], now, decision.retry_after_s)
            return
        record.execution_id = decision.execution_id
        if isinstance(decision, Serve):  # the response was kept: it arrives at once
            record.retained = True
            record.first_token_s = now
            self.delivered_to_subscriber.add(decision.execution_id)
            self._end_attempt(record, runlog.COMPLETED, now)
            return
        if record.deadline_s < math.inf:
            self.loop.push(record.deadline_s, _DEADLINE, record)
        if decision.expire_at_s is not None:
            self.loop.push(decision.expire_at_s, _EXPIRY, decision.execution_id)
        if isinstance(decision, Attach):
            record.attached = True
            if decision.first_token:
                record.first_token_s = now  # replayed from the start
                self._first_token(record, now)
            return
        assert isinstance(decision, Create)
        self.execution_created[decision.execution_id] = (call.index, record.attempt_no, now)
        if decision.dispatch:
            self._dispatch(decision.execution_id, now)

    def _deadline(self, record: _Attempt, now: float) -> None:
        if record.outcome is not None or now < record.deadline_s:  # ended, or moved later by a first token
            return
        self._end_attempt(record, runlog.TIMED_OUT, now)
        self._apply(self.proxy.on_subscriber_left((record.call_index, record.attempt_no), now), now)

    def _end_attempt(self, record: _Attempt, outcome: AttemptOutcome, now: float,
                     retry_after_s: float | None = None) -> None:
        record.outcome = outcome
        record.ended_s = now
        record.retry_after_s = retry_after_s
        if self.breaker is not None and record.refused_by != "breaker":
            self.breaker.on_result((record.call_index, record.attempt_no), outcome, now)
        action = self.client.on_outcome(record.call_index, record.attempt_no, outcome, now, retry_after_s,
                                        record.no_retry)
        self._client_action(action, now)

    # -- proxy decisions ---------------------------------------------------------------------

    def _apply(self, actions: list[Action], now: float) -> None:
        for action in actions:
            if isinstance(action, Notify):
                self._notify(action, now)
            elif isinstance(action, Cancel):
                self.loop.push(now + self.cancel_delay_s, _ABORT, action.execution_id)
            elif isinstance(action, Dispatch):
                self._dispatch(action.execution_id, now)
            elif isinstance(action, SetTimer):
                self.loop.push(action.at_s, _TIMER, action.execution_id)
            elif isinstance(action, Drop):
                pass  # it never reached the engine; the log reads its fate from the proxy

    def _notify(self, action: Notify, now: float) -> None:
        record = self.attempts[action.subscriber]
        if record.outcome is not None:
            return
        if action.kind == "first_token":
            record.first_token_s = now
            self._first_token(record, now)
        elif action.kind == "completed":
            if record.execution_id is not None:
                self.delivered_to_subscriber.add(record.execution_id)
            self._end_attempt(record, runlog.COMPLETED, now)
        elif action.kind == "refused":
            record.refused_by = "engine"
            record.no_retry = action.no_retry
            self._end_attempt(record, runlog.REFUSED_BY_STATUS[action.status], now, action.retry_after_s)

    def _first_token(self, record: _Attempt, now: float) -> None:
        """A stacked client's first-byte timeouts stop once the first token arrived: the attempt's new deadline."""
        if self.stack is None:
            return
        deadline = self.stack.on_first_token(record.call_index, record.attempt_no, now)
        if deadline != record.deadline_s:
            record.deadline_s = deadline
            if deadline < math.inf:
                self.loop.push(deadline, _DEADLINE, record)

    def _result_bytes(self, execution_id: int) -> int:
        """The size of a completed execution's response as an OpenAI-compatible server streams it."""
        call = self.calls[self.execution_created[execution_id][0]].call
        return STREAM_BYTES_FIXED + STREAM_BYTES_PER_TOKEN * call.response_tokens

    def _dispatch(self, execution_id: int, now: float) -> None:
        call_index, _attempt_no, _created = self.execution_created[execution_id]
        call = self.calls[call_index].call
        accepted = self.engine.submit(execution_id, prompt_len=call.prompt_tokens,
                                      max_tokens=call.response_tokens, prompt_key=call_index, now=now)
        if not accepted:
            self.refused[execution_id] = now
            self._apply(self.proxy.on_engine_event(execution_id, "refused", now,
                                                   engine_waiting=self.engine.num_waiting), now)

    # -- the log -----------------------------------------------------------------------------

    def log(self, end_s: float, meta: RunMeta) -> RunLog:
        calls = [
            CallRecord(index=item.call.index, arrival_s=item.call.arrival_s,
                       prompt_tokens=item.call.prompt_tokens, response_tokens=item.call.response_tokens,
                       attempts=self.client.attempts_made(item.call.index) if item.call.index < self.arrived
                       else 0,
                       delivered_s=item.delivered_s, failed_s=item.failed_s, failed_reason=item.failed_reason)
            for item in self.calls
        ]
        attempts = [
            AttemptRecord(call_index=r.call_index, attempt_no=r.attempt_no, sent_s=r.sent_s,
                          ended_s=r.ended_s if r.ended_s is not None else end_s,
                          outcome=r.outcome or runlog.ERROR, execution_id=r.execution_id,
                          first_token_s=r.first_token_s, retry_after_s=r.retry_after_s,
                          attached=r.attached, refused_live=r.refused_live, retained=r.retained,
                          refused_by=r.refused_by)
            for r in self.attempts.values() if r.execution_id is not None or r.outcome is not None
        ]
        self.engine.snapshot()
        executions = [self._execution_record(eid) for eid in sorted(self.execution_created)]
        counters = self.engine.scheduler.counters
        if self.stack is not None:  # what each layer did, outermost first (docs/stacks.md)
            meta = {**meta, "stack": stack_meta(self.stack, range(self.arrived))}
        return RunLog(meta=meta, calls=calls, attempts=attempts, executions=executions,
                      samples=self.samples, end_s=end_s,
                      counters={"prompt_tokens_total": counters.prompt_tokens_total,
                                "prefix_cache_queries_total": counters.prefix_cache_queries_total,
                                "prefix_cache_hits_total": counters.prefix_cache_hits_total,
                                "num_preemptions_total": counters.num_preemptions_total,
                                "generation_tokens_total": counters.generation_tokens_total})

    def _execution_record(self, eid: int) -> ExecutionRecord:
        return self._record_of(eid, self.engine.stats.get(eid), self.proxy.executions[eid])

    def _record_of(self, eid: int, stats: ExecutionStats | None, state: Execution) -> ExecutionRecord:
        """One execution's record from the engine's stats of it (None: never reached the engine) and
        the proxy's state of it."""
        call_index, attempt_no, created = self.execution_created[eid]
        finished = stats is not None and stats.finished_s is not None
        fate: Fate
        if eid in self.refused:
            fate = runlog.FATE_REFUSED
        elif state.state == "dropped":
            fate = runlog.FATE_DROPPED
        elif state.state == "queued":
            fate = runlog.FATE_QUEUED
        elif eid in self.delivered_to_subscriber:
            fate = runlog.FATE_COMPLETED
        elif state.state == "cancelled" and not finished:
            fate = runlog.FATE_CANCELLED  # the proxy closed the stream before the last token
        elif state.subscribers:
            fate = runlog.FATE_UNFINISHED
        else:
            fate = runlog.FATE_ORPHANED
        return ExecutionRecord(
            execution_id=eid, call_index=call_index, attempt_no=attempt_no, created_s=created,
            accepted_s=stats.queued_s if stats is not None else None,
            refused_s=self.refused.get(eid),
            first_scheduled_s=stats.first_scheduled_s if stats else None,
            first_token_s=stats.first_token_s if stats else None,
            finished_s=stats.finished_s if stats else None,
            abort_requested_s=stats.abort_requested_s if stats else None,
            aborted_s=stats.aborted_s if stats else None,
            fate=fate,
            prompt_tokens=stats.prompt_tokens if stats else 0,
            computed_prompt_tokens=stats.computed_prompt_tokens if stats else 0,
            preemptions=stats.preemptions if stats else 0,
        )


def simulate(profile: EngineProfile, calls: Sequence[Call], *, client: ClientPolicy, proxy: ProxyPolicy,
             seed: int, meta: RunMeta, prefix_tokens: int = 2000,
             trace: list[TraceEvent] | None = None, stop_s: float | None = None,
             stack: Sequence[StackLayer] | None = None, breaker: BreakerPolicy | None = None) -> RunLog:
    """One run: every call in `calls` played through the client, (a circuit breaker,) proxy and engine.

    It ends when no call is outstanding, or at `stop_s` (calibration stops after its stages). With `stack`
    (a [[layer]] client profile's layers) the client is a stacked one and `client` is not read.
    """
    with cyclic_gc_paused():  # a run allocates much and frees little
        sim = _Sim(profile, calls, client, proxy, seed, prefix_tokens, trace, stack, breaker)
        end_s = sim.run(stop_s)
        return sim.log(end_s, meta)
