"""The deployable overload-control proxy: `ProxyCore` driving real HTTP streams.

Each attempt is an HTTP request; its handler task is the attempt's *subscriber*. Each execution
is a `Relay`: one upstream request, read by one task that forwards the upstream bytes unchanged
to the live subscribers and keeps them (as bytes) for replay while a retry may still attach.
aiohttp serves the client side: its C HTTP parser and `handler_cancellation` (a handler is
cancelled the moment its client disconnects: while queued, before the first token or mid-stream)
are what the overhead targets and the cancellation semantics need. The upstream side is the
proxy's own HTTP/1.1 client on pooled keep-alive connections (upstream.py), which hands each read
to the relay still chunk-framed; only the engine's /metrics scrape goes through aiohttp's client.
Cancelling an execution closes its upstream connection, which is how vLLM learns to abort.

With several upstreams (engine replicas), each has its own pool and `control.router.Router` (the
simulator's code) picks one per execution, from the call key, the prompt as the simulator describes
it and the streams this proxy has open to each; with one, executions go to its pool directly.

With result retention on, a completed execution's relay (status, headers, the whole body or the
chunk-framed stream) outlives its exchange for `retain_s`: an attempt of the same key is answered
from it, streamed or not as the original was (the key covers the request body, so both asked the
same), and the core says when its bytes are freed.

An upstream fault (the connection closed, reset or timed out, its framing broken) fails the
execution: the core ends it, so no retry attaches to it and nothing of it is retained, and each of
its subscribers gets an OpenAI-style error it can act on: a 502 (504 for a timeout) before any
byte of the stream was sent, else an SSE error event and the stream's proper end.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from retrybench.analysis.conformance import actions_of, decision_of
from retrybench.conditions.config import ProxyPolicy
from retrybench.control.proxy import (
    Action,
    Attach,
    AttemptIn,
    Cancel,
    Create,
    Dispatch,
    Drop,
    ProxyCore,
    Refuse,
    Release,
    Retain,
    Serve,
    SetTimer,
    Subscriber,
)
from retrybench.control.router import ROUTER_POLICIES, Router, prompt_prefix
from retrybench.proxy.aiohttp_internals import prepare_raw_chunked, send_head
from retrybench.proxy.eventlog import EventLog
from retrybench.proxy.http1 import ChunkedScanner, ResponseHead, frame_chunk
from retrybench.proxy.proxy_metrics import ProxyMetrics
from retrybench.proxy.upstream import MAX_CLIENT_BUFFER, TimedOut, UpstreamPool
from retrybench.serving.aio import metric_sums
from retrybench.serving.app import new_app, serve_until_signalled, start_app
from retrybench.serving.clock import ScaledClock
from retrybench.serving.openai_api import (
    BadRequest,
    call_identity,
    coalescing_key,
    error_body,
    error_response,
    parse_request,
)

__all__ = ["ProxyServer", "ProxySettings"]

ROUTES = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> chat
FORWARDED_HEADERS = ("Authorization", "Content-Type", "Accept")
JSON = "application/json"
logger = logging.getLogger(__name__)
SHUTDOWN = "shutdown"  # an execution's outcome when the proxy stopped while it ran
SSE_END = b"data: [DONE]\n\n"  # the last event of an OpenAI-compatible stream


@dataclass(frozen=True, kw_only=True)
class ProxySettings:
    upstream: str  # the engine's base URL (the first replica's, with several)
    policy: ProxyPolicy
    more_upstreams: tuple[str, ...] = ()  # further engine replicas: with any, `route` picks one per execution
    route: str = "round-robin"  # control.router.ROUTER_POLICIES; another policy needs several upstreams
    prefix_tokens: int = 2000  # the shared system prompt's length, as prefix-affine routing describes prompts
    max_body_bytes: int = 4 << 20
    log_path: Path | None = None
    scrape_s: float = 1.0  # how often the engine's waiting gauge is read (budget Retry-After, deadline check)
    remembered_calls: int = 1_000_000  # call ids kept to tell retries from first attempts
    time_scale: float = 1.0  # wall seconds per policy second (scaled live runs; 1 in deployment)
    keep_log: bool = False  # also keep the decision log in memory (tests, conformance checks)
    # Opening an upstream connection (wall seconds; None: no limit).
    upstream_connect_timeout_s: float | None = 10.0
    # An exchange with no progress from the engine this long fails (the proxy's seconds, so scaled by
    # time_scale like the engine's own clock; None: no limit). Far above any wait in an engine's queue
    # that the live reproductions run into: vLLM sends a stream's head, then nothing until its first
    # token, and nothing at all for a whole response until it is complete.
    upstream_idle_timeout_s: float | None = 1800.0
    # Bounds on what clients can make the proxy hold; past each, an attempt gets a 503 naming it.
    max_executions: int = 50_000  # queued or streaming at once (the paper's overloads hold a few thousand)
    max_subscribers: int = 1_000  # attempts on one execution (a call's retries attach to it)
    max_replay_bytes: int = 64 << 20  # an execution's output kept for retries to attach (a 300k-token stream)

    def __post_init__(self) -> None:
        upstreams = self.upstreams
        if len(set(upstreams)) != len(upstreams):
            raise ValueError(f"the upstreams must be distinct, got {list(upstreams)}")
        if self.route not in ROUTER_POLICIES:
            raise ValueError(f"unknown route {self.route!r}; known: {', '.join(ROUTER_POLICIES)}")
        if len(upstreams) == 1 and self.route != "round-robin":  # as RunSpec refuses a router for one replica
            raise ValueError(f"route {self.route!r} needs several upstreams (one upstream takes every execution)")

    @property
    def upstreams(self) -> tuple[str, ...]:
        """Every engine replica's base URL, without a trailing slash."""
        return tuple(url.rstrip("/") for url in (self.upstream, *self.more_upstreams))


