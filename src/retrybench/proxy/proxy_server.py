"""The deployable overload-control proxy: `ProxyCore` driving real HTTP streams.

Each attempt is an HTTP request; its handler task is the attempt's *subscriber* (attempts.py). Each
execution is a `Relay` (relay.py): one upstream request, read by one task that forwards the upstream
bytes unchanged to the live subscribers and keeps them (as bytes) for replay while a retry may still
attach. The upstream side is the proxy's own HTTP/1.1 client on pooled keep-alive connections
(upstream.py), which hands each read to the relay still chunk-framed; only the engine's /metrics scrape
goes through aiohttp's client. Cancelling an execution closes its upstream connection, which is how
vLLM learns to abort (executions.py).

With several upstreams (engine replicas), each has its own pool and `control.router.Router` (the
simulator's code) picks one per execution, from the call key, the prompt as the simulator describes
it and the streams this proxy has open to each; with one, executions go to its pool directly.

With result retention on, a completed execution's relay (status, headers, the whole body or the
chunk-framed stream) outlives its exchange for `retain_s`: an attempt of the same key is answered
from it, streamed or not as the original was (the key covers the request body, so both asked the
same), and the core says when its bytes are freed.

An upstream fault (the connection closed, reset or timed out, its framing broken) fails the
execution: the core ends it, so no retry attaches to it and nothing of it is retained, and each of
its subscribers gets an OpenAI-style error it can act on: a 502 (504 for a timeout) before any
byte of the stream was sent, else an SSE error event and the stream's proper end.

On SIGTERM the proxy drains: `/ready` answers 503 at once (`/health` stays 200), an attempt it can answer
from what it holds (its call's execution, or a retained response) is still taken, any other gets a 503
with Retry-After, and it stops once no client waits for anything, or after `drain_timeout_s` (scaled),
ending what is left as it ends a stream whose upstream failed (an SSE error event, a 503 before the
head). A rolling restart so loses no call: every stream in flight completes, and the retries of those
calls still find their executions. SIGINT, or a second signal while draining, stops at once.

This module is the server's entry point and its top layer: its state, binding, the small routes, the
periodic housekeeping (log flush, the engines' waiting gauge), draining, shutdown, and serving until a
signal.
`ProxySettings` is re-exported here, as the one argument `ProxyServer` and `serve_forever` take.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict

import aiohttp
from aiohttp import web

from retrybench.control.proxy import ProxyCore
from retrybench.control.router import Router
from retrybench.proxy.aiohttp_internals import close_idle_connections
from retrybench.proxy.attempts import ROUTES, AttemptHandling, _refusal
from retrybench.proxy.breaker_gate import BreakerGate
from retrybench.proxy.eventlog import EventLog
from retrybench.proxy.proxy_metrics import ProxyMetrics
from retrybench.proxy.proxy_settings import ProxySettings
from retrybench.proxy.upstream import UpstreamPool
from retrybench.proxy.whole_chunks import RELAY_IMPLEMENTATION
from retrybench.records.decisionlog import DecisionLogHeader
from retrybench.serving.aio import metric_sums, run_event_loop
from retrybench.serving.app import new_app, start_app
from retrybench.serving.clock import ScaledClock
from retrybench.serving.openai_api import error_response

__all__ = ["ProxyServer", "ProxySettings", "serve_forever", "tune_gc_for_serving"]

DRAIN_POLL_S = 0.02  # how often a draining proxy looks whether a client still waits (wall seconds)


class ProxyServer(AttemptHandling):
    """The proxy: all its state is set up here (the layers it builds on declare what they use); `start`
    binds it, `stop` ends every stream and task."""

    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.core = ProxyCore(settings.policy)
        self.clock = ScaledClock(settings.time_scale)
        self.upstreams = settings.upstreams
        self.upstream = self.upstreams[0]
        several = len(self.upstreams) > 1
        self.router = Router(settings.route, self.upstreams) if several else None
        self.streams = [0] * len(self.upstreams)
        self.metrics = ProxyMetrics(self.core, relays=lambda: len(self.relays),
                                    subscribers=lambda: self.open_subscribers,
                                    engine_waiting=lambda: self.engine_waiting, now=self.now,
                                    upstreams=self.upstreams if several else (), streams=self.streams)
        self.relays = {}
        self.retained = {}
        self.open_subscribers = 0
        self.engine_waiting = 0
        self._calls = OrderedDict()
        self._anonymous = 0
        self._calls_seen = 0
        self._timers = {}
        self._deadline_timers = {}
        self._session: aiohttp.ClientSession | None = None  # for scraping the engine's /metrics
        self._pools = []  # opened by start()
        self._waiting = [0] * len(self.upstreams)  # each upstream's waiting gauge as last scraped
        self._runner: web.AppRunner | None = None
        self._scraper: asyncio.Task[None] | None = None
        self._stopping = False
        self._awaited_at_stop = set()
        self.draining = False
        self.drain_refused = 0
        # Beyond the paper: a circuit breaker decides before the core (proxy/breaker_gate.py).
        self.breaker = (BreakerGate(settings.breaker, self.handle_completion, self.now, _refusal)
                        if settings.breaker is not None else None)
        if self.breaker is not None:
            self.breaker.register(self.metrics.registry)
        header: DecisionLogHeader = {"t0_unix": time.time(), "time_scale": settings.time_scale,
                                     "upstream": settings.upstream, "policy": asdict(settings.policy)}
        if several:
            header["upstreams"], header["route"] = list(self.upstreams), settings.route
        self.log = EventLog(settings.log_path, header, keep=settings.keep_log)

    # -- lifecycle ---------------------------------------------------------------------------

    def app(self) -> web.Application:
        handler = self.handle_completion if self.breaker is None else self.breaker.handle
        routes = [web.post(path, handler) for path in ROUTES]
        routes += [web.get("/ready", self.handle_ready), web.get("/metrics", self.handle_metrics),
                   web.route("*", "/{tail:.*}", self.handle_unknown)]
        app = new_app(routes, client_max_size=self.settings.max_body_bytes, health=self.handle_health)
        app.on_response_prepare.append(self._close_when_draining)
        return app

    async def _close_when_draining(self, request: web.Request, response: web.StreamResponse) -> None:
        """While draining, every response closes its connection: a client or balancer that keeps
        connections alive opens a new one for its next request, which finds this proxy gone (refused:
        it goes elsewhere) rather than a kept connection that closes under it."""
        if self.draining:
            response.force_close()
            response.headers["Connection"] = "close"  # aiohttp wrote its headers before this hook

    async def start(self, host: str = "127.0.0.1", port: int = 8000) -> int:
        """Bind and serve; returns the port (useful with port 0)."""
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                              auto_decompress=False, skip_auto_headers=("User-Agent",))
        settings = self.settings
        idle_s = settings.upstream_idle_timeout_s
        self._pools = [UpstreamPool(url, connect_timeout_s=settings.upstream_connect_timeout_s,
                                    idle_timeout_s=None if idle_s is None else idle_s * settings.time_scale)
                       for url in self.upstreams]
        self._runner, bound = await start_app(self.app(), host, port, reuse_address=True)
        self._scraper = asyncio.create_task(self._housekeeping())
        return bound

    async def drain(self, interrupted: asyncio.Event) -> str:
        """Stop taking new calls and wait until no client waits for anything, at most the drain timeout
        or until `interrupted`; returns why it stopped waiting (idle, timeout, signal). `stop` follows,
        and ends what is left."""
        self.draining = True
        began = time.monotonic()
        if self._runner is not None and self._runner.server is not None:
            close_idle_connections(self._runner.server)  # a balancer's next request opens a new one
        settings = self.settings
        deadline = began + settings.drain_timeout_s * settings.time_scale
        if self.log.active:
            self._log({"ev": "drain", "phase": "start", "executions": len(self.relays),
                       "subscribers": self.open_subscribers, "timeout_s": settings.drain_timeout_s})
        reason = "idle"
        while self.open_subscribers > 0:
            left = deadline - time.monotonic()
            if interrupted.is_set() or left <= 0:
                reason = "signal" if interrupted.is_set() else "timeout"
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(interrupted.wait(), min(left, DRAIN_POLL_S))
        if self.log.active:
            cut = sorted(i for i, r in self.relays.items() if r.live or r.pending)
            self._log({"ev": "drain", "phase": "end", "reason": reason, "waited_s": time.monotonic() - began,
                       "refused": self.drain_refused, "cut": cut})
        self.log.flush()
        return reason

    async def stop(self) -> None:
        """End every execution: one a client still waits for as an upstream fault ends it (an SSE error
        event, or a 503), the others (nobody waits: orphaned) by closing their upstream connection."""
        self._stopping = True  # the executions ended below are cut off by the shutdown, not cancelled
        self._awaited_at_stop = {i for i, r in self.relays.items() if r.live or r.pending}
        for execution_id in self._awaited_at_stop:
            self.relays[execution_id].cut("the proxy is shutting down; retry")
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for handle in self._deadline_timers.values():
            handle.cancel()
        self._deadline_timers.clear()
        self.retained.clear()
        if self._scraper is not None:
            self._scraper.cancel()
        for relay in list(self.relays.values()):
            if relay.task is not None:
                relay.task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        tasks = [r.task for r in self.relays.values() if r.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        for pool in self._pools:
            pool.close()
        self.log.close()

    # -- small routes ------------------------------------------------------------------------

    async def handle_health(self, request: web.Request) -> web.Response:
        """200 once it listens with at least one upstream to send executions to (its body says how many)."""
        status = 200 if self.upstreams else 503
        return web.json_response({"upstreams": len(self.upstreams), "route": self.settings.route if
                                  self.router is not None else None}, status=status)

    async def handle_ready(self, request: web.Request) -> web.Response:
        """Whether to send it new calls: 200 while it serves, 503 from the moment it starts draining."""
        ready = bool(self.upstreams) and not self.draining
        return web.json_response({"ready": ready, "draining": self.draining}, status=200 if ready else 503)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def handle_unknown(self, request: web.Request) -> web.Response:
        status = 405 if request.path in ROUTES else 404
        return error_response(status, f"{request.method} {request.path} is not served here")

    async def _housekeeping(self) -> None:
        """Flush the log, and read the engine's waiting gauge (as the paper's proxy did from vLLM's
        /metrics) where a control uses it: the budget's Retry-After and the deadline check."""
        assert self._session is not None
        policy = self.settings.policy
        scrape = policy.retry_budget or policy.deadline_check
        while True:
            if policy.retain_s > 0:
                self._expire_retained()
            if scrape:  # every replica's gauge, summed (as the simulator's proxy reads a deployment's)
                for index, url in enumerate(self.upstreams):
                    try:
                        async with self._session.get(url + "/metrics") as response:
                            text = await response.read()
                        self._waiting[index] = int(metric_sums(text).get("vllm:num_requests_waiting", 0.0))
                    except (aiohttp.ClientError, OSError, ValueError):
                        pass  # keep the last value; the engine may be starting
                self.engine_waiting = sum(self._waiting)
            self.log.flush()
            await asyncio.sleep(min(self.settings.scrape_s, self.log.flush_s))


