"""Small asyncio helpers shared by the live servers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

__all__ = ["bound_port", "run_event_loop"]


def bound_port(site: web.TCPSite) -> int:
    """The port a started site listens on (the one the OS chose when asked for port 0)."""
    sockets = getattr(site._server, "sockets", None)  # asyncio's and uvloop's servers both have it
    if not sockets:
        raise RuntimeError("the site is not listening")
    port: int = sockets[0].getsockname()[1]
    return port


def run_event_loop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run on uvloop where it is installed (a faster event loop), else on asyncio's own."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        asyncio.run(main())
        return
    uvloop.run(main())
