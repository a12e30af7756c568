"""The proxy's upstream side: HTTP/1.1 exchanges on pooled keep-alive connections, as callbacks.

A streamed chunk costs one read and one callback: the bytes go to the relay's `on_body` as they
arrive, still chunk-framed, so the proxy can forward them to its clients unchanged. While a single
client alone wants a stream's bytes, the relay hands its transport to the connection (`direct`), and
a chunk costs one read, one framing check and one write, without the relay's callback. Closing an
exchange's connection is how a cancellation reaches the engine (vLLM aborts on a closed stream).

Two timeouts end an exchange with an error its sink can tell from the others (`TimedOut`): the
connect timeout bounds opening a connection; the idle timeout bounds how long an exchange may go
without progress (a whole response head, a whole chunk, any bytes of a length-delimited body). The
idle check costs nothing per chunk: one sweep over the busy connections every quarter of the
timeout compares each one's count of reads with what the previous sweep saw, so a stall is noticed
between one and one and a half timeouts after it began. A partial chunk is no progress: an engine
that drips bytes is as stuck as a silent one.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Protocol, cast
from urllib.parse import urlsplit

from retrybench.proxy.http1 import ChunkedScanner, FramingError, ResponseHead, parse_response_head
from retrybench.proxy.whole_chunks import PythonWholeChunkRelay, WholeChunkRelay, send_to_client

if TYPE_CHECKING:
    _RelayBase = PythonWholeChunkRelay
else:
    _RelayBase = WholeChunkRelay

__all__ = ["MAX_CLIENT_BUFFER", "Cut", "Sink", "TimedOut", "UpstreamPool"]

MAX_HEAD_BYTES = 64 << 10
MAX_CLIENT_BUFFER = 4 << 20  # bytes queued for one client before it counts as gone
IDLE_REUSE_S = 2.0  # reuse an idle connection only this long (uvicorn closes idle ones after 5 s)
MAX_FILLER = 1 << 20  # the most bytes sent to end a chunk the upstream broke off (else the client is reset)


class TimedOut(str):
    """The error an exchange ends with when a timeout ended it (a gateway timeout, not a failure)."""


class Cut(str):
    """The error an exchange ends with when the proxy ended it itself: its drain ran out of time."""


class Sink(Protocol):
    """What receives one exchange's response."""

    def on_head(self, head: ResponseHead) -> None: ...

    def on_first_payload(self, payload: bytes) -> None: ...

    def on_body(self, data: bytes) -> None: ...

    def on_end(self, error: str | None) -> None: ...

    def on_connection(self, connection: _Exchange) -> None: ...


