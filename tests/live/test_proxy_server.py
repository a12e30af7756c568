"""The live proxy against a minimal streaming upstream: relay, cancellation, coalescing, refusals, bad input.

Each test runs one event loop holding the stub upstream, the proxy and an aiohttp client
(fixtures/stack.py), so what crosses the sockets is real HTTP on loopback.

Nothing here depends on this machine's speed: a test waits for the state it needs (with a timeout
generous enough for a loaded machine, whose message says what was seen), streams outlast the test
by seconds, and a policy's timers are checked on the proxy's own clock, from its decision log.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fixtures.proxy_scenarios import attempt, deferred_cancellation, retried_calls
from fixtures.stack import External, ProxyStack, policy, run_stack
from fixtures.stub_upstream import StubUpstream
from fixtures.waiting import until

from retrybench.analysis.conformance import replay
from retrybench.conditions.config import ProxyPolicy
from retrybench.proxy.whole_chunks import RELAY_IMPLEMENTATION

pytestmark = pytest.mark.live

Stack = ProxyStack[StubUpstream]


def run(chosen: ProxyPolicy, test: Callable[[Stack], Awaitable[None]], **settings: Any) -> None:
    run_stack(chosen, test, StubUpstream(), **settings)


def body(n: int = 5, stream: bool = True, **stub: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": [101, 102, 103, 104], "max_tokens": n, "stream": stream, "stub": stub}


async def direct_bytes(s: Stack, payload: dict[str, Any]) -> bytes:
    """What the upstream sends for `payload` without the proxy."""
    async with s.direct(payload) as response:
        raw: bytes = await response.read()
    return raw


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
    # The upstream would stream for 10 s more (its first token 10 s away, or 500 chunks 20 ms apart):
    # the disconnect must reach it first, however slow the machine.
    async def test(s: Stack) -> None:
        payload = body(500, interval_ms=20, first_delay_ms=10_000 if moment == "before_first_token" else 0)
        response = await s.post(payload, key="c1").__aenter__()
        assert response.status == 200
        if moment == "mid_stream":
            await response.content.readuntil(b"\n\n")
        else:
            await until(lambda: s.upstream.open_streams == 1, "the upstream stream to open")
        response.close()  # the client leaves: its connection closes
        took = await until(lambda: s.upstream.disconnects or s.upstream.completed, "the upstream stream to end")
        assert (s.upstream.disconnects, s.upstream.completed) == (1, 0), (
            f"the upstream stream ended {took:.3f} s after the client left with {s.upstream.disconnects} disconnects "
            f"and {s.upstream.completed} completed: the client's leaving did not reach it")
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="cancelled") == 1

    run(policy("retries-on-cancel-on"), test)


def test_a_cancelled_execution_is_freed_without_the_cyclic_collector() -> None:
    # The cancelled task's traceback holds the frame that holds the relay; a relay that kept its task (or
    # its connection, which holds it back) would wait for a full collection, which the serving GC
    # thresholds make rare: thousands of clients leaving at once then grow the proxy by megabytes.
    async def test(s: Stack) -> None:
        response = await s.post(body(500, interval_ms=20), key="c1").__aenter__()
        await response.content.readuntil(b"\n\n")
        relay = weakref.ref(next(iter(s.proxy.relays.values())))
        gc.disable()  # only reference counting frees it now
        try:
            response.close()
            await until(lambda: s.upstream.disconnects == 1, "the upstream stream to end")
            await s.settle()
            assert relay() is None, "the cancelled execution's relay is only freed by the cyclic collector"
        finally:
            gc.enable()

    run(policy("retries-on-cancel-on"), test)


def test_with_cancellation_off_a_left_execution_runs_on_as_an_orphan() -> None:
    async def test(s: Stack) -> None:
        response = await s.post(body(10, interval_ms=10), key="c1").__aenter__()
        await response.content.readuntil(b"\n\n")
        response.close()
        await until(lambda: s.upstream.completed == 1, "the orphan to finish")
        await s.settle()
        assert s.upstream.disconnects == 0
        assert await s.metric("retrybench_proxy_executions_total", fate="orphaned") == 1

    run(policy("retries-on-cancel-off"), test)


def test_a_queued_execution_whose_client_left_is_dropped_before_the_engine() -> None:
    async def test(s: Stack) -> None:
        holder = await s.post(body(1000, interval_ms=20), key="hold").__aenter__()  # 20 s: it holds the one slot
        await holder.content.readuntil(b"\n\n")
        queued = asyncio.ensure_future(s.post(body(3), key="queued").__aenter__())
        await until(lambda: s.proxy.core.waiting == 1, "the second execution to queue",
                    seen=lambda: f"{s.proxy.core.waiting} waiting, {len(s.proxy.relays)} executions")
        assert await s.metric("retrybench_proxy_queue_depth") == 1
        queued.cancel()  # the client gives up while its execution waits in the proxy's queue
        await until(lambda: s.proxy.core.waiting == 0, "the drop")
        holder.close()
        await s.settle()
        assert s.upstream.requests == 1  # the dropped execution never reached the upstream
        assert await s.metric("retrybench_proxy_executions_total", fate="dropped") == 1

    run(policy("proxy-cap", max_outstanding=1), test)


def test_a_queued_execution_dispatched_and_left_in_one_instant_is_ended() -> None:
    """The holder leaves, which dispatches the queued execution, and the queued call's client leaves in
    the same loop iteration, before the dispatched execution's task first ran: it must end all the same
    (a storm of resets does this)."""
    async def test(s: Stack) -> None:
        holder = await s.post(body(1000, interval_ms=20), key="hold").__aenter__()
        await holder.content.readuntil(b"\n\n")
        queued = asyncio.ensure_future(s.post(body(3), key="queued").__aenter__())
        await until(lambda: s.proxy.core.waiting == 1, "the second execution to queue",
                    seen=lambda: f"{s.proxy.core.waiting} waiting, {len(s.proxy.relays)} executions")
        holder_key, queued_key = (0, 0), (1, 0)  # (call, attempt): the holder's call came first
        s.proxy._left(holder_key)  # dispatches the queued execution: its task is created, not yet run
        s.proxy._left(queued_key)  # ... and cancelled before it runs
        assert [e["actions"] for e in s.events("left")] == [[["cancel", 0], ["dispatch", 1]], [["cancel", 1]]]
        holder.close()
        queued.cancel()
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="cancelled") == 2

    run(policy("proxy-cap", max_outstanding=1), test)

# -- coalescing and deferral ------------------------------------------------------------------------


def test_a_retry_attaches_to_its_calls_live_execution_and_gets_the_whole_output() -> None:
    async def test(s: Stack) -> None:
        payload = body(100, interval_ms=20)  # 2 s: the retry comes within milliseconds
        expected_bytes = asyncio.ensure_future(direct_bytes(s, payload))
        first = await s.post(payload, key="call-1").__aenter__()
        await first.content.readuntil(b"\n\n")
        first.close()  # the first attempt times out; cancellation is off, so the execution lives on
        await s.logged("left", call=0, attempt=0)  # the proxy saw it leave: the retry attaches to an orphan
        assert s.proxy.relays, "the execution ended before its retry came"
        async with s.post(payload, key="call-1") as retry:
            assert retry.headers["X-Retrybench-Attached"] == "1"
            assert retry.headers["X-Retrybench-Execution"] == first.headers["X-Retrybench-Execution"]
            got = await retry.read()
        expected = await expected_bytes
        assert got == expected  # replayed from the start, then live
        assert s.upstream.requests == 2  # the direct request and the one execution
        async with s.post({**payload, "max_tokens": 3}, key="call-1") as changed:
            assert changed.headers["X-Retrybench-Attached"] == "0"  # a different body never attaches
            await changed.read()
        await s.settle()
        assert await s.metric("retrybench_proxy_decisions_total", decision="attached") == 1
        assert await s.metric("retrybench_proxy_executions_total", fate="attached") == 1

    run(policy("coalescing"), test)


def test_deferred_cancellation_cancels_after_w_only_when_nobody_reattached() -> None:
    """The timers are checked on the proxy's clock, from its decision log (when each attempt left,
    when each timer fell due), whatever this machine's speed made of the wall time in between."""
    w = 1.0

    async def test(s: Stack) -> None:
        # 30 s of stream: longer than the test
        await deferred_cancellation(s, body(3000, interval_ms=10), w, untouched=lambda: s.upstream.disconnects == 0)
        took = await until(lambda: s.upstream.disconnects or s.upstream.completed, "the upstream stream to end")
        assert (s.upstream.disconnects, s.upstream.completed) == (1, 0), (
            f"{took:.3f} s after the cancellation the upstream had {s.upstream.disconnects} disconnects and "
            f"{s.upstream.completed} completed streams")
        await s.settle()

    run(policy("deferred-cancellation", defer_s=w), test)