# The cyclic collector's generation thresholds while serving (Python's defaults: 700, 10, 10).
SERVING_GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc_for_serving() -> None:
    """Keep the cyclic collector's pauses out of the streams' tail latency. With 1,000 streams the
    proxy allocates tens of thousands of objects a second, and at Python's default thresholds the
    collector runs hundreds of times a second, now and then over every live object (measured: p99
    time to first token 22-24 ms at 1,000 streams, against 3.6 ms direct). What startup built is
    frozen out of every collection, and the young generation is collected 70 times less often;
    cycles are still freed, later (measured p99: 8-11 ms)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLDS)


async def serve_until_stopped(settings: ProxySettings, host: str, port: int, banner: Callable[[int], str]) -> None:
    """Serve until a signal: SIGTERM drains first (a second signal cuts the drain short), SIGINT stops
    at once; then stop, which ends what is left and flushes the log."""
    server = ProxyServer(settings)
    loop = asyncio.get_running_loop()
    signals: asyncio.Queue[signal.Signals] = asyncio.Queue()
    interrupted = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    bound = await server.start(host, port)
    print(banner(bound), flush=True)
    try:
        if await signals.get() == signal.SIGTERM:
            print("retrybench proxy: draining (SIGTERM or SIGINT again stops at once)", flush=True)
            second = asyncio.create_task(signals.get())
            second.add_done_callback(lambda _: interrupted.set())
            reason = await server.drain(interrupted)
            second.cancel()
            print(f"retrybench proxy: drained ({reason})", flush=True)
    finally:
        await server.stop()


def serve_forever(settings: ProxySettings, host: str, port: int) -> None:
    """Run the proxy until a signal (SIGTERM: drain first), then end what is left and flush the log."""
    tune_gc_for_serving()
    upstreams = ", ".join(settings.upstreams)
    routed = f" (route {settings.route})" if len(settings.upstreams) > 1 else ""
    run_event_loop(lambda: serve_until_stopped(
        settings, host, port, lambda bound: f"retrybench proxy on http://{host}:{bound} -> {upstreams}{routed}; "
                                            f"per-chunk path: {RELAY_IMPLEMENTATION}"))
