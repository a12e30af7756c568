"""Replay a trace open-loop over real HTTP, with the paper's retrying client (traffic/client.py) deciding retries.

One dispatcher task owns the send schedule: trace arrivals (in order) merged with a heap of retries,
so that a send never waits on an earlier call and tens of thousands of calls cost no sleeping tasks.
Request bodies are built ahead of their send time while the dispatcher is idle, and kept until the
call ends, so every attempt of a call sends the same bytes (the proxy's coalescing key hashes them).
The client is seeded as the simulator seeds it (sim/run.py), so the same outcomes give the same attempts.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NotRequired

import aiohttp
import numpy as np
from typing_extensions import TypedDict  # not typing's: realvllm/record.py holds SendLateness

from retrybench.conditions.client_stack import StackLayer
from retrybench.conditions.config import ClientPolicy
from retrybench.control.deadline import REQUEST_TIMEOUT_MS
from retrybench.records.atomicfile import write_atomic
from retrybench.records.runlog import (
    COMPLETED,
    ERROR,
    REFUSED_429,
    REFUSED_503,
    REFUSED_529,
    TIMED_OUT,
    AttemptOutcome,
    AttemptRecord,
    CallRecord,
    FailedReason,
)
from retrybench.serving.aio import run_event_loop
from retrybench.serving.clock import ScaledClock
from retrybench.traffic.client import CallDelivered, CallFailed, RetryingClient, SendAttempt
from retrybench.traffic.stack import StackedClient, stack_meta
from retrybench.traffic.workload import Trace

__all__ = ["LoadMeta", "LoadResult", "LoadgenSettings", "SendLateness", "run_load", "run_loadgen"]

log = logging.getLogger(__name__)

_clock = time.monotonic  # the clock asyncio's own loop uses; uvloop's loop.time() has only ms resolution
_LEAD_S = 0.05  # wall seconds between setting up and trace time 0, so the first sends are not late
_LOOKAHEAD_S = 1.0  # build bodies of calls arriving this far ahead (wall seconds)
_BUILD_MARGIN_S = 0.002  # stop building when the next send is this close (a body takes about 1 ms)
_SPIN_S = 0.001  # attempts start this early and yield to the loop until due: loop timers have 1 ms resolution
_PROGRESS_S = 10.0


@dataclass(frozen=True, kw_only=True)
class LoadgenSettings:
    target: str  # base URL (proxy or engine); attempts POST to target + "/v1/completions"
    client: ClientPolicy
    seed: int = 0
    time_scale: float = 1.0  # wall seconds per trace second; deadlines, backoffs and Retry-After scale too
    api_key: str = "retrybench"
    stream: bool = True
    max_calls: int | None = None
    # A stacked client's layers (a [[layer]] profile, docs/stacks.md), outermost first, in place of `client`.
    stack: tuple[StackLayer, ...] | None = None

    def __post_init__(self) -> None:
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"time_scale must be a finite number > 0, got {self.time_scale}")
        if self.max_calls is not None and self.max_calls < 0:
            raise ValueError(f"max_calls must be >= 0 or None, got {self.max_calls}")


class SendLateness(TypedDict):
    """How late attempts were sent after their planned time, in wall milliseconds."""

    p50_ms: float
    p99_ms: float
    max_ms: float
    n: int  # attempts sent


class LoadMeta(TypedDict, total=False):
    """What a load says of its run. The built-in client's has every key but `driver`; the openai SDK
    driver's has driver, target, time_scale, client and interrupted."""

    driver: str  # "openai-sdk"
    t0_unix: float  # unix time of trace second 0
    time_scale: float  # wall seconds per trace second
    target: str
    seed: int
    client: dict[str, Any]  # the client policy's fields (dataclasses.asdict); the SDK driver's: the two it is given
    send_lateness: SendLateness
    wall_s: float
    interrupted: bool
    stack: dict[str, Any]  # a stacked client's: what each layer did (traffic/stack.py's stack_meta)


@dataclass(frozen=True, kw_only=True)
class LoadResult:
    meta: LoadMeta
    calls: list[CallRecord]
    attempts: list[AttemptRecord]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> LoadResult:
        data = json.loads(text)
        return cls(meta=data["meta"], calls=[CallRecord(**c) for c in data["calls"]],
                   attempts=[AttemptRecord(**a) for a in data["attempts"]])  # fmt: skip


