"""The simulated vLLM engine served over HTTP in wall-clock time: a CPU stand-in for `vllm serve`.

The EngineCore is the simulator's own (same scheduler, same step times, same trace), so a live run
and a simulated run differ only in what the network and the event loop add. One driver task steps
the core at the wall time of each batch's scheduled end; handlers submit, stream what each batch
produced and abort on a client disconnect, as vLLM's OpenAI server does (see
docs/vllm-v1-semantics.md). Engine time is wall time divided by `time_scale`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from retrybench.conditions.config import EngineConfig
from retrybench.engine.core import EngineCore
from retrybench.engine.profiles import profile_for
from retrybench.records.tracefile import TraceEvent, write_trace
from retrybench.serving.app import new_app, serve_until_signalled, start_app
from retrybench.serving.clock import ScaledClock
from retrybench.serving.openai_api import (
    BadRequest,
    bool_field,
    error_body,
    error_response,
    is_positive_int,
    is_token_ids,
    json_object,
)

__all__ = ["EngineServer", "EngineServerSettings", "serve_forever"]

TRACE_FLUSH_S = 0.5  # wall seconds between trace flushes, so a SIGKILL loses at most this much
BUSY_MESSAGE = "The engine is currently busy"  # vLLM's queue-cap refusal
_DONE = b"data: [DONE]\n\n"
_TOKEN = " tok"  # the text of one output token (no model, so no real text)


@dataclass(frozen=True, kw_only=True)
class EngineServerSettings:
    """What `retrybench engine-server` takes; the engine arguments mirror vLLM's flags."""

    model: str  # a paper model's name or a registered config's key (engine/model_registry.py)
    gpu: str = "h100"
    time_scale: float = 1.0  # wall seconds per engine second (0.1 = ten times faster than real time)
    max_num_queued_reqs: int | None = None
    stream_interval: int = 1  # output tokens per streamed chunk (vLLM's --stream-interval)
    async_scheduling: bool = True
    trace_path: Path | None = None  # scheduler trace JSONL, same events as the simulator's EngineCore.trace
    prefix_tokens: int = 2000

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")
        if self.prefix_tokens < 0:
            raise ValueError(f"prefix_tokens must be >= 0, got {self.prefix_tokens}")


@dataclass(frozen=True, slots=True)
class _Completion:
    prompt_len: int
    prompt_key: object
    max_tokens: int
    stream: bool
    include_usage: bool


@dataclass(slots=True, eq=False)
class _Pending:
    """A request the front end holds: the driver updates `tokens` and sets `wake` after each batch."""

    rid: int
    max_tokens: int
    tokens: int = 0
    finished: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


def _parse(body: bytes, max_model_len: int) -> _Completion:
    """Validate a /v1/completions body the way vLLM answers it (400 with the bad field)."""
    data = json_object(body)
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        prompt_len = len(prompt.split())
        key: object = hash(("text", prompt))
    elif is_token_ids(prompt):
        prompt_len = len(prompt)
        key = hash(tuple(prompt))  # identical prompts (retries) share their cached blocks
    else:
        raise BadRequest("'prompt' must be a string or a list of token ids", "prompt")
    if prompt_len < 1:
        raise BadRequest("'prompt' must hold at least one token", "prompt")
    max_tokens = data.get("max_tokens")
    if not is_positive_int(max_tokens):
        raise BadRequest("'max_tokens' is required and must be a positive integer", "max_tokens")
    if prompt_len + max_tokens > max_model_len:
        raise BadRequest(f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                         f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the "
                         "completion).", "max_tokens")
    stream = bool_field(data, "stream")
    bool_field(data, "ignore_eos")
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    include_usage = bool(options and options.get("include_usage"))
    return _Completion(prompt_len, key, max_tokens, stream, include_usage)


class _EngineCollector(Collector):
    """vLLM's metric names, read from the core at scrape time so they cannot drift from it."""

    def __init__(self, server: EngineServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        server = self.server
        core = server.core
        labels = ["model_name", "engine"]
        values = [server.model_name, "0"]
        for name, doc, value in (
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", core.num_waiting),
            ("vllm:num_requests_running", "Number of requests in model execution batches.", core.num_running),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        counters = core.scheduler.counters
        for name, doc, count in (
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", counters.prompt_tokens_total),
            ("vllm:generation_tokens", "Number of generation tokens processed.", counters.generation_tokens_total),
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             counters.prefix_cache_queries_total),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             counters.prefix_cache_hits_total),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
             counters.num_preemptions_total),
        ):
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric(values, count)
            yield counter
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=[*labels, "finished_reason"])
        success.add_metric([*values, "length"], server.successes)
        yield success


