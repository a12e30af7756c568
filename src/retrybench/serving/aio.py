"""Small asyncio helpers shared by the live servers."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["metric_sums", "run_event_loop", "until_signalled"]

T = TypeVar("T")
_SAMPLE = re.compile(rb"^([a-z_:]+)(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)


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