def test_a_time_scale_stretches_the_policys_timers() -> None:
    """W = 10 policy seconds is 0.5 wall seconds at time scale 0.05: the cancellation comes at least
    0.5 s after the client left, and sooner than the 10 s an unscaled timer would take."""
    scale, w = 0.05, 10.0

    async def test(s: Stack) -> None:
        first = await s.post(body(2000, interval_ms=10), key="call-1").__aenter__()  # 20 s of stream
        await first.content.readuntil(b"\n\n")
        began = time.monotonic()
        first.close()
        left = await s.logged("left", call=0, attempt=0)
        await until(lambda: s.upstream.disconnects or s.upstream.completed, "the deferred cancellation (unscaled, it "
                    f"would take {w:.0f} s)", timeout_s=w, seen=lambda: s.proxy.log.events[-3:])
        took = time.monotonic() - began
        assert (s.upstream.disconnects, s.upstream.completed) == (1, 0), (s.upstream.disconnects, s.upstream.completed)
        assert took >= w * scale, f"cancelled {took:.3f} s after the client left: sooner than W = {w * scale} s"
        cancel = await s.logged("timer")
        assert cancel["t"] >= left["t"] + w, (left, cancel)  # in policy seconds, on the proxy's clock

    run(policy("deferred-cancellation", defer_s=w), test, time_scale=scale)


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
        assert s.upstream.requests == 1
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
        assert s.upstream.requests == 0
        assert await s.metric("retrybench_proxy_attempts_total") == 0
        async with s.post(body(2)) as ok:  # still serving
            assert ok.status == 200 and (await ok.read()).endswith(b"[DONE]\n\n")
        await s.settle()

    run(policy("no-control"), test, max_body_bytes=2048)