class EngineServer:
    """The engine core behind vLLM's OpenAI API subset, stepped in wall-clock time."""

    def __init__(self, settings: EngineServerSettings) -> None:
        self.settings = settings
        engine = EngineConfig(async_scheduling=settings.async_scheduling,
                              max_num_queued_reqs=settings.max_num_queued_reqs)
        self.profile = profile_for(settings.model, settings.gpu, engine=engine)
        self.model_name = self.profile.model.name
        self._trace: list[TraceEvent] | None = [] if settings.trace_path is not None else None
        self.core = EngineCore(self.profile, prefix_tokens=settings.prefix_tokens, trace=self._trace)
        self.successes = 0  # vllm:request_success_total: aborted requests never count
        self.aborts = 0  # requests the front end aborted (client gone, or the server stopping)
        self.refused = 0  # queue-cap 503s
        self.clock = ScaledClock(settings.time_scale)
        self._last = 0.0  # latest engine time handed to the core
        # Engine seconds by which batch ends were pushed back because the driver woke late (a loaded
        # machine): the engine then did less in the same time than its model says, so a measurement
        # of its capacity is only as good as this is small.
        self.behind_s = 0.0
        self._rids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._created = int(time.time())
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(self))

    # -- time --------------------------------------------------------------------------------

    def now(self) -> float:
        """Engine seconds since start."""
        return self.clock.now()

    def _clock(self, at: float | None = None) -> float:
        """A time for the core: `at` (or now), never before a time it was already given."""
        t = self.now() if at is None else at
        if t < self._last:
            t = self._last
        self._last = t
        return t

    # -- lifecycle ---------------------------------------------------------------------------

    def app(self) -> web.Application:
        return new_app([web.post("/v1/completions", self.completions), web.get("/v1/models", self.models),
                        web.get("/metrics", self.metrics), web.get("/retrybench/engine", self.state)],
                       client_max_size=64 << 20)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind, start the driver (and the trace flusher); returns the bound port."""
        path = self.settings.trace_path
        if path is not None:
            s = self.settings
            write_trace(path, (), {"source": "engine-server", "model": s.model, "gpu": s.gpu,
                                   "time_scale": s.time_scale, "async_scheduling": s.async_scheduling,
                                   "max_num_queued_reqs": s.max_num_queued_reqs, "prefix_tokens": s.prefix_tokens})
        # The shutdown timeout only bounds stop(): every handler returns once it sees _stopping.
        self._runner, bound = await start_app(self.app(), host, port, shutdown_timeout=2.0)
        self.clock.restart()
        self._last = 0.0
        self.behind_s = 0.0
        self._tasks.append(asyncio.create_task(self._drive(), name="engine-driver"))
        if path is not None:
            self._tasks.append(asyncio.create_task(self._flush_periodically(), name="trace-flusher"))
        for task in self._tasks:
            task.add_done_callback(_report_crash)
        return bound

    async def stop(self) -> None:
        """End every stream (each handler aborts its request), stop the driver, flush the trace."""
        self._stopping = True
        for pending in list(self._pending.values()):
            pending.wake.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:  # already reported by _report_crash
                pass
        self._tasks.clear()
        self._flush()

    # -- the driver --------------------------------------------------------------------------

    async def _drive(self) -> None:
        """Sleep until the head batch's scheduled end, then hand the core that end time."""
        core = self.core
        while True:
            end = core.next_done_s()
            if end is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            # Always yield (a zero sleep once the end is due), so a late engine cannot starve the handlers.
            await asyncio.sleep(self.clock.wall_until(end))
            if core.next_done_s() != end:
                continue
            at = self._clock(end)
            self.behind_s += at - end
            events = core.on_batch_done(at)
            pending = self._pending
            for event in events:
                if event.kind == "finished":
                    self.successes += 1
                    entry = pending.get(event.rid)
                    if entry is not None:
                        entry.tokens = entry.max_tokens
                        entry.finished = True
                        entry.wake.set()
            for entry in pending.values():
                if not entry.finished:
                    tokens = core.output_tokens(entry.rid)
                    if tokens is not None and tokens != entry.tokens:
                        entry.tokens = tokens
                        entry.wake.set()

    def _flush(self) -> None:
        """Append the trace events gathered since the last flush, then forget them."""
        trace = self._trace
        path = self.settings.trace_path
        if trace is None or path is None or not trace:
            return
        with path.open("a") as handle:
            handle.write("".join(json.dumps(event, separators=(",", ":")) + "\n" for event in trace))
        trace.clear()

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(TRACE_FLUSH_S)
            self._flush()

    # -- handlers ----------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        name = self.model_name
        card = {"id": name, "object": "model", "created": self._created, "owned_by": "vllm", "root": name,
                "parent": None, "max_model_len": self.profile.engine.max_model_len, "permission": []}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(self.registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def state(self, request: web.Request) -> web.Response:
        core = self.core
        return web.json_response({
            "now_s": self.now(), "waiting": core.num_waiting, "running": core.num_running,
            "live": core.live_requests(), "pending": len(self._pending), "aborted": self.aborts,
            "refused": self.refused, "successes": self.successes, "counters": asdict(core.scheduler.counters),
            "behind_s": self.behind_s,
        })

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            parsed = _parse(await request.read(), self.profile.engine.max_model_len)
        except BadRequest as error:
            return error_response(400, str(error), error.param)
        if self._stopping:
            return error_response(503, "the engine is shutting down")
        rid = next(self._rids)
        core = self.core
        if not core.submit(rid, prompt_len=parsed.prompt_len, max_tokens=parsed.max_tokens,
                           prompt_key=parsed.prompt_key, now=self._clock()):
            self.refused += 1
            return await self._refuse(request, parsed.stream)
        entry = self._pending[rid] = _Pending(rid, parsed.max_tokens)
        self._wake.set()
        try:
            if parsed.stream:
                return await self._stream(request, entry, parsed)
            return await self._complete(entry, parsed)
        finally:
            # Cancelled (client gone), failed write or stopping: abort as vLLM does on a closed connection.
            del self._pending[rid]
            if not entry.finished:
                self.aborts += 1
                core.abort(rid, self._clock())
                self._wake.set()

    async def _refuse(self, request: web.Request, stream: bool) -> web.StreamResponse:
        """vLLM's queue cap: a 503 before anything is sent, or, for a stream, an SSE error event in a
        200 response (the admission check runs inside the stream generator there)."""
        if not stream:
            return error_response(503, BUSY_MESSAGE)
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        await response.write(b"data: " + error_body(503, BUSY_MESSAGE) + b"\n\n" + _DONE)
        await response.write_eof()
        return response

    def _chunk_head(self, rid: int) -> bytes:
        head = {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name}
        return b"data: " + json.dumps(head, separators=(",", ":")).encode()[:-1]

    async def _stream(self, request: web.Request, entry: _Pending, parsed: _Completion) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                           "Cache-Control": "no-cache"})
        await response.prepare(request)
        head = self._chunk_head(entry.rid)
        interval = self.settings.stream_interval
        sent = 0
        try:
            while True:
                if self._stopping:
                    return response  # the stream ends without [DONE], as when vLLM shuts down
                tokens = entry.tokens
                new = tokens - sent
                # vLLM's rule: the first token at once, then every `interval` tokens, and the last one.
                if entry.finished or (new > 0 and (sent == 0 or new >= interval)):
                    reason = b'"length"' if entry.finished else b"null"
                    await response.write(head + b',"choices":[{"index":0,"text":"' + (_TOKEN * new).encode()
                                         + b'","logprobs":null,"finish_reason":' + reason
                                         + b',"stop_reason":null}]}\n\n')
                    sent = tokens
                    if entry.finished:
                        break
                await entry.wake.wait()
                entry.wake.clear()
            tail = _DONE
            if parsed.include_usage:
                usage = json.dumps({"choices": [], "usage": _usage(parsed)}, separators=(",", ":")).encode()
                tail = head + b"," + usage[1:] + b"\n\n" + _DONE
            await response.write(tail)
            await response.write_eof()
        except ConnectionError:
            pass  # the client left mid-write; the caller aborts the request
        return response

    async def _complete(self, entry: _Pending, parsed: _Completion) -> web.Response:
        while not entry.finished:
            await entry.wake.wait()
            entry.wake.clear()
            if self._stopping:
                return error_response(503, "the engine is shutting down")
        choice = {"index": 0, "text": _TOKEN * parsed.max_tokens, "logprobs": None, "finish_reason": "length",
                  "stop_reason": None, "prompt_logprobs": None}
        return web.json_response({"id": f"cmpl-{entry.rid}", "object": "text_completion",
                                  "created": int(time.time()), "model": self.model_name,
                                  "choices": [choice], "usage": _usage(parsed)})