class _Exchange(asyncio.Protocol):
    """An upstream connection's exchanges, but for the per-chunk path (`_Connection` adds it)."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        # Set by the sink while one client alone wants the body: it is written there straight, and
        # the client is dropped once more than MAX_CLIENT_BUFFER bytes wait for it.
        self.direct: asyncio.WriteTransport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        self.progress = 0  # heads and length-delimited body reads seen (chunked bodies: see quiet_for)
        self.reads = 0  # reads of a streamed chunked body
        self.client_buffer_limit = MAX_CLIENT_BUFFER
        self._seen = (0, 0)
        self._quiet_since = 0.0
        self._request = b""
        self._reset()

    def _reset(self) -> None:
        self.last_body = b""  # the streamed body's latest read: does what the client got end the stream?
        # What ends the chunk the forwarded body stopped in, once the exchange failed: b"" at a chunk
        # boundary, None where that is not known.
        self.tail_fix: bytes | None = b""
        self._head: ResponseHead | None = None
        self._buffer = b""
        self._scanner: ChunkedScanner | None = None
        self._between = True  # the scanner's `between`, as of its last feed (see _feed)
        self._remaining: int | None = None
        self._want_payload = True

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def _data_received(self, data: bytes) -> None:
        """Every read but a whole chunk between chunks (that one `data_received` forwards itself)."""
        sink = self.sink
        if sink is None:
            self.close()  # bytes nobody asked for: the connection cannot be trusted
            return
        try:
            scanner = self._scanner
            if scanner is not None and not self._want_payload:  # a streamed body's chunks, not whole
                end = self._feed(scanner, data)
                body = data if end == len(data) else data[:end]
                self.last_body = body
                self.reads += 1
                if not send_to_client(self.direct, body, self.client_buffer_limit):
                    sink.on_body(body)
                if scanner.done:
                    self._end(None)
                return
            if self._head is None:
                data = self._read_head(data, sink)
                if not data or self.sink is None:  # the head is incomplete, or the body was empty
                    return
            self._read_body(data, sink)
        except FramingError as error:
            self._end(f"bad upstream framing: {error}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.discard(self)
        if self.sink is None:
            return
        if self._head is None and self.reused and not self._buffer:
            self.pool.resend(self._request, self.sink)  # an idle connection the server had closed
            self.sink = None
            return
        if self._head is not None and self._scanner is None and self._remaining is None:
            self._end(None)  # a body delimited by the connection's close
        else:
            self._end(f"the upstream closed the connection: {exc or 'end of stream'}")

    # -- one exchange ----------------------------------------------------------------------------

    def start(self, request: bytes, sink: Sink) -> None:
        assert self.transport is not None
        self._reset()
        self._request = request
        self.sink, self.direct = sink, None
        self.watch(time.monotonic())
        self.transport.write(request)

    # -- the idle timeout ------------------------------------------------------------------------

    def watch(self, now: float) -> None:
        """Start the exchange's idle clock at `now`."""
        self._seen = (self.progress, self.reads)
        self._quiet_since = now

    def quiet_for(self, now: float) -> float:
        """Seconds since the exchange last made progress, as the sweeps saw it. A streamed body made
        progress when it was read since the last sweep and what it read ends on a chunk boundary."""
        progress, reads = self.progress, self.reads
        seen_progress, seen_reads = self._seen
        scanner = self._scanner
        if progress != seen_progress or (reads != seen_reads and (scanner is None or scanner.at_boundary())):
            self._seen = (progress, reads)
            self._quiet_since = now
        return now - self._quiet_since

    def time_out(self, idle_s: float) -> None:
        """End the exchange: nothing came for `idle_s` seconds (the engine sees the client leave)."""
        self._end(TimedOut(f"no progress from the upstream for {idle_s:g} s"))

    def abort(self, error: str) -> None:
        """End the exchange at once with `error` (its sink ends its clients' streams properly), and
        close the connection."""
        self._end(error)

    def close(self) -> None:
        """End the exchange by closing the connection (the engine sees the client leave)."""
        self.sink = self.direct = None
        if self.transport is not None:
            self.transport.close()

    def _read_head(self, data: bytes, sink: Sink) -> bytes:
        buffer = self._buffer + data
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise FramingError("response head too large")
            self._buffer = buffer
            return b""
        head = parse_response_head(buffer[:end])
        self._buffer = b""
        self._head = head
        self.progress += 1
        if head.chunked:
            self._scanner, self._between = ChunkedScanner(), True
        else:
            self._remaining = head.content_length
        sink.on_head(head)
        rest = buffer[end + 4:]
        if self._remaining == 0:
            self._end(None)
        return rest

    def _read_body(self, data: bytes, sink: Sink) -> None:
        scanner = self._scanner
        if scanner is not None:  # until the first payload (then data_received's own path)
            payload: list[bytes] = []
            used = self._feed(scanner, data, payload)
            first = b"".join(payload)
            if first:
                self._want_payload = False
                sink.on_first_payload(first)
            body = data if used == len(data) else data[:used]
            self.last_body = body
            self.reads += 1
            sink.on_body(body)
            if scanner.done:
                self._end(None)
            return
        self.progress += 1
        if self._remaining is not None:
            data = data[:self._remaining]
            self._remaining -= len(data)
        if self._want_payload and data:
            self._want_payload = False
            sink.on_first_payload(data)
        sink.on_body(data)
        if self._remaining == 0:
            self._end(None)

    def _feed(self, scanner: ChunkedScanner, data: bytes, payload: list[bytes] | None = None) -> int:
        """Scan `data`, and keep whether the body read so far ends between chunks where the per-chunk
        path reads it without an attribute lookup (a read of one whole chunk there leaves it True)."""
        used = scanner.feed(data, payload)
        self._between = scanner.between
        return used

    def _end(self, error: str | None) -> None:
        sink, self.sink, self.direct = self.sink, None, None
        head = self._head
        if error is None and head is not None and head.keep_alive and not self.closed:
            self.pool.release(self)
        elif not self.closed:
            self.close()
        if error is not None and self._scanner is not None:  # a read that broke the framing was not forwarded
            self.tail_fix = self._scanner.closing_bytes(MAX_FILLER)
        if sink is not None:
            sink.on_end(error)