def test_an_unreachable_upstream_is_a_502() -> None:
    async def test(s: ProxyStack[External]) -> None:
        for stream in (True, False):
            async with s.post(body(2, stream=stream)) as response:
                assert response.status == 502
                assert (await response.json())["error"]["type"] == "BadGatewayError"
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="failed") == 2

    run_stack(policy("no-control"), test, External(f"http://127.0.0.1:{closed_port()}"))


def test_health_and_metrics() -> None:
    async def test(s: Stack) -> None:
        async with s.session.get(s.url + "/health") as health:
            assert health.status == 200
        assert await s.metric("retrybench_proxy_queue_depth") == 0
        assert await s.metric("retrybench_proxy_budget_ratio") == pytest.approx(0.1)
        assert await s.metric("retrybench_proxy_compiled_relay") == (RELAY_IMPLEMENTATION == "compiled")

    run(policy("retry-budget"), test)


# -- conformance ------------------------------------------------------------------------------------


def test_the_decision_log_replays_through_the_simulators_core_with_the_same_decisions() -> None:
    w = 1.0
    chosen = policy("deferred-cancellation", defer_s=w)

    async def test(s: Stack) -> None:
        # Three of six calls leave early (their executions stream for 2 s) and retry at once, within W.
        await retried_calls(s, 6, lambda i, n: body(n, interval_ms=5), short=20, long=400)
        # One call left alone (10 s of stream): cancelled W after it left.
        await attempt(s, body(2000, interval_ms=5), "call-9", leave_after_events=1)
        await until(lambda: any(e["actions"] for e in s.events("timer")), "call-9's deferred cancellation",
                    seen=lambda: s.proxy.log.events[-3:])
        await s.settle()
        checked, mismatches = replay(chosen, s.proxy.log.events)
        assert mismatches == []
        assert (checked.get("create"), checked.get("attach"), checked.get("cancel")) == (7, 3, 1), checked

    run(chosen, test)


# -- the official OpenAI SDK as a client ------------------------------------------------------------