def _usage(parsed: _Completion) -> dict[str, int]:
    return {"prompt_tokens": parsed.prompt_len, "total_tokens": parsed.prompt_len + parsed.max_tokens,
            "completion_tokens": parsed.max_tokens}


def _report_crash(task: asyncio.Task[None]) -> None:
    """A dead driver would hang every request: say so on stderr at once."""
    if not task.cancelled() and task.exception() is not None:
        print(f"retrybench engine-server: {task.get_name()} crashed: {task.exception()!r}", file=sys.stderr,
              flush=True)


def serve_forever(settings: EngineServerSettings, host: str, port: int) -> None:
    """Run until SIGINT or SIGTERM, then end every stream and flush the trace."""
    serve_until_signalled(lambda: EngineServer(settings), host, port,
                          lambda server, bound: f"retrybench engine-server ready on http://{host}:{bound} "
                                                f"({server.model_name} on {settings.gpu}, time scale "
                                                f"{settings.time_scale})")


def engine_server_command(settings: EngineServerSettings, port: int, host: str = "127.0.0.1") -> list[str]:
    """The `retrybench engine-server` command line for `settings` (prefix_tokens has no flag: the
    CLI always uses the default)."""
    argv = [sys.executable, "-m", "retrybench", "engine-server", "--model", settings.model, "--gpu", settings.gpu,
            "--host", host, "--port", str(port), "--time-scale", repr(settings.time_scale),
            "--stream-interval", str(settings.stream_interval)]
    if settings.max_num_queued_reqs is not None:
        argv += ["--max-num-queued-reqs", str(settings.max_num_queued_reqs)]
    if not settings.async_scheduling:
        argv.append("--sync-scheduling")
    if settings.trace_path is not None:
        argv += ["--trace", str(settings.trace_path)]
    return argv
