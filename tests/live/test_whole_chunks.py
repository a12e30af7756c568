"""The per-chunk path, compiled and in Python: the same reads give the same bytes to the same places.

The compiled class (retrybench/proxy/_whole_chunks.c) replaces the Python one wherever the package
was built with a C compiler, so the two must not differ in anything a client or the relay can see:
what is written to the client, what reaches the sink, when the exchange ends, and the fields the
rest of the proxy reads (`last_body`, `reads`).
"""

from __future__ import annotations

import itertools
import shutil
import sysconfig
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrybench.proxy.http1 import frame_chunk
from retrybench.proxy.upstream import UpstreamPool, _Connection, _Exchange, _PythonConnection
from retrybench.proxy.whole_chunks import compiled_relay

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FIRST = frame_chunk(b"data: first\n\n")
LAST = b"0\r\n\r\n"

needs_compiled = pytest.mark.skipif(compiled_relay() is None, reason="the compiled per-chunk path is not built here")


class Client:
    """A client's transport, that can be closing or have bytes queued."""

    def __init__(self, closing: bool = False, queued: int = 0) -> None:
        self.written: list[bytes] = []
        self.closing, self.queued = closing, queued

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.queued

    def close(self) -> None:
        self.closing = True


class Upstream:
    """The upstream connection's own transport."""

    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None: ...

    def close(self) -> None:
        self.closed = True


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_head(self, head: Any) -> None:
        self.events.append(("head", head.status))

    def on_first_payload(self, payload: bytes) -> None:
        self.events.append(("first", payload))

    def on_body(self, data: bytes) -> None:
        self.events.append(("body", bytes(data)))

    def on_end(self, error: str | None) -> None:
        self.events.append(("end", error))

    def on_connection(self, connection: Any) -> None: ...


def run(kind: type[_Exchange], reads: list[bytes], client: Client | None) -> dict[str, Any]:
    """Feed a streamed response's `reads` (after its head and first chunk) to a connection of `kind`."""
    connection = kind(UpstreamPool("http://127.0.0.1:1"))
    upstream = Upstream()
    connection.transport = upstream  # type: ignore[assignment]
    sink = Sink()
    connection.start(b"POST / HTTP/1.1\r\n\r\n", sink)
    connection.data_received(HEAD + FIRST)
    connection.direct = client  # type: ignore[assignment]
    seen = []
    for read in reads:
        connection.data_received(read)
        seen.append((bytes(connection.last_body), connection.reads))
    return {"sink": sink.events, "client": client and (client.written, client.closing), "seen": seen,
            "upstream_closed": upstream.closed}


def test_the_compiled_path_is_built_where_a_compiler_is() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if compiled_relay() is None and shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: the per-chunk path runs in Python")
    assert compiled_relay() is not None, (
        f"{compiler} is here but retrybench/proxy/_whole_chunks.c was not built or does not load: reinstall "
        "(pip install -e .) and read its warning")


# Reads that are one whole chunk, and reads that only nearly are: each must take the same path in both.
EDGES = [
    frame_chunk(b"x"),  # the shortest whole chunk
    frame_chunk(b"y" * 15), frame_chunk(b"y" * 16), frame_chunk(b"z" * 4095), frame_chunk(b"z" * 4096),
    frame_chunk(b"w" * 65530),  # the longest whole read told by its size (64 KiB)
    frame_chunk(b"w" * 65531),  # one byte longer: scanned
    frame_chunk(b"ab\r\ncd"),  # CRLF inside the data
    b"A\r\n" + b"q" * 10 + b"\r\n",  # upper-case hex: valid, but not how the upstream writes it
    b"0a\r\n" + b"q" * 10 + b"\r\n",  # a leading zero
    b"5;x=1\r\nhello\r\n",  # a chunk extension
    b"5\r\nhello\r\n5\r\nworld\r\n",  # two whole chunks in one read
    b"5\r\nhel",  # a chunk cut short
    b"5\r\nhello\r\r",  # a broken end
    b"5\r\nhelloXY",  # a broken end
    b"g\r\nhello\r\n",  # not hex
    LAST,
    frame_chunk(b"end") + LAST,
]


@needs_compiled
@pytest.mark.parametrize("read", EDGES, ids=range(len(EDGES)))
@pytest.mark.parametrize("client", ["direct", "closing", "full", "relay"])
def test_one_read_takes_the_same_path_in_both(read: bytes, client: str) -> None:
    def make() -> Client | None:
        return {"direct": Client(), "closing": Client(closing=True), "full": Client(queued=5 << 20),
                "relay": None}[client]

    reads = [read, frame_chunk(b"after"), LAST]
    assert run(_Connection, reads, make()) == run(_PythonConnection, reads, make())


chunks = st.lists(st.one_of(st.binary(min_size=1, max_size=40),
                            st.sampled_from([15, 16, 255, 256, 4096]).map(lambda n: b"t" * n)),
                  min_size=1, max_size=12)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(payloads=chunks, data=st.data())
def test_any_split_of_a_stream_gives_the_same_bytes_in_both(payloads: list[bytes], data: st.DataObject) -> None:
    """A stream cut into reads anywhere (most cuts on chunk boundaries, as the upstream writes them):
    both paths give the same result, and a lone client gets exactly the upstream's bytes."""
    stream = b"".join(map(frame_chunk, payloads)) + LAST
    bounds, at = [], 0
    for payload in payloads:
        at += len(frame_chunk(payload))
        bounds.append(at)
    cuts = [b for b in bounds if data.draw(st.booleans())]
    cuts += data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=4))
    edges = [0, *sorted(set(cuts)), len(stream)]
    reads = [stream[a:b] for a, b in itertools.pairwise(edges) if b > a]
    compiled, python = run(_Connection, reads, Client()), run(_PythonConnection, reads, Client())
    assert compiled == python
    assert b"".join(compiled["client"][0]) == stream
    assert compiled["sink"][-1] == ("end", None)


@pytest.mark.parametrize("kind", [pytest.param(_Connection, id="compiled-where-built"),
                                  pytest.param(_PythonConnection, id="python")])
def test_only_reads_that_are_not_one_whole_chunk_take_the_general_path(kind: type[_Exchange]) -> None:
    class Counted(kind):  # type: ignore[valid-type,misc]
        general = 0

        def _data_received(self, data: bytes) -> None:
            type(self).general += 1
            super()._data_received(data)

    whole = [frame_chunk(b"data: %d\n\n" % i) for i in range(5)]
    cut = frame_chunk(b"data: cut\n\n")
    run(Counted, whole, Client())
    assert Counted.general == 1, "the head and first chunk only: whole chunks must not be scanned"
    run(Counted, [cut[:4], cut[4:], LAST], Client())
    assert Counted.general == 1 + 1 + 3