@dataclass(slots=True)
class AttemptInFlight:
    """One attempt as it runs, until it becomes an AttemptRecord (the SDK driver's attempts too)."""

    call_index: int
    attempt_no: int
    sent_s: float
    ended_s: float | None = None
    outcome: AttemptOutcome | None = None
    execution_id: int | None = None
    first_token_s: float | None = None
    retry_after_s: float | None = None
    attached: bool = False
    retained: bool = False  # answered from a response the proxy kept (result retention)
    no_retry: bool = False  # the answer carried x-should-retry: false (beyond the paper)


@dataclass(slots=True)
class _CallState:
    attempts: int = 0  # attempts actually sent
    delivered_s: float | None = None
    failed_s: float | None = None
    failed_reason: FailedReason | None = None


def note_proxy_headers(record: AttemptInFlight, headers: Any) -> None:
    """What the proxy says of the attempt: its execution, and whether it attached or was served a
    retained response (headers absent, as from an engine without the proxy, leave the defaults)."""
    execution = headers.get("X-Retrybench-Execution")
    if execution is not None and execution.strip().lstrip("-").isdigit():
        record.execution_id = int(execution)
    record.attached = headers.get("X-Retrybench-Attached") == "1"
    record.retained = headers.get("X-Retrybench-Retained") == "1"