def test_the_openai_sdks_own_retries_attach_to_the_live_execution() -> None:
    """Non-streaming: the SDK retries an attempt that timed out before its response. (A stream's
    headers arrive at once, so a slow stream fails mid-iteration, which the SDK does not retry.)"""
    openai = pytest.importorskip("openai")

    async def test(s: Stack) -> None:
        # The execution takes 4.2 s; the SDK's attempt timeout is 2.5 s, so its first attempt times out,
        # it backs off (0.375-0.5 s: 0.5 s less up to a quarter) and retries with the same body and the
        # caller's Idempotency-Key at 2.9-3.0 s; that attempt waits until 5.4-5.5 s. So the retry
        # finds the execution live, and gets its answer, with more than a second to spare either side.
        client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="tenant-a", timeout=2.5, max_retries=2)
        try:
            completion = await client.completions.create(
                model="m", prompt=[101, 102, 103], max_tokens=42, extra_body={"stub": {"interval_ms": 100}},
                extra_headers={"Idempotency-Key": "sdk-call-1"})
        finally:
            await client.close()
        assert completion.choices[0].text == " tok" * 42
        decisions = [e["decision"] for e in s.proxy.log.events if e["ev"] == "attempt"]
        assert decisions[0] == "create" and "attach" in decisions[1:], decisions
        assert s.upstream.requests == 1  # one execution served every attempt of the call
        await s.settle()

    run(policy("coalescing"), test)


# -- result retention -------------------------------------------------------------------------------


def test_a_retry_after_its_execution_completed_gets_the_retained_stream() -> None:
    """Coalescing alone would start the call again; with retention the response comes at once, byte
    for byte, under the same execution id, and only to the same tenant."""
    async def test(s: Stack) -> None:
        payload = body(20, interval_ms=10)
        expected = await direct_bytes(s, payload)
        first = await s.post(payload, key="call-1").__aenter__()
        await first.content.readuntil(b"\n\n")
        first.close()  # the attempt times out; cancellation is off, so the execution runs on for nobody
        await s.logged("end", fate="orphaned")
        async with s.post(payload, key="call-1") as retry:
            assert retry.headers["X-Retrybench-Retained"] == "1"
            assert retry.headers["X-Retrybench-Execution"] == first.headers["X-Retrybench-Execution"]
            got = await retry.read()
        assert got == expected
        async with s.post(payload, key="call-1", Authorization="Bearer tenant-b") as other:
            assert "X-Retrybench-Retained" not in other.headers  # another tenant's call: computed anew
            assert await other.read() == expected
        assert s.upstream.requests == 3  # the direct request, the call, tenant-b's call
        await s.settle()
        assert await s.metric("retrybench_proxy_decisions_total", decision="served_retained") == 1
        assert await s.metric("retrybench_proxy_results_retained_total") == 2
        assert await s.metric("retrybench_proxy_retained_results") == 2
        kept = [e["bytes"] for e in s.events("engine", kind="completed")]
        assert len(kept) == 2 and await s.metric("retrybench_proxy_retained_bytes") == sum(kept)
        checked, mismatches = replay(s.proxy.settings.policy, s.proxy.log.events)
        assert mismatches == [] and checked.get("served-retained") == 1, (checked, mismatches)

    run(policy("coalescing-retain"), test)


def test_time_to_first_token_is_counted_once_per_streamed_attempt_that_got_one() -> None:
    """The first attempt waits for the engine's first token; an attached retry and a retained answer get
    theirs from the replay. A whole (not streamed) response and an SSE error event count no first token."""
    ttft = "retrybench_proxy_time_to_first_token_seconds"

    async def test(s: Stack) -> None:
        payload = body(20, interval_ms=20, first_delay_ms=300)
        first = await s.post(payload, key="call-1").__aenter__()
        await first.content.readuntil(b"\n\n")
        async with s.post(payload, key="call-1") as attached:
            assert attached.headers["X-Retrybench-Attached"] == "1"
            await attached.read()
        await first.read()
        first.close()
        async with s.post(payload, key="call-1") as retained:
            assert retained.headers["X-Retrybench-Retained"] == "1"
            await retained.read()
        async with s.post(body(3, stream=False), key="call-2") as whole:
            await whole.read()
        async with s.post(body(3, sse_error=True), key="call-3") as refused:
            await refused.read()
        await s.settle()
        assert await s.metric(f"{ttft}_count") == 3
        assert await s.metric(f"{ttft}_sum") >= 0.3  # the first attempt's own wait, at least
        assert await s.metric(f"{ttft}_bucket", le="0.25") <= 2  # not the first attempt's

    run(policy("coalescing-retain"), test)


