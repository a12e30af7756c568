"""A call's deadline as its client states it in request headers, and the time left to pass upstream.

A client that times out leaves the server no wiser unless it says when it will give up. Three headers
say so: `Request-Timeout-Ms` (milliseconds; proposed for the openai SDK), `x-stainless-timeout`
(seconds; the Stainless-generated SDKs, e.g. anthropic 2.17.0's `_build_headers`) and
`x-stainless-read-timeout` (seconds; openai 3.63.0's `_build_headers` sends it on every request whose
timeout is set). A read timeout bounds a whole attempt only when the response comes in one piece, so
it is read for non-streamed requests only. Pure: the proxy passes the headers and gets seconds back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["DEADLINE_HEADERS", "REQUEST_TIMEOUT_MS", "DeadlineHeaderError", "forward_timeout_ms",
           "timeout_from_headers"]

REQUEST_TIMEOUT_MS = "Request-Timeout-Ms"
STAINLESS_TIMEOUT = "x-stainless-timeout"
STAINLESS_READ_TIMEOUT = "x-stainless-read-timeout"
# (header, seconds per unit, read for streamed requests too), in order of precedence.
DEADLINE_HEADERS: tuple[tuple[str, float, bool], ...] = (
    (REQUEST_TIMEOUT_MS, 1e-3, True), (STAINLESS_TIMEOUT, 1.0, True), (STAINLESS_READ_TIMEOUT, 1.0, False))
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: longer is not a deadline a proxy can act on


class DeadlineHeaderError(ValueError):
    """A deadline header whose value is not a positive finite number (the proxy answers 400)."""

    def __init__(self, header: str, value: str, why: str) -> None:
        super().__init__(f"header {header} must be {why}; got {value!r}")
        self.header = header


def timeout_from_headers(headers: Mapping[str, str], stream: bool) -> float | None:
    """The attempt's timeout in seconds from the first deadline header present, or None.

    `headers` must look names up case-insensitively (aiohttp's and httpx's do). A value that is not a
    number in (0, a week] is refused with the header named, never read as "no deadline"."""
    for name, unit_s, on_streams in DEADLINE_HEADERS:
        raw = headers.get(name)
        if raw is None or (stream and not on_streams):
            continue
        unit = "milliseconds" if unit_s < 1 else "seconds"
        try:
            value = float(raw.strip())
        except ValueError:
            raise DeadlineHeaderError(name, raw, f"a number of {unit}") from None
        seconds = value * unit_s
        if not math.isfinite(value) or not 0 < seconds <= MAX_TIMEOUT_S:
            raise DeadlineHeaderError(name, raw, f"a positive number of {unit}, at most a week")
        return seconds
    return None


def forward_timeout_ms(deadline_s: float, now: float, time_scale: float = 1.0) -> int:
    """Request-Timeout-Ms for the upstream: the time left to `deadline_s` (policy seconds), in wall
    milliseconds at `time_scale` wall seconds per policy second; at least 1 (0 would read as none)."""
    return max(1, math.floor((deadline_s - now) * time_scale * 1000.0))
