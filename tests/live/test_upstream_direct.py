"""The short path of a streamed chunk: while one client alone wants an execution's bytes, the upstream
connection writes them to that client's socket itself; everything else goes through the relay. Every
test runs on both per-chunk paths: the compiled one (where it was built) and the one in Python."""

from __future__ import annotations

from typing import Any

import pytest

from retrybench.proxy.http1 import ResponseHead, frame_chunk
from retrybench.proxy.relay import ClientSubscriber, Relay
from retrybench.proxy.upstream import MAX_CLIENT_BUFFER, UpstreamPool, _Connection, _Exchange, _PythonConnection

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.buffered = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def close(self) -> None:
        self.closing = True


class RecordingSink:
    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.ended: list[str | None] = []

    def on_head(self, head: ResponseHead) -> None: ...

    def on_first_payload(self, payload: bytes) -> None: ...

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_end(self, error: str | None) -> None:
        self.ended.append(error)

    def on_connection(self, connection: Any) -> None: ...


CONNECTIONS = [pytest.param(_Connection, id="compiled-where-built"), pytest.param(_PythonConnection, id="python")]


@pytest.fixture(params=CONNECTIONS)
def kind(request: pytest.FixtureRequest) -> type[_Exchange]:
    return request.param  # type: ignore[no-any-return]


def streaming_connection(kind: type[_Exchange] = _Connection) -> tuple[_Exchange, RecordingSink]:
    connection = kind(UpstreamPool("http://127.0.0.1:1"))
    connection.transport = FakeTransport()  # type: ignore[assignment]
    sink = RecordingSink()
    connection.start(b"POST / HTTP/1.1\r\n\r\n", sink)
    connection.data_received(HEAD + frame_chunk(b"data: first\n\n"))
    return connection, sink


def test_a_lone_clients_chunks_go_straight_to_its_socket_and_the_end_still_reaches_the_relay(
        kind: type[_Exchange]) -> None:
    connection, sink = streaming_connection(kind)
    client = FakeTransport()
    connection.direct = client  # type: ignore[assignment]
    chunks = [frame_chunk(b"data: %d\n\n" % i) for i in range(3)]
    for chunk in chunks:
        connection.data_received(chunk)
    assert client.written == chunks and sink.body == [frame_chunk(b"data: first\n\n")]
    connection.data_received(b"0\r\n\r\n")
    assert client.written[-1] == b"0\r\n\r\n" and sink.ended == [None] and connection.direct is None


def test_a_client_that_stops_reading_is_dropped_and_a_closing_one_falls_back_to_the_relay(
        kind: type[_Exchange]) -> None:
    connection, sink = streaming_connection(kind)
    client = FakeTransport()
    connection.direct = client  # type: ignore[assignment]
    client.buffered = MAX_CLIENT_BUFFER + 1
    connection.data_received(frame_chunk(b"data: 1\n\n"))
    assert client.closing, "a client with more than the limit queued must be dropped"
    connection.data_received(frame_chunk(b"data: 2\n\n"))
    assert len(client.written) == 1 and sink.body[-1] == frame_chunk(b"data: 2\n\n")


class FakeConnection:
    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.direct: Any = None


def test_the_relay_goes_direct_only_while_one_client_alone_wants_the_bytes() -> None:
    relay = Relay(None, 1, "/v1/completions", b"{}", {}, stream=True, keep_replay=False)  # type: ignore[arg-type]
    connection = FakeConnection(relay)
    relay.on_connection(connection)
    relay.on_head(ResponseHead(200, {"transfer-encoding": "chunked"}))
    sub = ClientSubscriber((0, 0))
    sub.transport = FakeTransport()  # type: ignore[assignment]
    relay.live.append(sub)
    relay.rewire()
    assert connection.direct is sub.transport
    relay.pending += 1  # another subscriber catching up needs the bytes kept
    relay.rewire()
    assert connection.direct is None
    relay.pending -= 1
    relay.rewire()
    connection.sink = object()  # the exchange is over and the connection serves another
    relay.live.clear()
    relay.rewire()
    assert connection.direct is sub.transport, "a finished relay must not touch another exchange's connection"
    kept = Relay(None, 2, "/v1/completions", b"{}", {}, stream=True, keep_replay=True)  # type: ignore[arg-type]
    other = FakeConnection(kept)
    kept.on_connection(other)
    kept.on_head(ResponseHead(200, {"transfer-encoding": "chunked"}))
    kept.live.append(sub)
    kept.rewire()
    assert other.direct is None, "bytes kept for a late retry must go through the relay"


def test_a_read_that_looks_like_a_whole_chunk_inside_a_chunk_is_scanned(kind: type[_Exchange]) -> None:
    """The per-chunk path skips the scan for a read of exactly one whole chunk only between chunks: here
    the end of a chunk's data reads as a chunk of its own, and the last chunk after it still ends the body."""
    connection, sink = streaming_connection(kind)
    framed = frame_chunk(b"ab" + b"3\r\nabc")
    assert framed[5:] == frame_chunk(b"abc")
    for read in (framed[:5], framed[5:], b"0\r\n\r\n"):
        connection.data_received(read)
    assert sink.ended == [None]
    assert b"".join(sink.body).endswith(framed + b"0\r\n\r\n")