@dataclass(eq=False, slots=True)
class _Subscriber:
    key: Subscriber
    arrived: float = 0.0  # time.monotonic() when its request was read: its time to first token counts from there
    transport: asyncio.Transport | None = None  # set once it receives live bytes
    finished: asyncio.Future[None] | None = None
    first_token_seen: bool = False


class Relay:
    """One execution: its upstream exchange, the bytes it produced, the subscribers it feeds.

    The upstream calls `on_head`, `on_first_payload`, `on_body` and `on_end` as bytes arrive. A
    streamed body is kept chunk-framed exactly as the upstream sent it and written unchanged to
    every live subscriber's socket; it is kept for replay only while a retry may still attach
    (coalescing) or a subscriber is catching up.
    """

    def __init__(self, server: ProxyServer, execution_id: int, path: str, body: bytes, headers: dict[str, str],
                 stream: bool, keep_replay: bool, key: str = "", prompt_tokens: int = 0) -> None:
        self.server = server
        self.execution_id = execution_id
        self.key, self.prompt_tokens = key, prompt_tokens  # what a router reads
        self.pool: UpstreamPool | None = None  # the upstream it was dispatched to
        self.replica = -1  # that upstream's index while its stream is open (several upstreams only)
        self.path, self.body, self.headers = path, body, headers
        self.stream = stream
        self.keep_replay = keep_replay
        self.status = 0
        self.content_type = JSON
        self.chunks: list[bytes] = []  # chunk-framed for a live stream, else the body's raw bytes
        self.ready = asyncio.Event()  # status known (streams), or the whole body in (others)
        self.done = False
        self.truncated = False  # the upstream stream broke before its end
        self.error_tail: bytes | None = None  # what ends a broken stream for its subscribers (None: reset them)
        self.refused = False  # a 503 sent as an SSE error event inside HTTP 200
        self.pending = 0  # subscribers not yet receiving live bytes
        self.delivered_whole = False  # a client left after the stream's end marker, before its last chunk
        self.replay_bytes = 0
        self.replay_dropped = False  # its output outgrew max_replay_bytes: no retry can attach any more
        self.first_token = False  # a streamed 200 whose first payload (not an error event) arrived
        self.live: list[_Subscriber] = []
        self.subscribers = 0
        self.task: asyncio.Task[None] | None = None
        self.connection: Any = None
        self.ended: asyncio.Future[str] | None = None  # the outcome, once the upstream exchange ends
        self._streaming = False  # an HTTP 200 stream being relayed live
        self._framed = True  # the upstream's body is chunk-framed (else the relay frames it)
        self._chunked_upstream = False

    # -- the upstream's callbacks ------------------------------------------------------------------

    def on_connection(self, connection: Any) -> None:
        self.connection = connection
        self.rewire()

    def rewire(self) -> None:
        """Let the upstream connection write straight to the one live client while nobody else
        needs the bytes (none kept for replay, none catching up); called whenever that changes."""
        connection = self.connection
        if connection is None or connection.sink is not self:  # its exchange is over (the connection may serve another)
            return
        alone = (self._streaming and self._framed and not self.keep_replay and not self.pending
                 and len(self.live) == 1)
        connection.direct = self.live[0].transport if alone else None

    def forwarded_the_end(self) -> bool:
        """Whether the bytes forwarded so far end with the SSE end marker: a client that leaves now
        has the whole response (clients may close on `data: [DONE]`, before the body's last chunk)."""
        connection = self.connection
        return (self._streaming and self._framed and connection is not None and connection.sink is self
                and SSE_END in connection.last_body[-len(SSE_END) - 8:])

    def on_head(self, head: ResponseHead) -> None:
        self.status = head.status
        self.content_type = head.headers.get("content-type", JSON)
        self._chunked_upstream = head.chunked
        if head.status == 200 and self.stream:
            self._streaming = True
            self._framed = head.chunked
            self.ready.set()

    def on_first_payload(self, payload: bytes) -> None:
        if not self._streaming:
            return
        self.refused = b'"error"' in payload[:64] and b"503" in payload
        if not self.refused:
            self.first_token = True
            self.server.engine_event(self, "first_token")
            for sub in self.live:  # the payload is written to their sockets next, in this same callback
                self.server.first_token_sent(sub)

    def on_body(self, data: bytes) -> None:
        if not data:
            return
        if not self._streaming:
            self.chunks.append(data)
            return
        if not self._framed:
            data = frame_chunk(data)
        self._send(data)

    def _send(self, data: bytes) -> None:
        if self.keep_replay or self.pending:
            self.chunks.append(data)
            self.replay_bytes += len(data)
            if self.replay_bytes > self.server.settings.max_replay_bytes and self.keep_replay:
                self._drop_replay()
        for sub in self.live:
            transport = sub.transport
            assert transport is not None
            if transport.is_closing():
                continue  # that client left; its handler is being cancelled and reports it
            transport.write(data)
            if transport.get_write_buffer_size() > MAX_CLIENT_BUFFER:
                transport.close()  # a client that stopped reading must not hold the proxy's memory

    def _drop_replay(self) -> None:
        """Stop keeping the output for retries: it outgrew max_replay_bytes. Subscribers still catching
        up keep what they need; nothing of it is retained."""
        self.keep_replay = False
        self.replay_dropped = True
        if not self.pending:
            self.chunks = []
        self.rewire()

    def on_end(self, error: str | None) -> None:
        if self.ended is None or self.ended.done():
            return
        if isinstance(error, TimedOut):
            outcome = self._fail(504, f"upstream timed out: {error}")
        elif error is not None:
            outcome = self._fail(502, f"upstream failed: {error}")
        elif self._streaming:
            if not self._framed:
                self._send(b"0\r\n\r\n")
            kind = "refused" if self.refused else "completed"
            kept = sum(map(len, self.chunks)) if kind == "completed" and self.keep_replay else None
            self.server.engine_event(self, kind, kept)
            outcome = kind
        else:
            body = b"".join(self.chunks)
            if self._chunked_upstream:
                payload: list[bytes] = []
                ChunkedScanner().feed(body, payload)
                body = b"".join(payload)
            self.chunks = [body]
            if self.status == 200 and not _is_json(body):
                outcome = self._fail(502, "upstream failed: its response is not valid JSON")
            else:
                outcome = self.server.whole_response(self)
        self.ended.set_result(outcome)

    def _fail(self, status: int, message: str) -> str:
        """The upstream exchange broke: the core ends the execution (no retry attaches to it, nothing
        of it is retained) and every subscriber gets the error: as the whole response, or as the
        end of a stream already under way."""
        if self._streaming:
            self.truncated = True
            self.error_tail = self._error_tail(status, message)
            if self.error_tail is not None:
                self._send(self.error_tail)
        else:
            self.status, self.content_type = status, JSON
            self.chunks = [error_body(status, message)]
        self.server.engine_event(self, "refused")
        return "failed"

    def _error_tail(self, status: int, message: str) -> bytes | None:
        """The bytes that end a broken stream for its subscribers: the end of the chunk it stopped in,
        an SSE error event (after blank lines that end any partial event, unless it stopped cleanly
        between events), `data: [DONE]` as vLLM sends after its own error events, and the last chunk.
        None where the framing cannot be ended (the subscribers are then reset)."""
        connection = self.connection
        fix = connection.tail_fix if self._framed and connection is not None else b""
        if fix is None:
            return None
        last = connection.last_body if connection is not None else b""
        clean = self._framed and fix == b"" and (not last or last.endswith(b"\n\n\r\n"))
        event = b"data: " + error_body(status, message) + b"\n\n" + SSE_END
        return fix + frame_chunk(event if clean else b"\n\n" + event) + b"0\r\n\r\n"

    def close_upstream(self) -> None:
        if self.connection is not None:
            self.connection.close()


