"""Engine faults with subscribers attached: each ends every subscriber with an error it can act on.

The proxy runs coalescing with deferred cancellation in front of the fault upstream
(fixtures.fault_upstream), and each fault hits an execution that two subscribers follow
(the first attempt and a retry with the same Idempotency-Key, attached), while another call
streams beside it. The fault is released only once both are subscribed, so nothing here depends
on timing. Afterwards: the retry that follows gets a new execution and a proper answer, and the
proxy holds nothing (executions, subscribers, buffers, timers, upstream exchanges), its open files
and its memory included, over repeated rounds.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fixtures.fault_upstream import FAULTS, FaultUpstream
from fixtures.stack import External, ProxyStack, open_fds, policy, proxy_stack, rss_bytes, run_stack
from fixtures.waiting import GENEROUS_S, until, within

from retrybench.proxy.relay import Relay
from retrybench.serving.aio import run_event_loop
from retrybench.serving.launch import ServerProcess, free_port

pytestmark = pytest.mark.live

Stack = ProxyStack[FaultUpstream]
IDLE_S = 1.0  # the proxy's idle timeout here: the hang and drip faults end on it
CLIENT_DEADLINE_S = GENEROUS_S  # every subscriber must end well within it: nothing hangs
CHOSEN = policy("deferred-cancellation", defer_s=1.0)


@dataclass(frozen=True)
class Expected:
    status: int  # what each subscriber's response says
    event_code: int | None  # the SSE error event's code ending a stream under way
    fate: str  # the execution's, in /metrics
    stream: bool = True


EXPECTED = {
    "close": Expected(200, 502, "failed"),
    "close_mid_event": Expected(200, 502, "failed"),
    "bad_framing": Expected(200, 502, "failed"),
    "bad_framing_mid_event": Expected(200, 502, "failed"),  # the half event is ended before the error event
    "hang": Expected(200, 504, "failed"),
    "drip": Expected(200, 504, "failed"),
    "reset": Expected(502, None, "failed"),
    "hang_before_head": Expected(504, None, "failed"),
    "invalid_json": Expected(502, None, "failed", stream=False),
    "status": Expected(503, None, "refused"),
    "malformed_sse": Expected(200, None, "completed"),  # relayed as sent: the proxy does not parse events
}
assert set(EXPECTED) == set(FAULTS)


def body(fault: str | None, n: int = 6, stream: bool = True, **stub: Any) -> dict[str, Any]:
    if fault is not None:
        stub = {"fault": fault, "fault_times": 1, "gate": True, **stub}
    return {"model": "m", "prompt": [101, 102, 103], "max_tokens": n, "stream": stream, "stub": stub}


@dataclass
class Outcome:
    status: int
    body: bytes
    ended: float  # time.monotonic()
    error: str | None = None  # the client's own error (a reset connection)

    def events(self) -> list[str]:
        return [e.strip()[len("data: "):] for e in self.body.decode().split("\n\n") if e.strip()]


async def attempt(s: Stack, payload: dict[str, Any], key: str) -> Outcome:
    """One attempt to its end, however it ends."""
    try:
        async with s.post(payload, key=key) as response:
            data = await response.read()
            return Outcome(response.status, data, time.monotonic())
    except aiohttp.ClientError as error:
        return Outcome(0, b"", time.monotonic(), repr(error))


def relay_of(s: Stack, tag: str) -> Relay | None:
    """The execution whose request carries this tag in its `stub` object."""
    marker = f'"tag": "{tag}"'.encode()
    for relay in s.proxy.relays.values():
        if marker in relay.body:
            return relay
    return None


def subscribed(s: Stack, tag: str, count: int) -> bool:
    relay = relay_of(s, tag)
    return relay is not None and relay.subscribers == count


@dataclass
class Round:
    fault: str
    key: str
    payload: dict[str, Any]
    subscribers: list[asyncio.Task[Outcome]]
    neighbour: asyncio.Task[Outcome]


async def start_round(s: Stack, fault: str, tag: str) -> Round:
    """The first attempt and its retry subscribed to the faulty execution, and a call beside them."""
    expected = EXPECTED[fault]
    payload = body(fault, stream=expected.stream, tag=tag)
    key = f"{fault}-{tag}"
    first = asyncio.create_task(attempt(s, payload, key))
    await until(lambda: relay_of(s, tag) is not None, f"the {fault} execution to start")
    retry = asyncio.create_task(attempt(s, payload, key))
    relay = relay_of(s, tag)
    assert relay is not None

    def both_subscribed() -> bool:
        return relay.subscribers == 2 and (len(relay.live) == 2 or relay.pending == 2)

    await until(both_subscribed, f"the retry to attach to the {fault} execution",
                seen=lambda: f"{relay.subscribers} subscribers, {len(relay.live)} live, {relay.pending} pending")
    neighbour = asyncio.create_task(attempt(s, body(None, n=20, interval_ms=5, tag=f"n{tag}"), f"neighbour-{tag}"))
    return Round(fault, key, payload, [first, retry], neighbour)


def check_subscriber(fault: str, got: Outcome) -> str:
    """What the subscriber received must be the fault's expected error; returns it in words."""
    expected = EXPECTED[fault]
    assert got.error is None, f"{fault}: the client's connection broke: {got.error}"
    assert got.status == expected.status, f"{fault}: status {got.status}: {got.body[-300:]!r}"
    if not expected.stream or got.status != 200:
        error = json.loads(got.body)["error"]
        assert error["code"] == expected.status and error["message"] and error["type"], error
        return f"HTTP {got.status} {error['type']}"
    events = got.events()
    assert events[-1] == "[DONE]", f"{fault}: the stream did not end properly: {events[-3:]}"
    if expected.event_code is None:
        return f"HTTP 200, the engine's {len(events)} events as sent"
    error = json.loads(events[-2])["error"]
    assert error["code"] == expected.event_code and error["message"], error
    return f"HTTP 200, {len(events) - 2} events, SSE error {error['code']} {error['type']}, [DONE]"