def retry_after_s(headers: Any) -> float | None:
    """Retry-After-Ms (ms) if present, else Retry-After (s); both already in trace seconds."""
    for name, scale in (("Retry-After-Ms", 1e-3), ("Retry-After", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) * scale
        except ValueError:
            continue  # e.g. an HTTP date; the client then backs off as for a 429 without one
        return value if math.isfinite(value) and value >= 0 else None
    return None


def _error_code(payload: bytes) -> int | None:
    """The code of an OpenAI-style error object, 0 if it has none; None if `payload` is no error."""
    if b'"error"' not in payload:
        return None  # the common case: a token chunk, not parsed at all
    data = json.loads(payload)
    if not (isinstance(data, dict) and isinstance(data.get("error"), dict)):
        return None
    try:
        return int(data["error"].get("code") or 0)
    except (TypeError, ValueError):
        return 0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _StreamOptions(TypedDict):
    include_usage: bool


class _BodyTail(TypedDict):
    """The request body's fields after the prompt, the same in every request."""

    ignore_eos: bool
    stream: bool
    stream_options: NotRequired[_StreamOptions]


class _Load:
    """One run's state; kept outside the coroutine so an interrupted run can still be written out."""

    def __init__(self, trace: Trace, settings: LoadgenSettings) -> None:
        self.trace = trace
        self.settings = settings
        calls = trace.calls if settings.max_calls is None else trace.calls[: settings.max_calls]
        self.calls = calls
        self.order = sorted(range(len(calls)), key=lambda i: calls[i].arrival_s)
        rng = np.random.default_rng([settings.seed, 10])
        self.stack = StackedClient(settings.stack, rng) if settings.stack else None
        self.client: RetryingClient | StackedClient = self.stack or RetryingClient(settings.client, rng)
        # A stack sends the wire attempt's deadline (its layers' earliest) when any of its layers states one.
        self.sends_deadline = (any(layer.policy.sends_deadline for layer in settings.stack) if settings.stack
                               else settings.client.sends_deadline)
        # A stacked client's open attempts, by call: the timeout that cuts each and its deadline (trace s),
        # moved when a first token ends a first-byte layer's timeout.
        self.timeouts: dict[int, tuple[asyncio.Timeout, float]] = {}
        self.url = settings.target.rstrip("/") + "/v1/completions"
        self.auth = f"Bearer {settings.api_key}"
        self.n_prefix = trace.spec.shared_prefix_tokens
        self.prefix_json = json.dumps(trace.shared_prefix_ids(), separators=(",", ":")).encode()[1:-1]
        tail: _BodyTail = {"ignore_eos": True, "stream": settings.stream}
        if settings.stream:
            tail["stream_options"] = {"include_usage": True}
        self.body_tail = json.dumps(tail, separators=(",", ":")).encode()[1:]  # '"ignore_eos":...}'
        self.bodies: dict[int, bytes] = {}
        self.heap: list[tuple[float, int, SendAttempt]] = []
        self.seq = itertools.count()
        self.arrived = 0  # position in self.order of the next first attempt
        self.built = 0  # position in self.order of the next body to build ahead
        self.states = [_CallState() for _ in calls]
        self.records: list[AttemptInFlight] = []
        self.lateness_ms: list[float] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.unsent = 0  # attempts started but still waiting for their send time
        self.in_flight = 0
        self.done_calls = 0
        self.failure: BaseException | None = None
        self.wake: asyncio.Future[None] | None = None
        self.sleep_until = math.inf
        self.session: aiohttp.ClientSession | None = None
        self.clock = ScaledClock(settings.time_scale)  # trace seconds
        self.t0_unix = time.time()
        self.started = self.clock.t0

    # -- bodies --------------------------------------------------------------------------------

    def _body(self, index: int) -> bytes:
        """The request body, built once per call so retries resend identical bytes."""
        body = self.bodies.get(index)
        if body is None:
            suffix = self.trace.prompt_token_ids(index)[self.n_prefix :]
            ids = [self.prefix_json] if self.prefix_json else []
            if suffix:
                ids.append(json.dumps(suffix, separators=(",", ":")).encode()[1:-1])
            max_tokens = self.calls[index].response_tokens
            body = b'{"model":"retrybench","prompt":[%b],"max_tokens":%d,%b' % (b",".join(ids), max_tokens,
                                                                             self.body_tail)
            self.bodies[index] = body
        return body

    def _build_ahead(self, due: float) -> None:
        """Use idle time before the next send (`due`) to build bodies of the calls arriving soon."""
        self.built = max(self.built, self.arrived)  # calls already sent have their bodies (or ended)
        while self.built < len(self.order):
            now = _clock()
            index = self.order[self.built]
            if now > due - _BUILD_MARGIN_S or self.clock.wall(self.calls[index].arrival_s) > now + _LOOKAHEAD_S:
                return
            self._body(index)
            self.built += 1

    # -- the schedule --------------------------------------------------------------------------

    def _next(self) -> tuple[float, SendAttempt | None, int] | None:
        """(due wall time, retry or None for a first attempt, call index) of the next send."""
        retry = self.heap[0] if self.heap else None
        if self.arrived < len(self.order):
            index = self.order[self.arrived]
            due = self.clock.wall(self.calls[index].arrival_s)
            if retry is None or due <= retry[0]:
                return due, None, index
        if retry is None:
            return None
        return retry[0], retry[2], retry[2].call_index

    def _poke(self, due: float) -> None:
        """Wake the dispatcher if it sleeps past `due`."""
        if self.wake is not None and due < self.sleep_until:
            _resolve(self.wake)

    async def _sleep(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        self.wake = loop.create_future()
        self.sleep_until = until
        handle = loop.call_later(until - _clock(), _resolve, self.wake) if until < math.inf else None
        try:
            await self.wake
        finally:
            if handle is not None:
                handle.cancel()
            self.wake = None
            self.sleep_until = math.inf

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.failure is not None:
                raise self.failure
            upcoming = self._next()
            if upcoming is None:
                if self.arrived >= len(self.order) and self.client.outstanding() == 0:
                    return
                await self._sleep(math.inf)
                continue
            due, retry, index = upcoming
            launch = due - _SPIN_S
            if _clock() < launch:
                if self.unsent == 0:  # a build would hold up an attempt waiting for its send time
                    self._build_ahead(launch)
                if _clock() < launch:
                    await self._sleep(launch)
                    continue  # woken early, or by an earlier retry: look again
            if retry is None:
                self.arrived += 1
                action = self.client.start_call(index, self.calls[index].arrival_s)
            else:
                action = heapq.heappop(self.heap)[2]
            self.unsent += 1
            task = loop.create_task(self._attempt(action, due))
            self.tasks.add(task)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = task.exception()
            self._poke(-math.inf)

    # -- one attempt ---------------------------------------------------------------------------

    async def _attempt(self, action: SendAttempt, due: float) -> None:
        index = action.call_index
        body = self._body(index)
        headers = {"Authorization": self.auth, "Idempotency-Key": self.calls[index].call_id,
                   "X-Retrybench-Attempt": str(action.attempt_no), "Content-Type": "application/json"}
        while _clock() < due:  # the last millisecond: each turn lets the loop poll its sockets once
            await asyncio.sleep(0)
        sent = _clock()
        self.unsent -= 1
        if self.unsent == 0 and self.built < len(self.order):
            self._poke(-math.inf)  # the dispatcher may build bodies again
        self.lateness_ms.append((sent - due) * 1e3)
        if self.sends_deadline:  # the time left to its deadline, as the client states it
            headers[REQUEST_TIMEOUT_MS] = str(max(1, math.floor((self.clock.wall(action.deadline_s) - sent) * 1e3)))
        record = AttemptInFlight(index, action.attempt_no, max(self.clock.run_s(sent), action.send_s))
        self.records.append(record)
        self.states[index].attempts += 1
        self.in_flight += 1
        deadline = asyncio.timeout(self.clock.wall(action.deadline_s) - _clock())
        if self.stack is not None:
            self.timeouts[index] = (deadline, action.deadline_s)
        try:
            async with deadline:
                outcome = await self._exchange(record, body, headers)
            now = max(self.clock.now(), record.sent_s)
        except TimeoutError:
            if not deadline.expired():
                raise
            outcome, now = TIMED_OUT, action.deadline_s
            if self.stack is not None:
                now = self.timeouts[index][1]
        finally:
            self.timeouts.pop(index, None)
        self._report(record, outcome, now)

    def _first_token(self, record: AttemptInFlight) -> None:
        """A stacked client's first-byte layers stop cutting the attempt: its timeout moves to the new deadline."""
        assert self.stack is not None and record.first_token_s is not None
        index = record.call_index
        deadline_s = self.stack.on_first_token(index, record.attempt_no, max(record.first_token_s, record.sent_s))
        timeout, _old = self.timeouts[index]
        loop_now = asyncio.get_running_loop().time()
        timeout.reschedule(None if deadline_s == math.inf else loop_now + self.clock.wall(deadline_s) - _clock())
        self.timeouts[index] = (timeout, deadline_s)

    async def _exchange(self, record: AttemptInFlight, body: bytes, headers: dict[str, str]) -> AttemptOutcome:
        """Send one attempt and read its answer; a cancellation (the deadline) closes the connection."""
        assert self.session is not None
        response: aiohttp.ClientResponse | None = None
        try:
            response = await self.session.post(self.url, data=body, headers=headers)
            note_proxy_headers(record, response.headers)
            if response.status != 200:
                await response.read()
                if response.status == 429:
                    record.retry_after_s = retry_after_s(response.headers)
                    record.no_retry = response.headers.get("x-should-retry") == "false"
                    return REFUSED_429
                if response.status in (503, 529):  # 529 beyond the paper: "overloaded"
                    # The SDKs read any refusal's Retry-After; the paper's client waits only a 429's.
                    record.retry_after_s = retry_after_s(response.headers)
                    record.no_retry = response.headers.get("x-should-retry") == "false"
                    return REFUSED_503 if response.status == 503 else REFUSED_529
                return ERROR
            if not self.settings.stream:
                code = _error_code(await response.read())
                return COMPLETED if code is None else REFUSED_503 if code == 503 else ERROR
            return await self._read_stream(record, response)
        except (aiohttp.ClientError, OSError, ValueError):  # ValueError: bad JSON, over-long line
            return ERROR
        finally:
            if response is not None:
                if response.content.is_eof():
                    response.release()  # the connection can be reused
                else:
                    response.close()  # really close it: the proxy or engine must see the disconnect

    async def _read_stream(self, record: AttemptInFlight, response: aiohttp.ClientResponse) -> AttemptOutcome:
        first = True
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return COMPLETED
            code = _error_code(payload)
            if code is not None:
                return REFUSED_503 if first and code == 503 else ERROR
            if first:
                record.first_token_s = self.clock.now()
                first = False
                if self.stack is not None:
                    self._first_token(record)
        return ERROR  # the stream ended without [DONE]

    def _report(self, record: AttemptInFlight, outcome: AttemptOutcome, now: float) -> None:
        record.outcome = outcome
        record.ended_s = now
        self.in_flight -= 1
        index = record.call_index
        action = self.client.on_outcome(index, record.attempt_no, outcome, now, record.retry_after_s,
                                        record.no_retry)
        if isinstance(action, SendAttempt):
            due = self.clock.wall(action.send_s)
            heapq.heappush(self.heap, (due, next(self.seq), action))
            self._poke(due)
            return
        state = self.states[index]
        if isinstance(action, CallDelivered):
            state.delivered_s = action.at_s
        elif isinstance(action, CallFailed):
            state.failed_s, state.failed_reason = action.at_s, action.reason
        self.bodies.pop(index, None)
        self.done_calls += 1
        if self.client.outstanding() == 0:
            self._poke(-math.inf)

    # -- the run -------------------------------------------------------------------------------

    async def run(self) -> LoadResult:
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            self.session = session
            self.started = _clock()
            self.clock.t0 = self.started + _LEAD_S
            self.t0_unix = time.time() + _LEAD_S
            progress = loop.create_task(self._progress())
            try:
                await self._dispatch()
                while self.tasks:  # every call has ended; let the last attempts release their connections
                    await asyncio.gather(*self.tasks)
            finally:
                progress.cancel()
                for task in self.tasks:
                    task.cancel()
                await asyncio.gather(progress, *self.tasks, return_exceptions=True)
        return self.result(interrupted=False)

    async def _progress(self) -> None:
        """One log line per 10 s of wall time; the p99 is over that window's sends, so it stays cheap."""
        seen = 0
        while True:
            await asyncio.sleep(_PROGRESS_S)
            window = self.lateness_ms[seen:]
            seen += len(window)
            p99 = float(np.percentile(window, 99)) if window else 0.0
            log.info("loadgen: %d/%d calls started, %d done, %d attempts in flight, send lateness p99 %.3f ms "
                     "(last %.0f s)", self.arrived, len(self.order), self.done_calls, self.in_flight, p99,
                     _PROGRESS_S)

    def result(self, interrupted: bool) -> LoadResult:
        """The run so far; attempts still open are closed at the current time as errors."""
        now_s = self.clock.now()
        lateness = np.asarray(self.lateness_ms, dtype=float)
        if lateness.size:
            p50, p99, worst = (float(v) for v in np.percentile(lateness, [50, 99, 100]))
        else:
            p50 = p99 = worst = 0.0
        meta: LoadMeta = {
            "t0_unix": self.t0_unix, "time_scale": self.settings.time_scale, "target": self.settings.target,
            "seed": self.settings.seed, "client": asdict(self.settings.client),
            "send_lateness": {"p50_ms": p50, "p99_ms": p99, "max_ms": worst, "n": int(lateness.size)},
            "wall_s": _clock() - self.started, "interrupted": interrupted,
        }  # fmt: skip
        if self.stack is not None:
            meta["stack"] = stack_meta(self.stack, [self.order[i] for i in range(self.arrived)])
        calls = [
            CallRecord(index=c.index, arrival_s=c.arrival_s, prompt_tokens=c.prompt_tokens,
                       response_tokens=c.response_tokens, attempts=s.attempts, delivered_s=s.delivered_s,
                       failed_s=s.failed_s, failed_reason=s.failed_reason)
            for c, s in zip(self.calls, self.states, strict=True)
        ]  # fmt: skip
        attempts = [
            AttemptRecord(call_index=r.call_index, attempt_no=r.attempt_no, sent_s=r.sent_s,
                          ended_s=r.ended_s if r.ended_s is not None else max(now_s, r.sent_s),
                          outcome=r.outcome or ERROR, execution_id=r.execution_id, first_token_s=r.first_token_s,
                          retry_after_s=r.retry_after_s, attached=r.attached, retained=r.retained)
            for r in self.records
        ]  # fmt: skip
        return LoadResult(meta=meta, calls=calls, attempts=attempts)


async def run_load(trace: Trace, settings: LoadgenSettings) -> LoadResult:
    """Replay `trace` against settings.target until every call is delivered or given up."""
    return await _Load(trace, settings).run()


def _write(path: Path, result: LoadResult) -> None:
    write_atomic(Path(path), result.to_json())


def run_loadgen(trace: Trace, settings: LoadgenSettings, out: Path | None) -> LoadResult:
    """run_load on uvloop when installed; writes `out` atomically, also (marked interrupted) if the run dies."""
    load = _Load(trace, settings)
    try:
        result = run_event_loop(load.run)
    except BaseException:
        if out is not None:
            _write(out, load.result(interrupted=True))
        raise
    if out is not None:
        _write(out, result)
    return result
