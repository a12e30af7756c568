"""The only place retrybench reaches past aiohttp's public API: a chunked response whose body the
proxy frames itself.

The proxy forwards the upstream's chunk-framed bytes to each client's socket unchanged (one write
per upstream read, no re-framing), so aiohttp must send a chunked response's head and then frame
and end nothing of its body. aiohttp has no public switch for that; these functions use its
`StreamWriter` (aiohttp/http_writer.py, as of 3.14): the `chunked` flag, `write(..., drain=False)`
and `send_headers()` (from 3.12; skipped where absent). tests/live/test_aiohttp_internals.py pins
what they do on the wire and that the installed aiohttp is in the range pyproject.toml declares;
run it against a new aiohttp release before widening the range. `close_idle_connections` reads the
state aiohttp's own keep-alive timeout reads (a connection's `_waiter` and `_request_in_progress`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

__all__ = ["close_idle_connections", "prepare_raw_chunked", "send_head"]


async def prepare_raw_chunked(response: web.StreamResponse, request: web.BaseRequest) -> Any:
    """Prepare `response` as a chunked stream whose body the caller writes already chunk-framed
    (to `request.transport`, or with `send_head`); returns aiohttp's writer for `send_head`.
    From here on aiohttp frames nothing and `write_eof` adds no last chunk: the caller sends it."""
    response.enable_chunked_encoding()
    writer: Any = await response.prepare(request)
    writer.chunked = False
    return writer


async def send_head(writer: Any, body_start: bytes) -> None:
    """Send the response head now, followed by `body_start` (chunk-framed bytes) if there are any.
    Since 3.12 aiohttp's writer can buffer the head until the first body write (it coalesces them);
    a relay whose first bytes go straight to the transport would then send its head after its
    first token, or never."""
    if body_start:
        await writer.write(body_start, drain=False)
        return
    send_headers = getattr(writer, "send_headers", None)
    if send_headers is not None:  # a no-op once the head is out (prepare() sent it before 3.12)
        send_headers()


def close_idle_connections(server: web.Server) -> int:
    """Close every kept-alive connection that waits for its next request, as aiohttp's keep-alive
    timeout closes one; a connection serving a request is left alone (closing it after its response,
    whose head said keep-alive, would race the client's next request on it). Returns how many closed."""
    closed = 0
    for handler in list(server.connections):
        waiter = getattr(handler, "_waiter", None)
        if waiter is not None and not waiter.done() and not getattr(handler, "_request_in_progress", True):
            handler.force_close()
            closed += 1
    return closed