class ProxyServer:
    """The proxy's state and handlers; `start` binds it, `stop` ends every stream and task."""

    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.core = ProxyCore(settings.policy)
        self.clock = ScaledClock(settings.time_scale)
        self.upstreams = settings.upstreams
        self.upstream = self.upstreams[0]
        several = len(self.upstreams) > 1
        self.router = Router(settings.route, self.upstreams) if several else None
        self.streams = [0] * len(self.upstreams)  # executions dispatched to each upstream and not ended
        self.metrics = ProxyMetrics(self.core, relays=lambda: len(self.relays),
                                    subscribers=lambda: self.open_subscribers,
                                    engine_waiting=lambda: self.engine_waiting, now=self.now,
                                    upstreams=self.upstreams if several else (), streams=self.streams)
        self.relays: dict[int, Relay] = {}
        self.retained: dict[int, Relay] = {}  # completed executions whose response may be served again
        self.open_subscribers = 0
        self.engine_waiting = 0
        self._calls: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()  # -> (index, attempts)
        self._anonymous = 0
        self._calls_seen = 0
        self._timers: dict[tuple[float, int], asyncio.Handle] = {}  # (due, execution) -> handle
        self._session: aiohttp.ClientSession | None = None  # for scraping the engine's /metrics
        self._pools: list[UpstreamPool] = []  # one per upstream, opened by start()
        self._waiting = [0] * len(self.upstreams)  # each upstream's waiting gauge as last scraped
        self._runner: web.AppRunner | None = None
        self._scraper: asyncio.Task[None] | None = None
        self._stopping = False
        self._awaited_at_stop: set[int] = set()  # executions a client still waited for when the proxy stopped
        header = {"t0_unix": time.time(), "time_scale": settings.time_scale, "upstream": settings.upstream,
                  "policy": asdict(settings.policy)}
        if several:
            header.update(upstreams=list(self.upstreams), route=settings.route)
        self.log = EventLog(settings.log_path, header, keep=settings.keep_log)

    # -- lifecycle ---------------------------------------------------------------------------

    def app(self) -> web.Application:
        routes = [web.post(path, self.handle_completion) for path in ROUTES]
        routes += [web.get("/metrics", self.handle_metrics), web.route("*", "/{tail:.*}", self.handle_unknown)]
        return new_app(routes, client_max_size=self.settings.max_body_bytes, health=self.handle_health)

    async def start(self, host: str = "127.0.0.1", port: int = 8000) -> int:
        """Bind and serve; returns the port (useful with port 0)."""
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                              auto_decompress=False, skip_auto_headers=("User-Agent",))
        settings = self.settings
        idle_s = settings.upstream_idle_timeout_s
        self._pools = [UpstreamPool(url, connect_timeout_s=settings.upstream_connect_timeout_s,
                                    idle_timeout_s=None if idle_s is None else idle_s * settings.time_scale)
                       for url in self.upstreams]
        self._runner, bound = await start_app(self.app(), host, port, reuse_address=True)
        self._scraper = asyncio.create_task(self._housekeeping())
        return bound

    async def stop(self) -> None:
        self._stopping = True  # the executions ended below are cut off by the shutdown, not cancelled
        self._awaited_at_stop = {i for i, r in self.relays.items() if r.live or r.pending}
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self.retained.clear()
        if self._scraper is not None:
            self._scraper.cancel()
        for relay in list(self.relays.values()):
            if relay.task is not None:
                relay.task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        tasks = [r.task for r in self.relays.values() if r.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        for pool in self._pools:
            pool.close()
        self.log.close()

    def now(self) -> float:
        """Policy seconds since the proxy started (wall seconds / time_scale)."""
        return self.clock.now()

    def _log(self, event: dict[str, Any]) -> None:
        event.setdefault("t", self.now())
        self.log.write(event)

    # -- small routes ------------------------------------------------------------------------

    async def handle_health(self, request: web.Request) -> web.Response:
        """200 once it listens with at least one upstream to send executions to (its body says how many)."""
        status = 200 if self.upstreams else 503
        return web.json_response({"upstreams": len(self.upstreams), "route": self.settings.route if
                                  self.router is not None else None}, status=status)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def handle_unknown(self, request: web.Request) -> web.Response:
        status = 405 if request.path in ROUTES else 404
        return error_response(status, f"{request.method} {request.path} is not served here")

    # -- attempts ----------------------------------------------------------------------------

    def _attempt_number(self, tenant: str, call_id: str | None) -> tuple[int, int, str]:
        """(call index, attempt number, call id): an attempt of a call id seen before is a retry."""
        if call_id is None:  # no retry can name it again: nothing to remember
            self._anonymous += 1
            return self._new_call_index(), 0, f"anonymous-{self._anonymous}"
        identity = (tenant, call_id)
        known = self._calls.pop(identity, None)
        index, attempts = known if known is not None else (self._new_call_index(), 0)
        self._calls[identity] = (index, attempts + 1)
        if len(self._calls) > self.settings.remembered_calls:
            self._calls.popitem(last=False)
        return index, attempts, call_id

    def _new_call_index(self) -> int:
        """Calls are numbered in order of their first attempt (a forgotten call id stays numbered)."""
        self._calls_seen += 1
        return self._calls_seen - 1

    async def handle_completion(self, request: web.Request) -> web.StreamResponse:
        chat = ROUTES[request.path]
        try:
            body = await request.read()
            arrived = time.monotonic()
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, f"the body is over the limit of {self.settings.max_body_bytes} bytes")
        try:
            parsed = parse_request(body, chat)
            tenant, given_id = call_identity(request.headers)
        except BadRequest as error:
            return error_response(400, str(error), error.param)
        if len(self.relays) >= self.settings.max_executions:
            return self._over_limit("max_executions", f"the proxy holds {len(self.relays)} executions, its limit")
        call_index, attempt_no, call_id = self._attempt_number(tenant, given_id)
        key = coalescing_key(tenant, call_id, request.path, body)
        now = self.now()
        attempt = AttemptIn(call_index, attempt_no, key, parsed.prompt_tokens, parsed.max_tokens)
        decision = self.core.on_attempt(attempt, now, engine_waiting=self.engine_waiting)
        self.metrics.on_decision(attempt_no, decision)
        if self.log.active:
            self._log({"ev": "attempt", "t": now, "call": call_index, "attempt": attempt_no, "call_id": call_id,
                       "client_attempt": request.headers.get("X-Retrybench-Attempt"), "key": key,
                       "prompt_tokens": parsed.prompt_tokens, "max_tokens": parsed.max_tokens,
                       "engine_waiting": self.engine_waiting, **decision_of(decision)})
        if isinstance(decision, Refuse):
            return _refusal(decision)
        if isinstance(decision, Serve):
            kept = self.retained.get(decision.execution_id)
            if kept is None:  # the core and this map change together: a bug, but never a hang
                logger.error("execution %d was to be served retained but is not held", decision.execution_id)
                return error_response(500, "the retained response is missing")
            return await self._serve(request, kept, _Subscriber((call_index, attempt_no), arrived), attached=False,
                                     retained=True)
        if isinstance(decision, Create):
            policy = self.settings.policy
            relay = Relay(self, decision.execution_id, request.path, body, _forward_headers(request), parsed.stream,
                          keep_replay=policy.coalescing or policy.retain_s > 0, key=key,
                          prompt_tokens=parsed.prompt_tokens)
            self.relays[decision.execution_id] = relay
            if decision.dispatch:
                self._dispatch(relay)
        else:
            assert isinstance(decision, Attach)
            relay = self.relays[decision.execution_id]
            refused = self._attach_refused(relay)
            if refused is not None:
                self._left((call_index, attempt_no))  # the core attached it: it leaves at once
                return self._over_limit(*refused)
            if relay.subscribers == 1:  # its first retry attached
                self.metrics.fate("attached")
        return await self._serve(request, relay, _Subscriber((call_index, attempt_no), arrived),
                                 attached=isinstance(decision, Attach))

    async def _serve(self, request: web.Request, relay: Relay, sub: _Subscriber,
                     attached: bool, retained: bool = False) -> web.StreamResponse:
        """Be the attempt's subscriber until its execution ends or its client leaves (at once for
        a retained response: it is whole)."""
        relay.pending += 1
        relay.rewire()  # the live client's bytes are now kept for this one
        relay.subscribers += 1
        self.open_subscribers += 1
        joined = finished = False
        try:
            await relay.ready.wait()
            headers = {"X-Retrybench-Execution": str(relay.execution_id),
                       "X-Retrybench-Attached": "1" if attached else "0"}
            if retained:
                headers["X-Retrybench-Retained"] = "1"
            if not relay.stream or relay.status != 200:
                finished = True
                if relay.status == 0:  # the proxy is shutting down
                    return error_response(503, "the proxy is shutting down")
                return web.Response(status=relay.status, body=b"".join(relay.chunks),
                                    headers={**headers, "Content-Type": relay.content_type})
            response = web.StreamResponse(status=200, headers={**headers, "Content-Type": relay.content_type,
                                                               "Cache-Control": "no-cache"})
            # From here on the relay writes the upstream's chunk-framed bytes to the socket itself.
            writer = await prepare_raw_chunked(response, request)
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the client left")
            sub.transport = transport
            sent = len(relay.chunks)  # a replay goes with the head in one write, then live bytes follow
            await send_head(writer, b"".join(relay.chunks[:sent]))
            if len(relay.chunks) > sent:  # arrived during that write; from here on nothing awaits
                transport.write(b"".join(relay.chunks[sent:]))
            relay.pending -= 1
            joined = True
            if relay.first_token:  # its replay (or the bytes that came during it) held the first payload
                self.first_token_sent(sub)
            if not relay.keep_replay and relay.pending == 0:
                relay.chunks = []
            if not relay.done:
                sub.finished = asyncio.get_running_loop().create_future()
                relay.live.append(sub)
                relay.rewire()
                await sub.finished
            if relay.truncated and relay.error_tail is None:  # the client must not see an end
                raise ConnectionResetError("the upstream stream broke where no error event can follow")
            await response.write_eof()
            finished = True
            return response
        finally:
            self.open_subscribers -= 1
            if not joined:
                relay.pending -= 1
            if sub in relay.live:
                relay.live.remove(sub)
            relay.rewire()
            if not finished and joined and relay.forwarded_the_end():
                relay.delivered_whole = True  # it left with everything: not a subscriber that gave up
            elif not finished:
                self._left(sub.key)

    def _attach_refused(self, relay: Relay) -> tuple[str, str] | None:
        """(limit, why) when a retry may not attach to `relay`: too many subscribers, or its output
        outgrew the replay limit (it cannot be replayed from the start)."""
        if relay.subscribers >= self.settings.max_subscribers:
            return "max_subscribers", f"execution {relay.execution_id} has {relay.subscribers} subscribers, its limit"
        if relay.replay_dropped:
            return "max_replay_bytes", (f"execution {relay.execution_id}'s output is over "
                                        f"{self.settings.max_replay_bytes} bytes and cannot be replayed to a retry")
        return None

    def _over_limit(self, limit: str, why: str) -> web.Response:
        """A 503 that names the limit the attempt ran into (a client may retry later)."""
        self.metrics.limit_refused(limit)
        return error_response(503, f"{why} ({limit}); retry later", limit, headers={"Retry-After": "1"})

    def first_token_sent(self, sub: _Subscriber) -> None:
        """Count the subscriber's time to first token once: from its request read to its stream's first
        payload written to its socket (live, or in the replay it joined with)."""
        if not sub.first_token_seen:
            sub.first_token_seen = True
            self.metrics.time_to_first_token.observe(time.monotonic() - sub.arrived)

    def _left(self, key: Subscriber) -> None:
        now = self.now()
        actions = self.core.on_subscriber_left(key, now)
        if self.log.active:
            self._log({"ev": "left", "t": now, "call": key[0], "attempt": key[1], "actions": actions_of(actions)})
        self._apply(actions)

    # -- executions --------------------------------------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Cancel):
                relay = self.relays.get(action.execution_id)
                if relay is not None and relay.task is not None:
                    relay.task.cancel()  # closes the upstream connection: the engine aborts
                self.metrics.fate("cancelled")
            elif isinstance(action, Dispatch):
                self._dispatch(self.relays[action.execution_id])
            elif isinstance(action, Drop):
                self.relays.pop(action.execution_id, None)
                self.core.forget(action.execution_id)
                self.metrics.fate("dropped")
                if self.log.active:
                    self._log({"ev": "end", "execution": action.execution_id, "fate": "dropped"})
            elif isinstance(action, SetTimer):
                self._arm_timer(action.at_s, action.execution_id)
            elif isinstance(action, Retain):
                relay = self.relays[action.execution_id]
                relay.body = b""  # the request was sent; only the response is served again
                self.retained[action.execution_id] = relay
            elif isinstance(action, Release):
                self.retained.pop(action.execution_id, None)

    def _arm_timer(self, at_s: float, execution_id: int) -> None:
        delay = self.clock.wall_until(at_s)
        handle = asyncio.get_running_loop().call_later(delay, self._timer_due, at_s, execution_id)
        self._timers[(at_s, execution_id)] = handle

    def _timer_due(self, at_s: float, execution_id: int) -> None:
        self._timers.pop((at_s, execution_id), None)
        now = self.now()
        if now < at_s:  # uvloop's timers have millisecond resolution and may fire a little early
            self._arm_timer(at_s, execution_id)
            return
        actions = self.core.on_timer(execution_id, now)
        if self.log.active:
            self._log({"ev": "timer", "t": now, "execution": execution_id, "actions": actions_of(actions)})
        self._apply(actions)

    def engine_event(self, relay: Relay, kind: str, result_bytes: int | None = None) -> None:
        """`result_bytes`: a completed HTTP 200 response's size, for result retention."""
        now = self.now()
        actions = self.core.on_engine_event(relay.execution_id, kind, now, result_bytes)
        if self.log.active:
            event = {"ev": "engine", "t": now, "execution": relay.execution_id, "kind": kind,
                     "actions": actions_of(actions)}
            if result_bytes is not None:
                event["bytes"] = result_bytes
            self._log(event)
        self._apply(actions)

    def _dispatch(self, relay: Relay) -> None:
        pool = self._pools[0] if self.router is None else self._route(relay)
        relay.pool = pool
        relay.ended = asyncio.get_running_loop().create_future()
        request = pool.request_bytes("POST", relay.path, relay.headers, relay.body)
        sent = pool.send_now(request, relay)  # on a pooled connection at once, or in the task
        relay.task = asyncio.create_task(self._run_upstream(relay, None if sent else request))
        relay.task.add_done_callback(lambda _: self._upstream_task_done(relay))

    def _route(self, relay: Relay) -> UpstreamPool:
        """The upstream the router picks for `relay` (once per execution, never per chunk)."""
        router = self.router
        assert router is not None
        prefix = (prompt_prefix(relay.key, relay.prompt_tokens, self.settings.prefix_tokens)
                  if router.policy == "prefix-affine" else ())
        replica = router.choose(relay.key, prefix, self.streams)
        self.streams[replica] += 1
        relay.replica = replica
        self.metrics.routed(replica)
        if self.log.active:
            self._log({"ev": "route", "execution": relay.execution_id, "upstream": replica})
        return self._pools[replica]

    def _upstream_task_done(self, relay: Relay) -> None:
        """A task cancelled before it first ran never enters its body, so its cleanup never runs (a
        queued call dispatched as a slot freed, whose client left in the same instant): end the
        execution here. A no-op for a task that ran, whose body ended it."""
        if not relay.done:
            relay.close_upstream()
            self._finish(relay, SHUTDOWN if self._stopping else "cancelled")
        # The task's traceback holds the frame that holds the relay: let reference counting free them
        # at once rather than leaving a cycle for the (deliberately infrequent) cyclic collector.
        relay.task = relay.connection = None

    async def _run_upstream(self, relay: Relay, request: bytes | None) -> None:
        """The execution's life upstream; cancelling this task closes the upstream connection."""
        pool = relay.pool
        assert pool is not None and relay.ended is not None
        outcome = "failed"
        try:
            if request is not None:
                try:
                    await pool.open(request, relay)
                except TimeoutError:
                    relay.on_end(TimedOut(f"no connection within {pool.connect_timeout_s:g} s"))
                except OSError as error:
                    relay.on_end(f"upstream unreachable: {error}")
                except Exception as error:  # a bug must fail the execution, never hang its subscribers
                    logger.exception("execution %d failed", relay.execution_id)
                    relay.on_end(f"proxy error: {error!r}")
            outcome = await relay.ended
        except asyncio.CancelledError:
            outcome = SHUTDOWN if self._stopping else "cancelled"
            raise
        finally:
            if outcome in ("cancelled", SHUTDOWN):
                relay.close_upstream()
            self._finish(relay, outcome)

    def whole_response(self, relay: Relay) -> str:
        """A response that is not streamed: it reaches subscribers once it is complete."""
        if relay.status == 200:
            self.engine_event(relay, "first_token")
            self.engine_event(relay, "completed", len(relay.chunks[0]))
            return "completed"
        self.engine_event(relay, "refused" if relay.status == 503 else "completed")
        return "refused" if relay.status == 503 else "failed"

    def _finish(self, relay: Relay, outcome: str) -> None:
        """The execution ended: wake every subscriber, free its buffers, count its fate.

        An execution still running when the proxy stops was not cancelled by a policy: it is logged
        as the simulator records an execution live at the end of a run, orphaned when nobody waited
        for it any more, else unfinished, and not counted in /metrics (the proxy is going away)."""
        relay.done = True
        relay.ready.set()
        if relay.replica >= 0:
            self.streams[relay.replica] -= 1
            relay.replica = -1
        for sub in relay.live:
            if sub.finished is not None and not sub.finished.done():
                sub.finished.set_result(None)
        delivered = relay.subscribers > 0 and (relay.live or relay.pending or relay.delivered_whole)
        self.relays.pop(relay.execution_id, None)
        self.core.forget(relay.execution_id)
        cut_off = outcome == SHUTDOWN
        if outcome == "completed":
            outcome = "completed" if delivered else "orphaned"
        elif cut_off:
            outcome = "unfinished" if relay.execution_id in self._awaited_at_stop else "orphaned"
        if outcome != "cancelled" and not cut_off:  # cancellations are counted when they are decided
            self.metrics.fate(outcome)
        if self.log.active:
            self._log({"ev": "end", "execution": relay.execution_id, "fate": outcome})

    async def _housekeeping(self) -> None:
        """Flush the log, and read the engine's waiting gauge (as the paper's proxy did from vLLM's
        /metrics) where a control uses it: the budget's Retry-After and the deadline check."""
        assert self._session is not None
        policy = self.settings.policy
        scrape = policy.retry_budget or policy.deadline_check
        while True:
            if policy.retain_s > 0:
                self._expire_retained()
            if scrape:  # every replica's gauge, summed (as the simulator's proxy reads a deployment's)
                for index, url in enumerate(self.upstreams):
                    try:
                        async with self._session.get(url + "/metrics") as response:
                            text = await response.read()
                        self._waiting[index] = int(metric_sums(text).get("vllm:num_requests_waiting", 0.0))
                    except (aiohttp.ClientError, OSError, ValueError):
                        pass  # keep the last value; the engine may be starting
                self.engine_waiting = sum(self._waiting)
            self.log.flush()
            await asyncio.sleep(min(self.settings.scrape_s, self.log.flush_s))

    def _expire_retained(self) -> None:
        now = self.now()
        actions = self.core.expire(now)
        if actions:
            if self.log.active:
                self._log({"ev": "expire", "t": now, "actions": actions_of(actions)})
            self._apply(actions)