async def finish_round(s: Stack, r: Round, released: float) -> dict[str, Any]:
    """Each subscriber's outcome checked; the neighbour served; the next retry served anew."""
    outcomes = await asyncio.gather(*r.subscribers)
    received = {check_subscriber(r.fault, got) for got in outcomes}
    took = max(got.ended for got in outcomes) - released
    assert took < CLIENT_DEADLINE_S, f"{r.fault}: the subscribers ended {took:.1f} s after the fault"
    neighbour = await r.neighbour
    assert neighbour.status == 200 and neighbour.events()[-1] == "[DONE]" and len(neighbour.events()) == 21
    async with s.post(r.payload, key=r.key) as again:  # the call's next retry: a new execution, served properly
        assert again.status == 200 and again.headers["X-Retrybench-Attached"] == "0"
        data = await again.read()
    assert b'"error"' not in data
    return {"fault": r.fault, "received": " | ".join(sorted(received)), "took_s": took}


def fresh_gate(s: Stack) -> None:
    s.upstream.gate = asyncio.Event()


async def one_round(s: Stack, faults: list[str], tag: str) -> list[dict[str, Any]]:
    fresh_gate(s)
    rounds = [await start_round(s, fault, f"{tag}{i}") for i, fault in enumerate(faults)]
    released = time.monotonic()
    s.upstream.gate.set()
    rows = [await finish_round(s, r, released) for r in rounds]
    await s.drained()
    return rows


def run(test: Any, **settings: Any) -> None:
    settings.setdefault("upstream_idle_timeout_s", IDLE_S)
    run_stack(CHOSEN, test, FaultUpstream(), seen=lambda s: s.held(), **settings)


@pytest.mark.parametrize("fault", FAULTS)
def test_every_subscriber_of_a_faulty_execution_gets_an_error_it_can_act_on(fault: str) -> None:
    async def test(s: Stack) -> None:
        fds = open_fds()
        (row,) = await one_round(s, [fault], "a")
        fate = EXPECTED[fault].fate
        # the faulty execution, and two completed: the neighbour and the retry after the fault
        fates = {f: await s.metric("retrybench_proxy_executions_total", fate=f) for f in (fate, "completed")}
        assert fates == {fate: 1 + 2 * (fate == "completed"), "completed": 2 + (fate == "completed")}, fates
        assert s.upstream.faults[fault] == 1
        await until(lambda: open_fds() <= fds, "the open files to come back to their count before the fault",
                    seen=lambda: f"{open_fds()} open, {fds} before")
        print(f"\nFAULT-ROW {fault}: {row['received']}; ended {row['took_s']:.3f} s after the fault; "
              f"held afterwards {s.held()}; open files {open_fds()} (before {fds})")

    run(test, fresh_connections=True)


