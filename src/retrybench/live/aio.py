"""Small asyncio helpers shared by the live servers."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

__all__ = ["bound_port", "metric_sums", "run_event_loop", "until_signalled"]

T = TypeVar("T")
_SAMPLE = re.compile(rb"^([a-z_:]+)(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)


def bound_port(site: web.TCPSite) -> int:
    """The port a started site listens on (the one the OS chose when asked for port 0)."""
    sockets = getattr(site._server, "sockets", None)  # asyncio's and uvloop's servers both have it
    if not sockets:
        raise RuntimeError("the site is not listening")
    port: int = sockets[0].getsockname()[1]
    return port


def run_event_loop(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run `main()` on uvloop where it is installed (a faster event loop), else on asyncio's own."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        return asyncio.run(main())
    return uvloop.run(main())


async def until_signalled() -> None:
    """Return on SIGINT or SIGTERM, so a server can close its streams and flush its logs."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def metric_sums(text: bytes) -> dict[str, float]:
    """Each metric of a Prometheus text page, summed over its label sets (vLLM labels gauges per engine)."""
    sums: dict[str, float] = {}
    for name, value in _SAMPLE.findall(text):
        key = name.decode()
        sums[key] = sums.get(key, 0.0) + float(value)
    return sums
