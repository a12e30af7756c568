"""A scheduler-tracing plugin for vLLM: the engine trace the simulator writes, from a real engine.

Start vLLM with `--scheduler-cls retrybench.realvllm.vllm_trace.TracingScheduler` (or
`TracingAsyncScheduler` where asynchronous scheduling is on: vLLM's CPU platform forces it off)
and `RETRYBENCH_VLLM_TRACE=/path/trace.jsonl` in its environment. The subclass calls vLLM's own
scheduler and only watches what it did, at the hooks docs/vllm-v1-semantics.md
names: `add_request` (queued), `schedule` (a step: per-execution prompt and decode tokens, prefix
hits of new admissions, preemptions), `update_from_output` (step end, first token, finished, work
of aborted executions whose output arrived after the abort) and `finish_requests(...,
FINISHED_ABORTED)` (abort, with the prompt tokens computed so far and those still in flight). Every 5 s, and at
shutdown, a `trace_stats`/`trace_end` event gives the recorder's own time: its overhead.

The schema is `retrybench.records.tracefile`'s, so the analysis reads a real trace as it reads a simulated
one. vLLM's request ids are strings; the trace numbers executions 0, 1, ... in arrival order and
keeps vLLM's id in the `queued` event. Times are seconds on the monotonic clock since the trace
began; the header's `started_unix` puts them on the wall clock.

`TraceRecorder` holds all the logic and touches vLLM objects only by attribute, so it is tested
without vLLM; the scheduler classes are built on first access (PEP 562), where vLLM imports.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol

from retrybench.records.tracefile import FORMAT, TraceEvent, TraceHeader

__all__ = ["SUPPORTED_VLLM", "TRACE_ENV", "TraceRecorder", "VllmRequest", "check_vllm_version"]

TRACE_ENV = "RETRYBENCH_VLLM_TRACE"
ANY_VERSION_ENV = "RETRYBENCH_TRACE_ANY_VLLM"  # set to 1 to trace a vLLM outside SUPPORTED_VLLM
SUPPORTED_VLLM = ((0, 30), (0, 34))  # the scheduler hooks were read from 0.30.0 and 0.34.0
FLUSH_S = 0.25  # a background thread flushes this often: a crash loses at most this much of the trace
STATS_S = 5.0  # and notes the recorder's own time this often


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM whose scheduler the hooks were not read from, unless told otherwise."""
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        major_minor = (-1, -1)
    low, high = SUPPORTED_VLLM
    if not low <= major_minor <= high and os.environ.get(ANY_VERSION_ENV) != "1":
        raise RuntimeError(f"retrybench's tracing plugin supports vLLM {low[0]}.{low[1]}-{high[0]}.{high[1]}, "
                           f"not {version}; set {ANY_VERSION_ENV}=1 to try anyway")


class VllmRequest(Protocol):
    """What the recorder reads of a vLLM request (vllm.v1.request.Request)."""

    request_id: str
    num_prompt_tokens: int
    num_computed_tokens: int
    num_output_tokens: int
    status: Any  # a RequestStatus: its name is read

    def is_finished(self) -> bool: ...


