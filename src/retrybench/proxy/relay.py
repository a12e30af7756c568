"""One execution's stream: its upstream exchange relayed, byte for byte, to the attempts subscribed to it.

Each attempt is an HTTP request; its handler task is the attempt's *subscriber*. Each execution is a
`Relay`: one upstream request, read by one task that forwards the upstream bytes unchanged to the live
subscribers and keeps them (as bytes) for replay while a retry may still attach. This is the proxy's
per-chunk path, whose CPU per streamed chunk is measured against nginx, so it is kept apart from the
per-attempt and per-execution bookkeeping and calls back into it only for an execution's events (its
first token, its end), never per chunk.

An upstream fault (the connection closed, reset or timed out, its framing broken) fails the execution,
and each of its subscribers gets an OpenAI-style error it can act on: a 502 (504 for a timeout) before
any byte of the stream was sent, else an SSE error event and the stream's proper end.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Protocol

from retrybench.control.proxy import Subscriber
from retrybench.proxy.http1 import ChunkedScanner, ResponseHead, frame_chunk
from retrybench.proxy.proxy_settings import ProxySettings
from retrybench.proxy.upstream import MAX_CLIENT_BUFFER, Cut, TimedOut, UpstreamPool
from retrybench.serving.openai_api import error_body

__all__ = ["SHUTDOWN", "ClientSubscriber", "Relay", "RelayOwner"]

SHUTDOWN = "shutdown"  # an execution's outcome when the proxy stopped while it ran
JSON = "application/json"
SSE_END = b"data: [DONE]\n\n"  # the last event of an OpenAI-compatible stream


@dataclass(eq=False, slots=True)
class ClientSubscriber:
    """An attempt's client as a subscriber of one execution: its socket once it receives live bytes, and
    the future its handler waits on until the execution ends."""

    key: Subscriber
    arrived: float = 0.0  # time.monotonic() when its request was read: its time to first token counts from there
    transport: asyncio.Transport | None = None  # set once it receives live bytes
    finished: asyncio.Future[None] | None = None
    first_token_seen: bool = False


class RelayOwner(Protocol):
    """What a relay reports to: the proxy server (`ProxyServer`), which turns these events into the
    core's decisions. A protocol, so that this module does not import the server that imports it."""

    settings: ProxySettings

    def engine_event(self, relay: Relay, kind: str, result_bytes: int | None = None) -> None: ...

    def first_token_sent(self, sub: ClientSubscriber) -> None: ...

    def whole_response(self, relay: Relay) -> str: ...


class Relay:
    """One execution: its upstream exchange, the bytes it produced, the subscribers it feeds.

    The upstream calls `on_head`, `on_first_payload`, `on_body` and `on_end` as bytes arrive. A
    streamed body is kept chunk-framed exactly as the upstream sent it and written unchanged to
    every live subscriber's socket; it is kept for replay only while a retry may still attach
    (coalescing) or a subscriber is catching up.
    """

    def __init__(self, server: RelayOwner, execution_id: int, path: str, body: bytes, headers: dict[str, str],
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
        self.engine_refused = False  # the engine's own 503 as a whole response, answered as the policy says
        self.pending = 0  # subscribers not yet receiving live bytes
        self.delivered_whole = False  # a client left after the stream's end marker, before its last chunk
        self.replay_bytes = 0
        self.replay_dropped = False  # its output outgrew max_replay_bytes: no retry can attach any more
        self.first_token = False  # a streamed 200 whose first payload (not an error event) arrived
        self.live: list[ClientSubscriber] = []
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
        if isinstance(error, Cut):  # the proxy's own end: nothing the engine did, so the core is not told
            self._fail(503, str(error), report=False)
            outcome = SHUTDOWN
        elif isinstance(error, TimedOut):
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

    def _fail(self, status: int, message: str, report: bool = True) -> str:
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
        if report:
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

    def cut(self, reason: str) -> None:
        """End the execution for the proxy's shutdown: every subscriber gets a 503 saying `reason` (a
        call may be retried elsewhere), as its whole response or as the end of its stream (an SSE error
        event, as for an upstream fault). An execution still queued in the proxy is answered the same."""
        connection = self.connection
        if connection is not None and connection.sink is self:
            connection.abort(Cut(reason))  # closes the upstream connection, then ends here (on_end)
        elif self.ended is not None:
            self.on_end(Cut(reason))  # dispatched, its connection not yet open
        elif not self.done:  # queued in the proxy: never dispatched
            self.status, self.content_type, self.chunks = 503, JSON, [error_body(503, reason)]
            self.ready.set()

    def close_upstream(self) -> None:
        if self.connection is not None:
            self.connection.close()


def _is_json(body: bytes) -> bool:
    """Whether a whole response is JSON (once per response, never per streamed chunk)."""
    try:
        json.loads(body)
    except ValueError:
        return False
    return True
