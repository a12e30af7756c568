"""The engine core around the scheduler: the batch pipeline, aborts, the queue cap, the trace.

vLLM's engine loop with asynchronous scheduling keeps two batches in flight: it schedules and
submits batch k+1, then waits for batch k, applies the aborts that arrived meanwhile, and
processes k's output. So an abort applied when batch k finishes finds batch k+1 already issued
with the request in it: those tokens are still computed (in flight), their output dropped. With
synchronous scheduling (vLLM's CPU platform) one batch is in flight.

Time is an argument: the driver calls `submit`/`abort` at the time they reach the engine and
`on_batch_done` at `next_done_s()`. Nothing here reads a clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from retrybench.engine.profiles import EngineProfile
from retrybench.engine.scheduler import ABORTED, FINISHED, WAITING, Batch, Request, Scheduler
from retrybench.records.tracefile import ExecutionEvent, TraceEvent

__all__ = ["EngineCore", "EngineEvent", "ExecutionStats"]


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """What the engine tells the front end: first_token, finished."""

    kind: str
    rid: int
    at_s: float


@dataclass(slots=True)
class ExecutionStats:
    """Per-execution timestamps and work, kept for the run log."""

    rid: int
    queued_s: float
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    abort_requested_s: float | None = None
    aborted_s: float | None = None
    prompt_tokens: int = 0
    computed_prompt_tokens: int = 0
    in_flight_prompt_tokens: int = 0  # of an aborted execution: in batches issued before the abort
    recomputed_tokens: int = 0
    preemptions: int = 0


@dataclass
class EngineCore:
    profile: EngineProfile
    prefix_tokens: int = 2000
    trace: list[TraceEvent] | None = None  # when a list, scheduler trace events are appended
    scheduler: Scheduler = field(init=False)
    stats: dict[int, ExecutionStats] = field(init=False, default_factory=dict)
    _requests: dict[int, Request] = field(init=False, default_factory=dict)
    inflight: deque[Batch] = field(init=False, default_factory=deque)  # issued batches, oldest first
    _aborts: list[int] = field(init=False, default_factory=list)
    _unfinished: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        engine = self.profile.engine
        self.scheduler = Scheduler(engine, self.profile.kv_blocks, self.prefix_tokens)
        self._depth = 2 if engine.async_scheduling else 1
        self._step_time_s = self.profile.step_timer()
        self._queue_cap = engine.max_num_queued_reqs

    # -- gauges (vllm:num_requests_waiting / _running) ----------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def idle(self) -> bool:
        return not self.inflight

    def next_done_s(self) -> float | None:
        return self.inflight[0].end_s if self.inflight else None

    # -- front-end calls ---------------------------------------------------------------------

    def submit(self, rid: int, *, prompt_len: int, max_tokens: int, prompt_key: object, now: float) -> bool:
        """Queue an execution; False is vLLM's 503 when the queue cap would be exceeded."""
        cap = self._queue_cap
        if cap is not None and self._unfinished + 1 > cap:
            return False
        scheduler = self.scheduler
        request = Request(rid, prompt_len, max_tokens, scheduler.owner_for(prompt_key, prompt_len), now)
        self._requests[rid] = request
        self.stats[rid] = ExecutionStats(rid=rid, queued_s=now, prompt_tokens=prompt_len)
        self._unfinished += 1
        scheduler.add(request)
        if self.trace is not None:
            self._log(now, "queued", rid, prompt_tokens=prompt_len)
        if not self.inflight:
            self._fill(now)
        return True

    def abort(self, rid: int, now: float) -> None:
        """The client's stream closed: the front end forgets it now, the core applies it later."""
        request = self._requests.get(rid)
        stats = self.stats.get(rid)
        if request is None or stats is None or stats.abort_requested_s is not None:
            return
        if request.status in (FINISHED, ABORTED):
            return
        stats.abort_requested_s = now
        self._unfinished -= 1
        if self.trace is not None:
            self._log(now, "abort_requested", rid)
        if self.inflight:
            self._aborts.append(rid)
        else:
            self._apply_abort(rid, now)
            self._fill(now)

    # -- the loop ----------------------------------------------------------------------------

    def on_batch_done(self, now: float) -> list[EngineEvent]:
        """The head batch finished at `now`: apply aborts, process its output, refill the pipe."""
        done = self.inflight.popleft()
        if self._aborts:
            for rid in self._aborts:
                self._apply_abort(rid, now)
            self._aborts.clear()
        first, finished = self.scheduler.update_from_output(done)
        events: list[EngineEvent] = []
        for request in first:
            stats = self.stats[request.rid]
            if stats.first_token_s is None:
                stats.first_token_s = now
                events.append(EngineEvent("first_token", request.rid, now))
                if self.trace is not None:
                    self._log(now, "first_token", request.rid)
        for request in finished:
            self._retire(request)
            self.stats[request.rid].finished_s = now
            self._unfinished -= 1
            events.append(EngineEvent("finished", request.rid, now))
            if self.trace is not None:
                self._log(now, "finished", request.rid)
        if self.trace is not None:
            self._log(now, "step_done", -1, step=done.step_id, start_s=done.start_s)
        self._fill(now)
        return events

    def _fill(self, now: float) -> None:
        scheduler = self.scheduler
        inflight = self.inflight
        step_time_s = self._step_time_s
        empty_steps = 0
        while len(inflight) < self._depth:
            batch = scheduler.schedule()
            if batch is None:
                return
            if not batch.seqs:
                # The step only preempted: nothing runs on the GPU, and the next schedule() may
                # admit again (a step that preempted admits nothing).
                if self.trace is not None:
                    for rid in batch.preempted:
                        self._log(now, "preempted", rid)
                empty_steps += 1
                if empty_steps > 2:
                    raise RuntimeError("the scheduler preempted without making progress")
                continue
            start = inflight[-1].end_s if inflight else now
            duration = step_time_s(batch.seqs, batch.tokens, batch.sampled, batch.attention_pairs,
                                   batch.context_tokens, batch.decode_context_tokens, batch.chunks)
            batch.start_s = start
            batch.end_s = start + duration
            inflight.append(batch)
            if batch.entries:
                stats = self.stats
                for request, _n, _s, _e in batch.entries:
                    entry = stats[request.rid]
                    if entry.first_scheduled_s is None:
                        entry.first_scheduled_s = now
            if self.trace is not None:
                self._log_step(batch, now, start, start + duration)

    def _apply_abort(self, rid: int, now: float) -> None:
        request = self._requests[rid]
        if request.status in (FINISHED, ABORTED):
            return
        self.scheduler.finish_aborted(request)
        stats = self.stats[rid]
        stats.aborted_s = now
        in_flight = 0
        if request.first_scheduled_step is not None:  # else no batch holds its tokens
            for pending in self.inflight:
                for (entry, _n, _s, _e), prompt in zip(pending.entries, pending.prompt_tokens, strict=True):
                    if entry is request:
                        in_flight += prompt
        stats.in_flight_prompt_tokens = in_flight
        self._retire(request)
        if self.trace is not None:
            self._log(now, "aborted", rid, computed_prompt_tokens=request.computed_prompt_tokens,
                      in_flight_prompt_tokens=in_flight, unscheduled=request.first_scheduled_step is None)

    def _retire(self, request: Request) -> None:
        stats = self.stats[request.rid]
        stats.computed_prompt_tokens = request.computed_prompt_tokens
        stats.recomputed_tokens = request.recomputed_tokens
        stats.preemptions = request.preemptions
        del self._requests[request.rid]

    def live_requests(self) -> int:
        return len(self._requests)

    def output_tokens(self, rid: int) -> int | None:
        """Output tokens processed so far, for a front end that streams them; None once the core
        has retired the request (finished or aborted: the caller learns which from the events)."""
        request = self._requests.get(rid)
        return None if request is None else request.out

    def snapshot(self) -> None:
        """Copy the work of executions still in the engine into their stats (at a run's end)."""
        for rid, request in self._requests.items():
            stats = self.stats[rid]
            stats.computed_prompt_tokens = request.computed_prompt_tokens
            stats.recomputed_tokens = request.recomputed_tokens
            stats.preemptions = request.preemptions

    # -- trace -------------------------------------------------------------------------------

    def _log(self, now: float, event: ExecutionEvent, rid: int, **extra: Any) -> None:
        """Append one trace event (callers on hot paths check `self.trace` first, so that a run
        without a trace does not even build the keyword arguments)."""
        if self.trace is not None:
            self.trace.append({"t": now, "event": event, "execution": rid, **extra})

    def _log_step(self, batch: Batch, now: float, start: float, end: float) -> None:
        assert self.trace is not None
        prompt: dict[str, int] = {}
        decode = batch.decode_rids()
        for (request, n, _s, _e), computed in zip(batch.entries, batch.prompt_tokens, strict=True):
            if computed:
                prompt[str(request.rid)] = n
            else:
                decode.append(request.rid)
        self.trace.append({
            "t": now, "event": "step", "step": batch.step_id, "start_s": start, "end_s": end,
            "prompt_tokens": prompt, "decode": decode,
            "cached_tokens": {str(rid): hit for rid, hit in batch.admitted},
            "preempted": list(batch.preempted),
        })
        for rid in batch.preempted:
            self._log(now, "preempted", rid)


_ = WAITING  # re-exported state names are used by tests
