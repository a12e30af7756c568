"""What proxy/aiohttp_internals.py relies on in aiohttp, pinned on the wire, and the aiohttp range it was read from.

The proxy writes an upstream's chunk-framed bytes straight to the client's socket, so aiohttp must send
a chunked response's head (before any body byte, else a stream's head would wait for its first token)
and then add nothing to the body: no framing and no last chunk of its own. A raw socket reads exactly
what crossed the wire.
"""

from __future__ import annotations

import asyncio
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from aiohttp import web
from fixtures.waiting import within
from packaging.requirements import Requirement

from retrybench.proxy.aiohttp_internals import close_idle_connections, prepare_raw_chunked, send_head
from retrybench.proxy.http1 import frame_chunk, parse_response_head
from retrybench.serving.aio import run_event_loop
from retrybench.serving.app import new_app, start_app

pytestmark = pytest.mark.live

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
BODY = frame_chunk(b"data: one\n\n") + frame_chunk(b"data: two\n\n") + b"0\r\n\r\n"  # as the upstream framed it


def declared_aiohttp() -> Requirement:
    """The aiohttp requirement of pyproject.toml's `live` extra."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["live"]
    (requirement,) = [Requirement(r) for r in extras if Requirement(r).name == "aiohttp"]
    return requirement


def test_the_installed_aiohttp_is_in_the_declared_range() -> None:
    requirement = declared_aiohttp()
    installed = version("aiohttp")
    assert requirement.specifier.contains(installed, prereleases=True), (
        f"aiohttp {installed} is installed, pyproject.toml declares {requirement}: check this module's tests "
        "against it before changing the range")


async def exchange(replay: bytes) -> tuple[bytes, bytes]:
    """(head, body) on the wire for a relayed stream whose first `replay` bytes go with the head and
    the rest (BODY after them) is written to the transport by the caller, as the proxy does."""
    head_read = asyncio.Event()

    async def relay(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        writer = await prepare_raw_chunked(response, request)
        await send_head(writer, replay)
        if not replay:
            await head_read.wait()  # the head must reach the client before any body byte is written
        assert request.transport is not None
        request.transport.write(BODY[len(replay):])
        await response.write_eof()
        return response

    runner, port = await start_app(new_app([web.get("/stream", relay)], client_max_size=1 << 20), "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /stream HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        head = await within(reader.readuntil(b"\r\n\r\n"), "the response head")
        head_read.set()
        body = await within(reader.read(), "the response body and the connection's close")
        writer.close()
        return head, body
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("replay", [b"", BODY[:20]], ids=["head-alone", "head-with-replay"])
def test_a_relayed_stream_is_chunked_and_its_body_is_the_callers_bytes_unchanged(replay: bytes) -> None:
    head, body = run_event_loop(lambda: exchange(replay))
    parsed = parse_response_head(head[:-4])
    assert parsed.status == 200 and parsed.chunked and parsed.content_length is None, head
    assert body == BODY  # nothing framed again, no last chunk added by aiohttp


async def idle_and_busy_connections() -> tuple[int, bytes, bytes]:
    """Two kept-alive connections, one between requests and one whose request is being served:
    (how many close_idle_connections closed, what the idle one reads next, the busy one's response)."""
    release, serving = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        serving.set()
        await release.wait()
        return web.Response(text="done")

    runner, port = await start_app(new_app([web.get("/slow", slow)], client_max_size=1024), "127.0.0.1", 0)
    try:
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        idle_writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await idle_reader.readuntil(b"\r\n\r\n")  # answered: now idle, kept alive
        busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", port)
        busy_writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert runner.server is not None
        await serving.wait()
        closed = close_idle_connections(runner.server)
        idle_next = await idle_reader.read()  # b"" once closed
        release.set()
        busy = await busy_reader.readuntil(b"done")
        idle_writer.close()
        busy_writer.close()
        return closed, idle_next, busy
    finally:
        await runner.cleanup()


def test_close_idle_connections_closes_only_the_connections_between_requests() -> None:
    closed, idle_next, busy = run_event_loop(lambda: within(idle_and_busy_connections(), "the two connections"))
    assert closed == 1 and idle_next == b""
    assert busy.startswith(b"HTTP/1.1 200") and busy.endswith(b"done")