class TraceRecorder:
    """Turns the scheduler's calls into trace events and writes them as JSONL."""

    def __init__(self, path: Path, meta: TraceHeader, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._t0 = clock()
        self._file: IO[str] | None = path.open("w", buffering=1 << 16)
        self._lock = threading.Lock()  # the scheduler's thread writes, the flusher flushes
        self._ids: dict[str, int] = {}
        self._steps = 0
        self._pending: deque[tuple[int, float, dict[int, int]]] = deque()  # (step, start, prompt tokens)
        self._step_meta: dict[int, tuple[float, list[int], dict[str, int], list[int]]] = {}
        self._scheduled: set[str] = set()  # vLLM ids that have been in a step
        self._first_token: set[str] = set()
        self._last_end = 0.0
        self.self_time_s = 0.0  # time spent in this recorder: its overhead on the engine
        header: TraceHeader = {"format": FORMAT, "engine": "vllm", "started_unix": time.time(), **meta}
        self._write(header)
        self._closed = threading.Event()
        threading.Thread(target=self._flush_every, args=(FLUSH_S,), name="retrybench-trace-flush",
                         daemon=True).start()

    # -- the hooks ---------------------------------------------------------------------------

    def queued(self, request: VllmRequest) -> None:
        began = self._clock()
        rid = self._ids.setdefault(request.request_id, len(self._ids))
        self._event(began, "queued", rid, prompt_tokens=int(request.num_prompt_tokens),
                    request_id=request.request_id)
        self._account(began)

    def scheduled(self, output: Any, requests: Mapping[str, VllmRequest]) -> None:
        """After `schedule()`: num_computed_tokens has already advanced by the scheduled tokens."""
        began = self._clock()
        now = began - self._t0
        step = self._steps
        self._steps += 1
        prompt: dict[int, int] = {}
        decode: list[int] = []
        for req_id, n in output.num_scheduled_tokens.items():
            request = requests.get(req_id)
            rid = self._ids.get(req_id)
            if request is None or rid is None:
                continue
            before = int(request.num_computed_tokens) - int(n)
            in_prompt = max(0, min(int(n), int(request.num_prompt_tokens) - before))
            if in_prompt:
                prompt[rid] = in_prompt
            else:
                decode.append(rid)
            self._scheduled.add(req_id)
        cached = {str(self._ids[new.req_id]): int(new.num_computed_tokens)
                  for new in output.scheduled_new_reqs if new.req_id in self._ids}
        preempted = [self._ids[r] for r in sorted(output.preempted_req_ids or ()) if r in self._ids]
        start = max(now, self._last_end) if self._pending else now
        # The step event is written when its output arrives, with its end; until then it is pending.
        self._pending.append((step, start, prompt))
        self._step_meta[step] = (now, decode, cached, preempted)
        for rid in preempted:
            self._event(began, "preempted", rid)
        self._account(began)

    def step_done(self, output: Any, requests: Mapping[str, VllmRequest]) -> None:
        """After `update_from_output` for the oldest pending step: its end, first tokens, finishes."""
        began = self._clock()
        now = began - self._t0
        if not self._pending:
            self._account(began)
            return
        step, start, prompt = self._pending.popleft()
        scheduled_at, decode, cached, preempted = self._step_meta.pop(step)
        self._last_end = now
        self._write({"t": scheduled_at, "event": "step", "step": step, "start_s": start, "end_s": now,
                     "prompt_tokens": {str(k): v for k, v in prompt.items()}, "decode": decode,
                     "cached_tokens": cached, "preempted": preempted})
        dropped = []
        for req_id in output.num_scheduled_tokens:
            rid = self._ids.get(req_id)
            if rid is None:
                continue
            request = requests.get(req_id)
            if request is None or _is_aborted(request):
                dropped.append(rid)  # aborted while this step was in flight: its work is thrown away
                continue
            if req_id not in self._first_token and int(request.num_output_tokens) > 0:
                self._first_token.add(req_id)
                self._event(began, "first_token", rid)
            if request.is_finished():
                self._event(began, "finished", rid)
                self._forget(req_id)
        self._write({"t": now, "event": "step_done", "step": step, "start_s": start, "dropped": dropped})
        self._account(began)

    def aborted(self, requests: Iterable[VllmRequest]) -> None:
        """In `finish_requests(ids, FINISHED_ABORTED)`, before vLLM frees them. The scheduler sees
        the abort when the engine core applies it, so requested and applied carry one time."""
        began = self._clock()
        for request in requests:
            rid = self._ids.get(request.request_id)
            if rid is None or request.is_finished():
                continue
            in_flight = sum(tokens.get(rid, 0) for _step, _start, tokens in self._pending)
            computed = min(int(request.num_computed_tokens), int(request.num_prompt_tokens))
            self._event(began, "abort_requested", rid)
            self._event(began, "aborted", rid, computed_prompt_tokens=computed, in_flight_prompt_tokens=in_flight,
                        unscheduled=request.request_id not in self._scheduled)
            self._forget(request.request_id)
        self._account(began)

    def flush(self) -> None:
        """Write out every event recorded so far."""
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        if self._file is None:
            return
        self._closed.set()
        wall = self._clock() - self._t0
        self._write({"t": wall, "event": "trace_end", "execution": -1, "self_time_s": self.self_time_s,
                     "wall_s": wall})
        with self._lock:
            self._file.close()
            self._file = None

    # -- writing -----------------------------------------------------------------------------

    def _forget(self, req_id: str) -> None:
        """A finished or aborted execution: keep its number only while a pending step names it."""
        self._scheduled.discard(req_id)
        self._first_token.discard(req_id)

    def _event(self, at: float, event: str, rid: int, **extra: Any) -> None:
        self._write({"t": at - self._t0, "event": event, "execution": rid, **extra})

    def _write(self, record: TraceEvent | TraceHeader) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file is not None:
                self._file.write(line)

    def _account(self, began: float) -> None:
        self.self_time_s += self._clock() - began

    def _flush_every(self, period_s: float) -> None:
        """Flush the trace every `period_s`, and every STATS_S note the recorder's own time so far:
        vLLM may end its engine process without shutting the scheduler down, and then the last
        `trace_stats` event is the overhead figure."""
        last_stats = self._clock()
        while not self._closed.wait(period_s):
            now = self._clock()
            if now - last_stats >= STATS_S:
                last_stats = now
                self._write({"t": now - self._t0, "event": "trace_stats", "execution": -1,
                             "self_time_s": self.self_time_s, "wall_s": now - self._t0})
            self.flush()


def _is_aborted(request: VllmRequest) -> bool:
    return str(getattr(request.status, "name", request.status)) == "FINISHED_ABORTED"


def _recorder_for(scheduler: Any) -> TraceRecorder | None:
    path = os.environ.get(TRACE_ENV)
    if not path:
        return None
    sched = scheduler.scheduler_config
    meta: TraceHeader = {"max_num_batched_tokens": sched.max_num_batched_tokens, "max_num_seqs": sched.max_num_seqs,
            "async_scheduling": bool(getattr(sched, "async_scheduling", False)),
            "vllm_version": _vllm_version(), "scheduler": type(scheduler).__name__}
    recorder = TraceRecorder(Path(path), meta)
    atexit.register(recorder.close)
    return recorder


def _vllm_version() -> str:
    import vllm  # type: ignore[import-not-found]

    return str(vllm.__version__)


def _tracing(base: type) -> type:
    """A subclass of vLLM's `base` scheduler that feeds a TraceRecorder (or is `base` unchanged
    when RETRYBENCH_VLLM_TRACE is not set)."""
    from vllm.v1.request import RequestStatus  # type: ignore[import-not-found]

    check_vllm_version(_vllm_version())

    class Tracing(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._trace = _recorder_for(self)

        def add_request(self, request: Any) -> None:
            super().add_request(request)
            if self._trace is not None:
                self._trace.queued(request)

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            output = super().schedule(*args, **kwargs)
            if self._trace is not None and output.num_scheduled_tokens:
                self._trace.scheduled(output, self.requests)
            return output

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            if self._trace is None or not scheduler_output.num_scheduled_tokens:
                return super().update_from_output(scheduler_output, model_runner_output)
            requests = {r: self.requests[r] for r in scheduler_output.num_scheduled_tokens if r in self.requests}
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            self._trace.step_done(scheduler_output, requests)
            self._flush_when_idle()
            return outputs

        def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
            if self._trace is None or finished_status != RequestStatus.FINISHED_ABORTED:
                return super().finish_requests(request_ids, finished_status)
            ids = (request_ids,) if isinstance(request_ids, str) else (request_ids or self.requests.keys())
            self._trace.aborted([self.requests[r] for r in list(ids) if r in self.requests])
            result = super().finish_requests(request_ids, finished_status)
            self._flush_when_idle()
            return result

        def _flush_when_idle(self) -> None:
            """With no request left the engine is idle: flush now, so that whoever sees its gauges
            at 0 finds the whole trace on disk (the flusher thread alone may lag by FLUSH_S)."""
            if self._trace is not None and not self.requests:
                self._trace.flush()

        def shutdown(self) -> None:
            if self._trace is not None:
                self._trace.close()
            super().shutdown()

    Tracing.__name__ = Tracing.__qualname__ = f"Tracing{base.__name__}"
    return Tracing


def __getattr__(name: str) -> type:
    if name == "TracingScheduler":
        from vllm.v1.core.sched.scheduler import Scheduler  # type: ignore[import-not-found]

        return _tracing(Scheduler)
    if name == "TracingAsyncScheduler":
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # type: ignore[import-not-found]

        return _tracing(AsyncScheduler)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
