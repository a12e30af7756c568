"""An OpenAI-style upstream that misbehaves on request: the engine faults the proxy must survive.

A raw HTTP/1.1 server (one request per connection, answered with `Connection: close`, so that the
proxy never mistakes a fault for a stale keep-alive connection), since the faults live below what
an HTTP framework lets a handler do: a reset before the head, a chunk cut in half, a chunk size
that is not hex. The request body's `stub` object picks the fault:

- `fault`: `close` (close the connection between two events), `close_mid_event` (inside one),
  `reset` (RST before the head), `hang_before_head`, `hang` (the head, then no byte at all),
  `drip` (the stream's bytes one every `drip_ms`, 1000 by default), `status` (answer `status`,
  503 by default, in vLLM's form), `malformed_sse` (events that are not JSON, then a proper end),
  `invalid_json` (a whole 200 response that is not JSON), `bad_framing` (a chunk size that is not
  hex), `bad_framing_mid_event` (half an event's chunk, then, in a later write, bytes that break it).
- `after`: how many events go out before a mid-stream fault (2 by default).
- `gate`: wait for `FaultUpstream.gate` before the fault (after the head and the `after` events
  where there are any), so that a test can attach retries first without depending on timing.
- `fault_times`: only the first N requests with this body get the fault; later ones (a retry
  after the execution failed) are served properly. Every one by default.
- `interval_ms`: between two events of a proper stream.

`crash()` resets every connection and stops listening, as an engine process dying does (requests
queued, in prefill and streaming alike); `restart()` listens on the same port again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import struct
from collections import Counter
from typing import Any

from retrybench.live.http1 import frame_chunk

__all__ = ["FAULTS", "FaultUpstream"]

FAULTS = ("close", "close_mid_event", "reset", "hang_before_head", "hang", "drip", "status", "malformed_sse",
          "invalid_json", "bad_framing", "bad_framing_mid_event")
# Between the two writes of `bad_framing_mid_event`, so that the proxy most likely reads them apart; the
# outcome must be the same if it reads them at once.
_SPLIT_S = 0.05
_EVENT = b'data: {"id":"cmpl-fault","object":"text_completion","choices":[{"index":0,"text":" tok"}]}\n\n'
_DONE = b"data: [DONE]\n\n"
_STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n")
_BUSY = {"error": {"message": "The engine is currently busy", "type": "ServiceUnavailableError", "param": None,
                   "code": 503}}


def _whole(status: int, body: bytes) -> bytes:
    reason = {200: "OK", 503: "Service Unavailable"}.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a process that dies does for its open sockets."""
    if writer.transport.is_closing():
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):  # ValueError: uvloop's socket of a closed handle
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultUpstream:
    """The misbehaving upstream; it counts what it did, which tests read."""

    def __init__(self) -> None:
        self.requests = 0
        self.served = 0  # proper responses sent whole
        self.faults: Counter[str] = Counter()  # faults injected, by kind
        self.disconnects = 0  # responses under way that the proxy ended by closing the connection
        self.crashes = 0
        self.gate = asyncio.Event()
        self.host = "127.0.0.1"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._faulted: Counter[bytes] = Counter()  # by request body digest

    @property
    def open_connections(self) -> int:
        return len(self._writers)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        self.host, self.port = host, self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        self.crash()

    def crash(self) -> None:
        """Stop listening and reset every connection (the port then refuses connections)."""
        if self._server is not None:
            self._server.close()
            self._server = None
            self.crashes += 1
        for writer in list(self._writers):
            _reset(writer)

    async def restart(self) -> None:
        """Listen again on the same port, as an engine restarted by its supervisor."""
        await self.start(self.host, self.port)

    # -- one connection ----------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            body = await _read_request(reader)
            if body is not None:
                self.requests += 1
                await self._respond(body, reader, writer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnects += 1
        finally:
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    def _fault_for(self, body: bytes, stub: dict[str, Any]) -> str | None:
        fault = stub.get("fault")
        if fault is None:
            return None
        digest = hashlib.sha256(body).digest()
        if self._faulted[digest] >= int(stub.get("fault_times", 1 << 30)):
            return None
        self._faulted[digest] += 1
        self.faults[fault] += 1
        return str(fault)

    async def _respond(self, body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = json.loads(body)
        stub = data.get("stub", {})
        fault = self._fault_for(body, stub)
        n = int(data.get("max_tokens", 16))
        if fault in ("reset", "hang_before_head", "status") or not data.get("stream"):
            await self._before_head(fault, stub, n, reader, writer)
            return
        writer.write(_STREAM_HEAD)
        if fault in ("hang", "drip"):
            await self._gated(stub)
            await (self._hold(reader) if fault == "hang" else self._drip(stub, n, reader, writer))
            return
        after = int(stub.get("after", 2)) if fault else n
        await self._events(writer, min(after, n), float(stub.get("interval_ms", 0)) / 1000)
        if fault is None:
            writer.write(frame_chunk(_DONE) + b"0\r\n\r\n")
            self.served += 1
            return
        await self._gated(stub)
        await self._mid_stream(fault, reader, writer)

    async def _before_head(self, fault: str | None, stub: dict[str, Any], n: int, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        if fault:
            await self._gated(stub)
        if fault == "reset":
            _reset(writer)
        elif fault == "hang_before_head":
            await self._hold(reader)
        elif fault == "status":
            writer.write(_whole(int(stub.get("status", 503)), json.dumps(_BUSY).encode()))
        elif fault == "invalid_json":
            writer.write(_whole(200, b'{"id": "cmpl-fault", "choices": [{"text": "'))
        else:
            text = {"id": "cmpl-fault", "object": "text_completion",
                    "choices": [{"index": 0, "text": " tok" * n, "finish_reason": "length"}]}
            writer.write(_whole(200, json.dumps(text).encode()))
            self.served += 1

    async def _mid_stream(self, fault: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if fault == "close":
            await writer.drain()
            writer.close()  # a FIN between two events
        elif fault == "close_mid_event":
            framed = frame_chunk(_EVENT)
            writer.write(framed[:len(framed) // 2])
            await writer.drain()
            writer.close()
        elif fault == "bad_framing":
            writer.write(b"zz\r\n" + _EVENT + b"\r\n")
            await self._hold(reader)
        elif fault == "bad_framing_mid_event":
            framed = frame_chunk(_EVENT)
            writer.write(framed[:len(framed) // 2])
            await writer.drain()
            await asyncio.sleep(_SPLIT_S)
            writer.write(framed[len(framed) // 2:-2] + b"XX")  # the rest of its data, not followed by CRLF
            await self._hold(reader)
        elif fault == "malformed_sse":
            writer.write(frame_chunk(b"data: {not json\n\n") + frame_chunk(b"garbage without a field\n\n")
                         + frame_chunk(_DONE) + b"0\r\n\r\n")

    async def _events(self, writer: asyncio.StreamWriter, count: int, interval_s: float) -> None:
        for _ in range(count):
            writer.write(frame_chunk(_EVENT))
            await writer.drain()
            if interval_s:
                await asyncio.sleep(interval_s)

    async def _gated(self, stub: dict[str, Any]) -> None:
        if stub.get("gate"):
            await self.gate.wait()

    async def _hold(self, reader: asyncio.StreamReader) -> None:
        """Send nothing until the proxy closes the connection (or a crash resets it)."""
        await reader.read()
        self.disconnects += 1

    async def _drip(self, stub: dict[str, Any], n: int, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        """The stream's bytes one at a time, until they are all out or the proxy closes the connection."""
        interval_s = float(stub.get("drip_ms", 1000)) / 1000
        stream = b"".join(frame_chunk(_EVENT) for _ in range(n)) + frame_chunk(_DONE) + b"0\r\n\r\n"
        for i in range(len(stream)):
            writer.write(stream[i:i + 1])
            try:
                gone = await asyncio.wait_for(reader.read(1), interval_s) == b""
            except TimeoutError:
                gone = False
            if gone:
                self.disconnects += 1
                return


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    """The request's body (the proxy always sends a Content-Length), None if the client left first."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return await reader.readexactly(length)