def _is_json(body: bytes) -> bool:
    """Whether a whole response is JSON (once per response, never per streamed chunk)."""
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def _forward_headers(request: web.Request) -> dict[str, str]:
    return {name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers}


def _refusal(decision: Refuse) -> web.Response:
    if decision.status == 429:
        wait = decision.retry_after_s or 0.0
        headers = {"Retry-After": str(max(1, int(wait + 0.999))), "Retry-After-Ms": str(int(wait * 1000))}
        return error_response(429, "retry budget exhausted", headers=headers)
    return error_response(decision.status, "the proxy estimates this attempt would miss its deadline")


# The cyclic collector's generation thresholds while serving (Python's defaults: 700, 10, 10).
SERVING_GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc_for_serving() -> None:
    """Keep the cyclic collector's pauses out of the streams' tail latency. With 1,000 streams the
    proxy allocates tens of thousands of objects a second, and at Python's default thresholds the
    collector runs hundreds of times a second, now and then over every live object (measured: p99
    time to first token 22-24 ms at 1,000 streams, against 3.6 ms direct). What startup built is
    frozen out of every collection, and the young generation is collected 70 times less often;
    cycles are still freed, later (measured p99: 8-11 ms)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLDS)


def serve_forever(settings: ProxySettings, host: str, port: int) -> None:
    """Run the proxy until SIGINT or SIGTERM, then close every stream and flush the log."""
    tune_gc_for_serving()
    upstreams = ", ".join(settings.upstreams)
    routed = f" (route {settings.route})" if len(settings.upstreams) > 1 else ""
    serve_until_signalled(lambda: ProxyServer(settings), host, port,
                          lambda _, bound: f"retrybench proxy on http://{host}:{bound} -> {upstreams}{routed}")