def test_repeated_rounds_of_every_fault_leave_nothing_behind() -> None:
    """Every fault at once, round after round: nothing is held after each, the open files come back
    to their count, and memory does not grow by more than 5% (after two rounds of warm-up)."""
    rounds = 8

    async def test(s: Stack) -> None:
        for warmup in range(2):
            await one_round(s, list(FAULTS), f"w{warmup}-")
        gc.collect()
        fds, rss = open_fds(), rss_bytes()
        for i in range(rounds):
            await one_round(s, list(FAULTS), f"r{i}-")
            await until(lambda: open_fds() <= fds, f"the open files after round {i} to come back to {fds}",
                        seen=open_fds)
        gc.collect()
        grown = rss_bytes() / rss - 1
        print(f"\nLEFTOVERS {rounds} rounds x {len(FAULTS)} faults: open files {open_fds()} (before {fds}), "
              f"RSS {rss_bytes() / 2**20:.1f} MiB (before {rss / 2**20:.1f}, {100 * grown:+.2f}%)")
        assert grown <= 0.05, f"RSS grew {100 * grown:.1f}% over {rounds} rounds"
        assert s.proxy.retained == {} and s.proxy._timers == {}

    run(test, fresh_connections=True)


# -- the upstream unreachable or crashing -------------------------------------------------------------


