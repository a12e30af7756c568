"""The circuit breaker in front of the live proxy's attempt handling (beyond the paper).

The same `BreakerCore` as the simulator's decides; this only carries its decisions over HTTP: an
attempt it refuses gets the configured status and headers at once, one it lets through is handled
as without a breaker, and how that ended is reported back: the response's status (200 a success;
429, 503 or 529 a busy answer), or the client leaving before it (its deadline: a timeout). A 4xx of a
malformed request (any but 408, 429) says nothing of the upstream and is not counted; another status (a
502 of a broken upstream) is an error. A refusal sent as an
SSE error event inside a streamed 200 reads as a success here: the gate sees the HTTP status only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from itertools import count

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

from retrybench.conditions.config import BreakerPolicy
from retrybench.control.breaker import STATE_CODES, BreakerCore
from retrybench.records.runlog import COMPLETED, ERROR, REFUSED_BY_STATUS, TIMED_OUT

__all__ = ["BreakerGate", "outcome_of_status"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def outcome_of_status(status: int) -> str | None:
    """An HTTP status as the attempt outcome the breaker reads; None for a client's own error (a 4xx other
    than a timeout's 408 and a busy 429), which tells nothing of the engine."""
    if status == 200:
        return COMPLETED
    if status == 408:
        return TIMED_OUT
    if 400 <= status < 500 and status not in REFUSED_BY_STATUS:
        return None
    return REFUSED_BY_STATUS.get(status, ERROR)


class BreakerGate:
    """Wraps the completion handler: the breaker decides first, then hears how each attempt it let
    through ended. Attempts are named by the gate's own counter (the breaker only tells them apart)."""

    def __init__(self, policy: BreakerPolicy, inner: Handler, now: Callable[[], float],
                 refusal: Callable[..., web.Response]) -> None:
        self.core = BreakerCore(policy)
        self._inner = inner
        self._now = now
        self._refusal = refusal
        self._ids = count()

    def register(self, registry: CollectorRegistry) -> None:
        """Its state as a gauge of the proxy's /metrics (a live run samples it each second)."""
        Gauge("retrybench_proxy_breaker_state", "The circuit breaker's state: 0 closed, 1 open, 2 half-open",
              registry=registry).set_function(self.state_code)

    def state_code(self) -> int:
        """The breaker's state now, as the run log samples it (0 closed, 1 open, 2 half-open)."""
        return STATE_CODES[self.core.state(self._now())]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        token = (-1, next(self._ids))
        refusal = self.core.on_attempt(token, self._now())
        if refusal is not None:
            await request.read()  # read the body so that the connection can be reused
            return self._refusal(refusal)
        outcome: str | None = ERROR
        try:
            response = await self._inner(request)
            outcome = outcome_of_status(response.status)
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            outcome = TIMED_OUT  # the client left before its answer: its deadline passed
            raise
        finally:
            if outcome is None:
                self.core.on_not_judged(token, self._now())
            else:
                self.core.on_result(token, outcome, self._now())
