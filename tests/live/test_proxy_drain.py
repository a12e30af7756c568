"""SIGTERM drains the proxy: a restart ends no call that was in flight.

`retrybench proxy` as a process in front of the stub upstream (a process too), signalled as an
orchestrator signals it. On SIGTERM `/ready` answers 503 at once while `/health` stays 200; every
stream in flight completes with its whole content, a retry of one of those calls still attaches to its
execution, a retained response is still served, a new call gets a 503 with Retry-After, and the process
exits on its own once nothing is in flight, the decision log saying so. Calls queued in the proxy's own
cap are dispatched and complete too. Past the drain timeout, or on a second signal, what is left ends
with the SSE error event an upstream fault ends a stream with.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fixtures.draining import ProxyProcess
from fixtures.front import stub_upstreams
from fixtures.openai_client import metric, sse_events
from fixtures.waiting import until, within

from retrybench.proxy.eventlog import read_event_log
from retrybench.serving.aio import run_event_loop
from retrybench.serving.launch import free_port

pytestmark = pytest.mark.live

HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer tenant-a"}
READY_WITHIN_S = 0.5  # from SIGTERM to /ready answering 503


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with stub_upstreams(tmp_path_factory.mktemp("stub"), 1) as urls:
        yield urls[0]


@pytest.fixture
def proxies(tmp_path: Path) -> Iterator[list[ProxyProcess]]:
    started: list[ProxyProcess] = []
    yield started
    for proxy in started:
        proxy.close()


def start(proxies: list[ProxyProcess], stub: str, tmp_path: Path, policy: str, *extra: str) -> ProxyProcess:
    proxy = ProxyProcess(free_port(), [stub], policy, tmp_path, extra=extra)
    proxies.append(proxy)
    proxy.start()
    return proxy


def body(tokens: int, interval_ms: float, stream: bool = True) -> bytes:
    return json.dumps({"model": "m", "prompt": [101, 102, 103, 104], "max_tokens": tokens, "stream": stream,
                       "stub": {"interval_ms": interval_ms}}).encode()


async def post(session: aiohttp.ClientSession, url: str, key: str, payload: bytes) -> tuple[int, bytes, Any]:
    """(status, the whole body, headers) of one attempt."""
    async with session.post(url + "/v1/completions", data=payload,
                            headers={**HEADERS, "Idempotency-Key": key}) as response:
        return response.status, await response.read(), response.headers


def whole_stream(raw: bytes, tokens: int) -> bool:
    """Whether an SSE body is the stub's whole stream of `tokens` tokens, ended by [DONE]."""
    events = sse_events(raw)
    texts = [e["choices"][0]["text"] for e in events[:-1]]
    return events[-1] == "[DONE]" and texts == [" tok"] * (tokens - 1) + [" end"]


async def ready_503_after(session: aiohttp.ClientSession, proxy: ProxyProcess) -> float:
    """Seconds from the SIGTERM to /ready answering 503."""
    async def draining() -> bool:
        async with session.get(proxy.url + "/ready") as response:
            return response.status == 503
    await until(draining, "/ready to answer 503 after SIGTERM")
    return time.monotonic() - proxy.signalled_at


def drain_events(path: Path) -> list[dict[str, Any]]:
    _, events = read_event_log(path)
    return [e for e in events if e["ev"] == "drain"]


def test_sigterm_lets_every_call_in_flight_complete_and_the_proxy_exits(
        stub: str, proxies: list[ProxyProcess], tmp_path: Path) -> None:
    proxy = start(proxies, stub, tmp_path, "coalescing-retain")  # completed responses kept 10 s
    tokens, interval_ms = 40, 50.0  # each call lasts 2 s
    streams = [f"stream-{i}" for i in range(5)]
    whole = [f"whole-{i}" for i in range(2)]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            seen["done"] = await post(session, proxy.url, "done", body(3, 0.0))  # completed before the signal
            calls = [asyncio.create_task(post(session, proxy.url, key, body(tokens, interval_ms))) for key in streams]
            calls += [asyncio.create_task(post(session, proxy.url, key, body(tokens, interval_ms, stream=False)))
                      for key in whole]
            await until(lambda: _equals(metric(session, proxy.url, "retrybench_proxy_subscribers"), 7.0),
                        "all seven calls to be in flight")
            proxy.terminate()
            seen["ready_s"] = await ready_503_after(session, proxy)
            async with session.get(proxy.url + "/health") as response:
                seen["health"] = response.status
            seen["new"] = await post(session, proxy.url, "new-call", body(tokens, interval_ms))
            seen["retry"] = await post(session, proxy.url, streams[0], body(tokens, interval_ms))
            seen["retained"] = await post(session, proxy.url, "done", body(3, 0.0))
            seen["calls"] = await asyncio.gather(*calls)

    run_event_loop(lambda: within(main(), "the calls through a draining proxy"))
    code, exit_s = proxy.wait_exit()
    print(f"SIGTERM -> /ready 503 in {seen['ready_s'] * 1000:.1f} ms, -> exit in {exit_s:.2f} s")
    assert seen["ready_s"] < READY_WITHIN_S, f"/ready answered 503 {seen['ready_s']:.3f} s after SIGTERM"
    assert seen["health"] == 200, "/health must stay 200 while draining"
    status, raw, headers = seen["new"]
    assert status == 503 and headers.get("Retry-After") == "1", (status, raw)
    assert json.loads(raw)["error"]["param"] == "draining"
    status, raw, headers = seen["retry"]
    assert (status, headers.get("X-Retrybench-Attached")) == (200, "1"), (status, raw)
    assert whole_stream(raw, tokens), raw[-300:]
    status, raw, headers = seen["retained"]
    assert (status, headers.get("X-Retrybench-Retained")) == (200, "1"), (status, raw)
    assert raw == seen["done"][1] and whole_stream(raw, 3)
    results = dict(zip(streams + whole, seen["calls"], strict=True))
    assert all(results[k][0] == 200 and whole_stream(results[k][1], tokens) for k in streams), \
        {k: (results[k][0], results[k][1][-200:]) for k in streams}
    assert all(results[k][0] == 200 and json.loads(results[k][1])["choices"][0]["text"] == " tok" * tokens
               for k in whole), {k: results[k][:2] for k in whole}
    assert code == 0, proxy.output()
    events = drain_events(proxy.log_path(1))
    assert [e["phase"] for e in events] == ["start", "end"], events
    assert (events[1]["reason"], events[1]["cut"], events[1]["refused"]) == ("idle", [], 1), events
    assert events[0]["subscribers"] == 7