class _Connection(_RelayBase, _Exchange):
    """An upstream connection: its exchanges, and the per-chunk path (compiled where it was built)."""


class _PythonConnection(PythonWholeChunkRelay, _Exchange):
    """The same with the per-chunk path in Python, as where the compiled one is not built."""


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to one upstream, opened as needed, no upper bound."""

    def __init__(self, base_url: str, *, connect_timeout_s: float | None = None,
                 idle_timeout_s: float | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the upstream must be an http:// URL, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self._idle: list[_Exchange] = []
        self._busy: set[_Exchange] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.sweeper: asyncio.TimerHandle | None = None  # the idle check, armed while an exchange is busy

    @property
    def busy(self) -> int:
        """Connections with an exchange in progress."""
        return len(self._busy)

    def request_bytes(self, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                 f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    def send_now(self, request: bytes, sink: Sink) -> bool:
        """Send `request` on an idle connection if there is one (no await: the fast path)."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_REUSE_S:
                connection.reused = True
                self._start(connection, request, sink)
                return True
            connection.close()
        return False

    async def open(self, request: bytes, sink: Sink) -> None:
        """Send `request` on an idle connection or a new one; the response goes to `sink`."""
        if self.send_now(request, sink):
            return
        loop = asyncio.get_running_loop()
        # Not asyncio.wait_for: on Python 3.11 a cancellation that arrives as the connection completes is
        # lost there (the caller's execution then streams on for nobody); a timeout scope keeps it.
        async with asyncio.timeout(self.connect_timeout_s):
            _, connection = await loop.create_connection(lambda: _Connection(self), self.host, self.port)
        connection.reused = False
        self._start(connection, request, sink)

    def _start(self, connection: _Exchange, request: bytes, sink: Sink) -> None:
        self._busy.add(connection)
        sink.on_connection(connection)
        connection.start(request, sink)
        if self.sweeper is None and self.idle_timeout_s is not None:
            self._arm_sweeper()

    def _arm_sweeper(self) -> None:
        assert self.idle_timeout_s is not None
        self.sweeper = asyncio.get_running_loop().call_later(self.idle_timeout_s / 4, self._sweep)

    def _sweep(self) -> None:
        """End every exchange that made no progress for the idle timeout; re-arm while any is busy."""
        self.sweeper = None
        idle_s = self.idle_timeout_s
        assert idle_s is not None
        now = time.monotonic()
        for connection in [c for c in self._busy if c.sink is not None and c.quiet_for(now) >= idle_s]:
            connection.time_out(idle_s)
        if self._busy:
            self._arm_sweeper()

    def release(self, connection: _Exchange) -> None:
        self._busy.discard(connection)
        connection.idle_since = time.monotonic()
        self._idle.append(connection)
        self._unarm_when_idle()

    def discard(self, connection: _Exchange) -> None:
        self._busy.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)
        self._unarm_when_idle()

    def _unarm_when_idle(self) -> None:
        """No exchange left to watch: the idle check waits for the next one (no timer outlives them)."""
        if not self._busy and self.sweeper is not None:
            self.sweeper.cancel()
            self.sweeper = None

    def resend(self, request: bytes, sink: Sink) -> None:
        """Retry an exchange whose reused connection turned out closed, on a fresh connection."""

        async def again() -> None:
            try:
                for stale in self._idle:
                    stale.close()
                self._idle.clear()
                await self.open(request, sink)
            except TimeoutError:
                sink.on_end(TimedOut(f"no connection to the upstream within {self.connect_timeout_s:g} s"))
            except OSError as error:
                sink.on_end(f"upstream unreachable: {error}")

        task = asyncio.get_running_loop().create_task(again())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.cancel()
            self.sweeper = None
        for connection in [*self._idle, *self._busy]:
            connection.close()
        self._idle.clear()
        self._busy.clear()
        for task in self._tasks:
            task.cancel()