def test_a_whole_response_is_retained_and_expires() -> None:
    async def test(s: Stack) -> None:
        payload = body(3, stream=False)
        async with s.post(payload, key="call-1") as first:
            expected = await first.read()
        async with s.post(payload, key="call-1") as retry:
            assert retry.status == 200 and retry.headers["X-Retrybench-Retained"] == "1"
            assert await retry.read() == expected
        window_end = s.events("engine", kind="completed")[0]["t"] + 1.0
        await until(lambda: s.events("expire"), "the retained response to be released",
                    seen=lambda: f"proxy clock {s.proxy.now():.3f} s, window ends {window_end:.3f} s")
        assert s.events("expire")[0]["t"] >= window_end
        assert s.proxy.retained == {} and s.proxy.core.retained_bytes == 0
        async with s.post(payload, key="call-1") as late:
            assert "X-Retrybench-Retained" not in late.headers  # past the window: computed again
            await late.read()
        assert s.upstream.requests == 2
        await s.settle()

    run(policy("coalescing", retain_s=1.0), test)


@pytest.mark.parametrize("retain_s", [0.0, 30.0])
def test_the_openai_sdk_with_a_short_timeout_is_saved_by_retention(monkeypatch: pytest.MonkeyPatch,
                                                                    retain_s: float) -> None:
    """Two tenants call through the SDK (timeout 1 s, 6 retries) for a response that takes 5.5 s.
    With the SDK's jitter drawn as none, its attempts run over [0, 1], [1.5, 2.5], [3.5, 4.5],
    [6.5, 7.5] s...: the execution completes in the gap at 5.5 s with nobody subscribed. Without
    retention, the retry at 6.5 s finds nothing and computes the call again; with it, that retry
    gets the response, and each call is computed once."""
    openai = pytest.importorskip("openai")
    base_client = pytest.importorskip("openai._base_client")
    monkeypatch.setattr(base_client, "random", lambda: 0.0)  # the SDK's backoff without its jitter

    async def call(s: Stack, tenant: str) -> str:
        client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key=tenant, timeout=1.0, max_retries=6)
        try:
            completion = await client.completions.create(
                model="m", prompt=[101, 102, 103], max_tokens=55, extra_body={"stub": {"interval_ms": 100}},
                extra_headers={"Idempotency-Key": "call-42"})
        finally:
            await client.close()
        return str(completion.choices[0].text)

    async def test(s: Stack) -> None:
        texts = await asyncio.gather(call(s, "tenant-a"), call(s, "tenant-b"))
        assert list(texts) == [" tok" * 55] * 2
        decisions = [e["decision"] for e in s.events("attempt")]
        if retain_s:
            assert s.upstream.requests == 2, decisions  # each call computed once
            assert decisions.count("served-retained") == 2, decisions
        else:  # the measured failure: each call's answer computed for nobody, then computed again
            assert s.upstream.requests >= 4, decisions
            assert "served-retained" not in decisions
        await s.settle()

    run(policy("deferred-cancellation", retain_s=retain_s), test)


@pytest.mark.parametrize("name", ["retries-on-cancel-on", "coalescing"])
def test_a_client_that_closes_on_done_has_its_execution_counted_delivered(name: str) -> None:
    """Some load generators close the connection as soon as `data: [DONE]` arrives, before the body's
    last chunk: that client had the whole response, so the execution is completed, not orphaned (nor
    cancelled, with cancellation on), and the stream is not cut."""
    async def test(s: Stack) -> None:
        response = await s.post(body(5, end_delay_ms=3000), key="call-1").__aenter__()
        got = b""
        while not got.endswith(b"data: [DONE]\n\n"):
            got += await response.content.readany()
        response.close()
        await until(lambda: s.upstream.completed == 1, "the upstream to end the body",
                    seen=lambda: f"{s.upstream.disconnects} disconnects")
        await s.settle()
        assert s.upstream.disconnects == 0
        assert await s.metric("retrybench_proxy_executions_total", fate="completed") == 1
        assert await s.metric("retrybench_proxy_executions_total", fate="orphaned") == 0
        assert await s.metric("retrybench_proxy_executions_total", fate="cancelled") == 0

    run(policy(name), test)


def test_a_client_that_leaves_before_done_still_counts_as_leaving() -> None:
    async def test(s: Stack) -> None:
        response = await s.post(body(50, interval_ms=20), key="call-1").__aenter__()
        await response.content.readuntil(b"\n\n")
        response.close()  # mid-stream: it gave up
        await until(lambda: s.upstream.disconnects == 1, "the cancellation to reach the upstream")
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="cancelled") == 1

    run(policy("retries-on-cancel-on"), test)