async def _equals(value: Any, expected: float) -> bool:
    return bool(await value == expected)


def test_sigterm_dispatches_and_completes_the_calls_queued_in_the_proxy(
        stub: str, proxies: list[ProxyProcess], tmp_path: Path) -> None:
    policy = tmp_path / "cap-1.toml"
    policy.write_text('description = "one execution upstream at a time"\n[proxy]\nmax_outstanding = 1\n')
    proxy = start(proxies, stub, tmp_path, str(policy))
    tokens, interval_ms = 10, 50.0  # 0.5 s each, one after another
    keys = [f"queued-{i}" for i in range(3)]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            calls = [asyncio.create_task(post(session, proxy.url, key, body(tokens, interval_ms))) for key in keys]
            await until(lambda: _equals(metric(session, proxy.url, "retrybench_proxy_queue_depth"), 2.0),
                        "two calls to wait in the proxy's queue")
            proxy.terminate()
            seen["ready_s"] = await ready_503_after(session, proxy)
            seen["calls"] = await asyncio.gather(*calls)

    run_event_loop(lambda: within(main(), "the queued calls through a draining proxy"))
    code, exit_s = proxy.wait_exit()
    print(f"queued: SIGTERM -> /ready 503 in {seen['ready_s'] * 1000:.1f} ms, -> exit in {exit_s:.2f} s")
    assert [status for status, _, _ in seen["calls"]] == [200, 200, 200]
    assert all(whole_stream(raw, tokens) for _, raw, _ in seen["calls"]), [raw[-200:] for _, raw, _ in seen["calls"]]
    assert code == 0, proxy.output()
    assert drain_events(proxy.log_path(1))[-1]["reason"] == "idle"


def _cut_stream(raw: bytes) -> dict[str, Any]:
    """The error event that ended a stream the proxy cut (the stream then ends with [DONE])."""
    events = sse_events(raw)
    assert events[-1] == "[DONE]" and "error" in events[-2], raw[-300:]
    error: dict[str, Any] = events[-2]["error"]
    return error


@pytest.mark.parametrize("how", ["timeout", "signal"])
def test_what_outlives_the_drain_ends_with_an_error_event(
        how: str, stub: str, proxies: list[ProxyProcess], tmp_path: Path) -> None:
    """Past --drain-timeout, or on a second SIGTERM, a stream still running ends with an SSE error
    event (a 503: its client may retry) and [DONE], and the proxy exits."""
    timeout_s = "0.5" if how == "timeout" else "600"
    proxy = start(proxies, stub, tmp_path, "coalescing", "--drain-timeout", timeout_s)
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            call = asyncio.create_task(post(session, proxy.url, "long", body(3000, 20.0)))  # 60 s
            await until(lambda: _equals(metric(session, proxy.url, "retrybench_proxy_subscribers"), 1.0),
                        "the call to be in flight")
            proxy.terminate()
            await ready_503_after(session, proxy)
            if how == "signal":
                proxy.signal(signal.SIGTERM)
            seen["call"] = await call

    run_event_loop(lambda: within(main(), "the long call"))
    code, exit_s = proxy.wait_exit()
    print(f"{how}: SIGTERM -> exit in {exit_s:.2f} s")
    status, raw, _ = seen["call"]
    assert status == 200
    error = _cut_stream(raw)
    assert error["code"] == 503 and "shutting down" in error["message"], error
    assert code == 0, proxy.output()
    assert exit_s < 30, f"the proxy took {exit_s:.1f} s to exit"
    _, events = read_event_log(proxy.log_path(1))
    end = [e for e in events if e["ev"] == "drain"][-1]
    assert (end["reason"], end["cut"]) == (how, [0]), end
    assert [e["fate"] for e in events if e["ev"] == "end"] == ["unfinished"]