@contextmanager
def unaccepting_listener() -> Iterator[int]:
    """A port whose accept queue is full: a connection to it neither opens nor fails (its SYN is dropped)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port: int = server.getsockname()[1]
        fillers = [socket.socket() for _ in range(2)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
            yield port
        finally:
            for filler in fillers:
                filler.close()


def test_a_connection_that_never_opens_is_a_504_after_the_connect_timeout() -> None:
    with unaccepting_listener() as port:
        async def test(s: ProxyStack[Any]) -> None:
            began = time.monotonic()
            async with s.post(body(None), key="c") as response:
                error = (await response.json())["error"]
            took = time.monotonic() - began
            assert response.status == 504 and error["type"] == "GatewayTimeoutError", error
            assert "no connection within 1 s" in error["message"], error
            assert took < CLIENT_DEADLINE_S
            await s.drained()
            print(f"\nFAULT-ROW connect timeout: HTTP 504; ended {took:.3f} s after the request")

        run_stack(CHOSEN, test, External(f"http://127.0.0.1:{port}"), upstream_connect_timeout_s=1.0)


def test_an_engine_crash_fails_queued_prefilling_and_streaming_executions_and_the_proxy_serves_its_restart() -> None:
    """Executions queued in the proxy (a cap of 3), queued in the engine (no head yet), in prefill (a
    head, no token) and streaming, each with a retry attached: the crash resets every connection and
    the port refuses new ones. Every subscriber gets its error; the proxy serves again once the engine
    listens again, without a restart of its own."""
    chosen = policy("deferred-cancellation", defer_s=1.0, max_outstanding=3)
    stages = {"engine-queue": body("hang_before_head", tag="engine-queue", gate=False),
              "prefill": body("hang", tag="prefill", gate=False),
              "streaming": body(None, n=5000, interval_ms=10, tag="streaming"),
              "proxy-queue": body(None, tag="proxy-queue")}

    async def test(s: Stack) -> None:
        tasks: dict[str, list[asyncio.Task[Outcome]]] = {stage: [] for stage in stages}
        for stage, payload in stages.items():
            for count in (1, 2):  # the attempt and its retry, attached
                tasks[stage].append(asyncio.create_task(attempt(s, payload, stage)))
                await until(partial(subscribed, s, stage, count), f"{stage}'s subscriber {count}", seen=s.held)
        await until(lambda: s.proxy.core.waiting == 1 and s.upstream.open_connections == 3,
                    "three executions at the engine, one in the proxy's queue", seen=s.held)
        streaming = relay_of(s, "streaming")
        assert streaming is not None
        await until(lambda: streaming.first_token, "the stream's first token")
        crashed = time.monotonic()
        s.upstream.crash()
        outcomes = {stage: await asyncio.gather(*ts) for stage, ts in tasks.items()}
        for stage, got in outcomes.items():
            took = max(o.ended for o in got) - crashed
            assert took < CLIENT_DEADLINE_S
            for o in got:
                assert o.error is None, f"{stage}: {o.error}"
            if stage in ("prefill", "streaming"):
                codes = [json.loads(o.events()[-2])["error"]["code"] for o in got]
                assert [o.status for o in got] == [200, 200] and codes == [502, 502], (stage, got)
            else:
                assert [o.status for o in got] == [502, 502], (stage, got)
            print(f"\nFAULT-ROW crash/{stage}: HTTP {got[0].status}; ended {took:.3f} s after the crash")
        await s.drained()
        async with s.post(body(None, tag="down"), key="down") as down:
            assert down.status == 502  # the engine is down: refused at once
        await s.upstream.restart()
        async with s.post(body(None, tag="back"), key="back") as back:
            assert back.status == 200 and (await back.read()).endswith(b"data: [DONE]\n\n")
        await s.drained()
        assert await s.metric("retrybench_proxy_executions_total", fate="failed") == 5

    run_stack(chosen, test, FaultUpstream(), seen=lambda s: s.held(), upstream_idle_timeout_s=None)


# -- a real engine process killed and restarted -------------------------------------------------------


def engine_process(port: int, log: Path) -> ServerProcess:
    return ServerProcess([sys.executable, "-m", "retrybench", "engine-server", "--model", "tiny-llama", "--gpu", "cpu",
                          "--port", str(port)], health_url=f"http://127.0.0.1:{port}/health", log_path=log,
                         start_timeout_s=GENEROUS_S)


def test_a_killed_engine_process_fails_its_executions_and_the_proxy_serves_its_restart(tmp_path: Path) -> None:
    """`retrybench engine-server` killed with SIGKILL while the proxy has executions streaming from it
    (each with a retry attached) and more queued in its own queue: every subscriber gets its error at
    once, and once the engine is started again on the same port the proxy serves, unrestarted."""
    port = free_port()
    chosen = policy("deferred-cancellation", defer_s=1.0, max_outstanding=3)
    calls = 5  # three streaming from the engine, two queued in the proxy

    def stream_body(i: int) -> dict[str, Any]:
        return {"model": "tiny-llama", "prompt": [5, 6, 7, 8], "max_tokens": 30_000, "stream": True,
                "ignore_eos": True, "call": i}

    def subscribers_are(s: ProxyStack[Any], n: int) -> bool:
        return s.proxy.open_subscribers == n

    def streaming_and_queued(s: ProxyStack[Any]) -> bool:
        return sum(r.first_token for r in s.proxy.relays.values()) == 3 and s.proxy.core.waiting == 2

    async def test(s: ProxyStack[Any], engine: ServerProcess) -> None:
        tasks = []
        for i in range(calls):
            for _ in range(2):  # the attempt and its retry, attached
                tasks.append(asyncio.create_task(attempt(s, stream_body(i), f"call-{i}")))
                await until(partial(subscribers_are, s, len(tasks)), f"subscriber {len(tasks)}", seen=s.held)
        await until(partial(streaming_and_queued, s), "three executions streaming, two queued in the proxy",
                    seen=s.held)
        killed = time.monotonic()
        os.kill(engine.pid, signal.SIGKILL)
        outcomes = await asyncio.gather(*tasks)
        took = max(o.ended for o in outcomes) - killed
        assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
        streamed = [o for o in outcomes if o.status == 200]
        assert len(streamed) == 6 and all(json.loads(o.events()[-2])["error"]["code"] == 502 for o in streamed)
        assert sorted(o.status for o in outcomes) == [200] * 6 + [502] * 4
        assert took < CLIENT_DEADLINE_S
        await s.drained()
        print(f"\nFAULT-ROW SIGKILL engine-server: 6 streaming subscribers HTTP 200 + SSE error 502, 4 queued "
              f"HTTP 502; ended {took:.3f} s after the kill; held afterwards {s.held()}")

    async def main() -> None:
        with engine_process(port, tmp_path / "engine.log") as engine:
            async with proxy_stack(chosen, External(f"http://127.0.0.1:{port}")) as s:
                await within(test(s, engine), "the kill to be handled", seen=s.held)
                await asyncio.to_thread(engine.__exit__, None, None, None)  # reaps the killed process
                with engine_process(port, tmp_path / "engine-again.log"):
                    async with s.post(stream_body(99), key="after") as again:
                        assert again.status == 200 and again.headers["X-Retrybench-Attached"] == "0"
                        data = await again.content.readuntil(b"\n\n")  # its first event, then it leaves
                    assert b'"text"' in data
                    await s.drained()
                    assert await s.metric("retrybench_proxy_executions_total", fate="failed") == calls

    run_event_loop(main)
