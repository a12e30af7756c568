"""The live proxy against a minimal streaming upstream: relay, cancellation, coalescing, refusals, bad input.

Each test runs one asyncio loop (`asyncio.run`) holding the stub upstream, the proxy and an aiohttp
client, so what crosses the sockets is real HTTP on loopback.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from retrybench.analysis.conformance import replay
from retrybench.config import ProxyPolicy, load_condition
from retrybench.live.aio import run_event_loop
from retrybench.live.proxy_server import ProxyServer, ProxySettings
from retrybench.live.stub_upstream import StubUpstream

pytestmark = pytest.mark.live


class Stack:
    def __init__(self, stub: StubUpstream, proxy: ProxyServer, url: str, session: aiohttp.ClientSession) -> None:
        self.stub, self.proxy, self.url, self.session = stub, proxy, url, session

    def post(self, body: dict[str, Any] | bytes, key: str | None = None, path: str = "/v1/completions",
             **headers: str) -> Any:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", "Authorization": "Bearer tenant-a", **headers}
        if key is not None:
            hdrs["Idempotency-Key"] = key
        return self.session.post(self.url + path, data=data, headers=hdrs)

    async def metric(self, name: str, **labels: str) -> float:
        async with self.session.get(self.url + "/metrics") as response:
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        raise AssertionError(f"no sample {name} {labels} in /metrics")

    async def settle(self) -> None:
        """Wait until the proxy holds no execution and no subscriber (or fail: a leak)."""
        await until(lambda: not self.proxy.relays and self.proxy.open_subscribers == 0, "proxy to settle")


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@asynccontextmanager
async def stack(policy: ProxyPolicy, upstream: str | None = None, **settings: Any) -> AsyncIterator[Stack]:
    stub = StubUpstream()
    port = await stub.start()
    proxy = ProxyServer(ProxySettings(upstream=upstream or f"http://127.0.0.1:{port}", policy=policy, keep_log=True,
                                      **settings))
    proxy_port = await proxy.start("127.0.0.1", 0)
    session = aiohttp.ClientSession()
    try:
        yield Stack(stub, proxy, f"http://127.0.0.1:{proxy_port}", session)
    finally:
        await session.close()
        await proxy.stop()
        await stub.stop()


def run(policy: ProxyPolicy, test: Callable[[Stack], Awaitable[None]], **settings: Any) -> None:
    async def main() -> None:
        async with stack(policy, **settings) as s:
            await test(s)

    run_event_loop(main)  # uvloop where installed, as `retrybench proxy` runs


def body(n: int = 5, stream: bool = True, **stub: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": [101, 102, 103, 104], "max_tokens": n, "stream": stream, "stub": stub}


def policy(name: str, **overrides: Any) -> ProxyPolicy:
    return replace(load_condition(name).proxy, **overrides)


async def direct_bytes(s: Stack, payload: dict[str, Any]) -> bytes:
    """What the upstream sends for `payload` without the proxy."""
    async with s.session.post(s.proxy.upstream + "/v1/completions", json=payload) as response:
        return await response.read()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- relay ------------------------------------------------------------------------------------------


def test_a_stream_is_relayed_byte_for_byte() -> None:
    async def test(s: Stack) -> None:
        expected = await direct_bytes(s, body(7))
        async with s.post(body(7)) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            assert response.headers["X-Retrybench-Attached"] == "0"
            got = await response.read()
        assert got == expected and got.endswith(b"data: [DONE]\n\n") and got.count(b"data: ") == 8
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="completed") == 1

    run(policy("no-control"), test)


def test_a_whole_response_is_relayed_with_its_status() -> None:
    async def test(s: Stack) -> None:
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stub": {}}
        async with s.post(chat, path="/v1/chat/completions") as response:
            assert response.status == 200
            data = await response.json()
        assert data["choices"][0]["text"] == " tok" * 3
        await s.settle()

    run(policy("no-control"), test)


# -- cancellation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("moment", ["before_first_token", "mid_stream"])
def test_a_client_leaving_closes_the_upstream_stream_when_cancellation_is_on(moment: str) -> None:
    async def test(s: Stack) -> None:
        payload = body(50, interval_ms=20, first_delay_ms=1000 if moment == "before_first_token" else 0)
        response = await s.post(payload, key="c1").__aenter__()
        assert response.status == 200
        if moment == "mid_stream":
            await response.content.readuntil(b"\n\n")
        else:
            await until(lambda: s.stub.open_streams == 1, "the upstream stream to open")
        response.close()  # the client leaves: its connection closes
        await until(lambda: s.stub.disconnects == 1, "the upstream to see the disconnect", timeout_s=0.5)
        await s.settle()
        assert s.stub.completed == 0
        assert await s.metric("retrybench_proxy_executions_total", fate="cancelled") == 1

    run(policy("retries-on-cancel-on"), test)


def test_with_cancellation_off_a_left_execution_runs_on_as_an_orphan() -> None:
    async def test(s: Stack) -> None:
        response = await s.post(body(10, interval_ms=10), key="c1").__aenter__()
        await response.content.readuntil(b"\n\n")
        response.close()
        await until(lambda: s.stub.completed == 1, "the orphan to finish")
        await s.settle()
        assert s.stub.disconnects == 0
        assert await s.metric("retrybench_proxy_executions_total", fate="orphaned") == 1

    run(policy("retries-on-cancel-off"), test)


def test_a_queued_execution_whose_client_left_is_dropped_before_the_engine() -> None:
    async def test(s: Stack) -> None:
        holder = await s.post(body(30, interval_ms=20), key="hold").__aenter__()
        await holder.content.readuntil(b"\n\n")
        queued = asyncio.ensure_future(s.post(body(3), key="queued").__aenter__())
        await until(lambda: s.proxy.core.waiting == 1, "the second execution to queue")
        assert await s.metric("retrybench_proxy_queue_depth") == 1
        queued.cancel()  # the client gives up while its execution waits in the proxy's queue
        await until(lambda: s.proxy.core.waiting == 0, "the drop")
        holder.close()
        await s.settle()
        assert s.stub.requests == 1  # the dropped execution never reached the upstream
        assert await s.metric("retrybench_proxy_executions_total", fate="dropped") == 1

    run(policy("proxy-cap", max_outstanding=1), test)


# -- coalescing and deferral ------------------------------------------------------------------------


def test_a_retry_attaches_to_its_calls_live_execution_and_gets_the_whole_output() -> None:
    async def test(s: Stack) -> None:
        payload = body(30, interval_ms=10)
        expected = await direct_bytes(s, payload)
        first = await s.post(payload, key="call-1").__aenter__()
        await first.content.readuntil(b"\n\n")
        first.close()  # the first attempt times out; cancellation is off, so the execution lives on
        await asyncio.sleep(0.05)
        async with s.post(payload, key="call-1") as retry:
            assert retry.headers["X-Retrybench-Attached"] == "1"
            assert retry.headers["X-Retrybench-Execution"] == first.headers["X-Retrybench-Execution"]
            got = await retry.read()
        assert got == expected  # replayed from the start, then live
        assert s.stub.requests == 2  # the direct request and the one execution
        async with s.post({**payload, "max_tokens": 3}, key="call-1") as changed:
            assert changed.headers["X-Retrybench-Attached"] == "0"  # a different body never attaches
            await changed.read()
        await s.settle()
        assert await s.metric("retrybench_proxy_decisions_total", decision="attached") == 1
        assert await s.metric("retrybench_proxy_executions_total", fate="attached") == 1

    run(policy("coalescing"), test)


def test_deferred_cancellation_cancels_after_w_only_when_nobody_reattached() -> None:
    async def test(s: Stack) -> None:
        payload = body(300, interval_ms=10)  # 3 s: longer than the test
        first = await s.post(payload, key="call-1").__aenter__()
        await first.content.readuntil(b"\n\n")
        first.close()
        await asyncio.sleep(0.1)  # within W = 0.3 s: still live
        assert s.stub.disconnects == 0
        retry = await s.post(payload, key="call-1").__aenter__()
        assert retry.headers["X-Retrybench-Attached"] == "1"
        await asyncio.sleep(0.3)  # the first timer falls due while the retry is attached: no cancel
        assert s.stub.disconnects == 0
        retry.close()
        await asyncio.sleep(0.15)
        assert s.stub.disconnects == 0  # W has not passed since the retry left
        await until(lambda: s.stub.disconnects == 1, "the deferred cancellation", timeout_s=0.5)
        await s.settle()
        assert s.stub.completed == 0

    run(policy("deferred-cancellation", defer_s=0.3), test)


def test_a_time_scale_stretches_the_policys_timers() -> None:
    async def test(s: Stack) -> None:
        first = await s.post(body(100, interval_ms=10), key="call-1").__aenter__()
        await first.content.readuntil(b"\n\n")
        first.close()
        await asyncio.sleep(0.2)  # W = 10 policy seconds = 0.5 wall seconds at scale 0.05
        assert s.stub.disconnects == 0
        await until(lambda: s.stub.disconnects == 1, "the deferred cancellation", timeout_s=0.6)

    run(policy("deferred-cancellation", defer_s=10.0), test, time_scale=0.05)


# -- refusals ---------------------------------------------------------------------------------------


def test_the_retry_budget_refuses_with_retry_after() -> None:
    async def test(s: Stack) -> None:
        async with s.post(body(1), key="call-1") as first:
            await first.read()
        async with s.post(body(1), key="call-1") as retry:
            assert retry.status == 429
            assert int(retry.headers["Retry-After"]) >= 1
            assert float(retry.headers["Retry-After-Ms"]) > 0
            error = (await retry.json())["error"]
        assert error["code"] == 429 and error["type"] == "RateLimitError"
        assert s.stub.requests == 1
        assert await s.metric("retrybench_proxy_decisions_total", decision="refused_429") == 1
        assert await s.metric("retrybench_proxy_retries_total") == 1

    run(policy("retry-budget-cancel-on"), test)


def test_an_upstream_503_is_passed_through_in_both_forms() -> None:
    async def test(s: Stack) -> None:
        async with s.post(body(3, status=503)) as plain:
            assert plain.status == 503
            assert (await plain.json())["error"]["code"] == 503
        async with s.post(body(3, sse_error=True)) as streamed:  # vLLM: HTTP 200, an SSE error event
            assert streamed.status == 200
            text = await streamed.text()
        assert '"code": 503' in text and text.endswith("data: [DONE]\n\n")
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="refused") == 2

    run(policy("no-control"), test)


# -- bad input --------------------------------------------------------------------------------------


def test_bad_input_gets_an_openai_style_error_and_changes_nothing() -> None:
    async def test(s: Stack) -> None:
        cases: list[tuple[Any, int, str]] = [
            (s.post(b"{not json"), 400, "BadRequestError"),
            (s.post({"model": "m", "max_tokens": 3}), 400, "BadRequestError"),
            (s.post({"model": "m", "prompt": [1], "max_tokens": -2}), 400, "BadRequestError"),
            (s.post(b"[" + b"1," * 2000 + b"1]"), 413, "RequestEntityTooLargeError"),
            (s.post(body(), path="/v1/embeddings"), 404, "NotFoundError"),
            (s.session.get(s.url + "/v1/completions"), 405, "MethodNotAllowedError"),
        ]
        for request, status, kind in cases:
            async with request as response:
                assert response.status == status
                error = (await response.json())["error"]
                assert error["code"] == status and error["type"] == kind and error["message"]
        assert s.stub.requests == 0
        assert await s.metric("retrybench_proxy_attempts_total") == 0
        async with s.post(body(2)) as ok:  # still serving
            assert ok.status == 200 and (await ok.read()).endswith(b"[DONE]\n\n")
        await s.settle()

    run(policy("no-control"), test, max_body_bytes=2048)


def test_an_unreachable_upstream_is_a_502() -> None:
    async def test(s: Stack) -> None:
        for stream in (True, False):
            async with s.post(body(2, stream=stream)) as response:
                assert response.status == 502
                assert (await response.json())["error"]["type"] == "BadGatewayError"
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="failed") == 2

    run(policy("no-control"), test, upstream=f"http://127.0.0.1:{closed_port()}")


def test_health_and_metrics() -> None:
    async def test(s: Stack) -> None:
        async with s.session.get(s.url + "/health") as health:
            assert health.status == 200
        assert await s.metric("retrybench_proxy_queue_depth") == 0
        assert await s.metric("retrybench_proxy_budget_ratio") == pytest.approx(0.1)

    run(policy("retry-budget"), test)


# -- conformance ------------------------------------------------------------------------------------


def test_the_decision_log_replays_through_the_simulators_core_with_the_same_decisions() -> None:
    chosen = policy("deferred-cancellation", defer_s=0.2)

    async def test(s: Stack) -> None:
        async def attempt(key: str, leave_after_chunks: int | None, n: int = 20) -> None:
            async with s.post(body(n, interval_ms=5), key=key) as response:
                if leave_after_chunks is None:
                    await response.read()
                    return
                for _ in range(leave_after_chunks):
                    await response.content.readuntil(b"\n\n")
                response.close()

        await asyncio.gather(*(attempt(f"call-{i}", 2 if i % 2 else None, n=100 if i % 2 else 20)
                               for i in range(6)))
        await asyncio.gather(*(attempt(f"call-{i}", None, n=100) for i in range(1, 6, 2)))  # retries attach
        await attempt("call-9", 1, n=200)
        await asyncio.sleep(0.4)  # its deferred cancellation falls due
        await s.settle()
        checked, mismatches = replay(chosen, s.proxy.log.events)
        assert mismatches == []
        assert checked.get("create", 0) == 7 and checked.get("attach", 0) == 3 and checked.get("cancel", 0) == 1

    run(chosen, test)


# -- the official OpenAI SDK as a client ------------------------------------------------------------


def test_the_openai_sdks_own_retries_attach_to_the_live_execution() -> None:
    """Non-streaming: the SDK retries an attempt that timed out before its response. (A stream's
    headers arrive at once, so a slow stream fails mid-iteration, which the SDK does not retry.)"""
    openai = pytest.importorskip("openai")

    async def test(s: Stack) -> None:
        # The execution takes ~1 s; the SDK's attempt timeout is 0.4 s, so its first attempt times out,
        # it backs off (~0.4-0.5 s) and retries with the same body and the caller's Idempotency-Key.
        client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="tenant-a", timeout=0.4, max_retries=2)
        try:
            completion = await client.completions.create(
                model="m", prompt=[101, 102, 103], max_tokens=20, extra_body={"stub": {"interval_ms": 50}},
                extra_headers={"Idempotency-Key": "sdk-call-1"})
        finally:
            await client.close()
        assert completion.choices[0].text == " tok" * 20
        decisions = [e["decision"] for e in s.proxy.log.events if e["ev"] == "attempt"]
        assert decisions[0] == "create" and "attach" in decisions[1:]
        assert s.stub.requests == 1  # one execution served every attempt of the call
        await s.settle()

    run(policy("coalescing"), test)
