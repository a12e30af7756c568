"""The proxy's bounds on what clients can make it hold, each refused with an OpenAI-style error that names
it, and call ids that never reach the decision log in clear (stub upstream, real HTTP on loopback)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fixtures.stack import ProxyStack, policy, run_stack
from fixtures.stub_upstream import StubUpstream

from retrybench.conditions.config import ProxyPolicy
from retrybench.serving.openai_api import MAX_CALL_ID_CHARS, call_digest

pytestmark = pytest.mark.live

Stack = ProxyStack[StubUpstream]
LIMITS = "retrybench_proxy_limit_refusals_total"


def run(chosen: ProxyPolicy, test: Callable[[Stack], Awaitable[None]], **settings: Any) -> None:
    run_stack(chosen, test, StubUpstream(), **settings)


def body(n: int = 5, **stub: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": [101, 102, 103, 104], "max_tokens": n, "stream": True, "stub": stub}


async def refused(s: Stack, payload: dict[str, Any], key: str | None, limit: str) -> str:
    """Post an attempt that must be refused at `limit`; its error message."""
    async with s.post(payload, key=key) as response:
        error = (await response.json())["error"]
    assert (response.status, error["code"], error["param"]) == (503, 503, limit), error
    assert response.headers["Retry-After"] == "1"
    message: str = error["message"]
    assert f"({limit})" in message
    return message


def test_an_idempotency_key_over_the_limit_is_a_400_that_names_the_header() -> None:
    async def test(s: Stack) -> None:
        async with s.post(body(2), key="k" * (MAX_CALL_ID_CHARS + 1)) as response:
            error = (await response.json())["error"]
        assert (response.status, error["param"]) == (400, "Idempotency-Key")
        assert f"over the limit of {MAX_CALL_ID_CHARS}" in error["message"]
        async with s.post(body(2), key="k" * MAX_CALL_ID_CHARS) as response:
            assert response.status == 200
            await response.read()
        assert s.upstream.requests == 1  # the refused attempt reached nothing
        await s.settle()

    run(policy("coalescing"), test)


def test_call_ids_and_api_keys_are_never_logged_in_clear() -> None:
    async def test(s: Stack) -> None:
        async with s.post(body(2), key="call-secret-4711", Authorization="Bearer sk-secret-0815") as response:
            await response.read()
        await s.settle()
        logged = json.dumps(s.proxy.log.events)
        assert "call-secret-4711" not in logged and "sk-secret-0815" not in logged
        (attempt,) = s.events("attempt")
        digest = call_digest("call-secret-4711")
        assert attempt["call_id"] == digest and digest in attempt["key"]

    run(policy("coalescing"), test)


def test_past_max_executions_a_new_attempt_gets_a_503_naming_it() -> None:
    async def test(s: Stack) -> None:
        slow = body(100, interval_ms=50)  # 5 s: both outlast the test's third attempt
        first, second = await s.post(slow, key="a").__aenter__(), await s.post(slow, key="b").__aenter__()
        await first.content.readuntil(b"\n\n")
        await second.content.readuntil(b"\n\n")
        message = await refused(s, body(2), "c", "max_executions")
        assert "holds 2 executions" in message
        assert await s.metric(LIMITS, limit="max_executions") == 1
        first.close()
        second.close()
        await s.settle()
        async with s.post(body(2), key="c") as response:  # room again
            assert response.status == 200
            await response.read()

    run(policy("retries-on-cancel-on"), test, max_executions=2)


def test_past_max_subscribers_a_retry_gets_a_503_and_the_others_their_stream() -> None:
    async def test(s: Stack) -> None:
        payload = body(40, interval_ms=50)
        first = await s.post(payload, key="call-1").__aenter__()
        await first.content.readuntil(b"\n\n")
        second = await s.post(payload, key="call-1").__aenter__()
        assert second.headers["X-Retrybench-Attached"] == "1"
        message = await refused(s, payload, "call-1", "max_subscribers")
        assert "has 2 subscribers" in message
        assert (await first.read()).endswith(b"data: [DONE]\n\n")
        assert (await second.read()).endswith(b"data: [DONE]\n\n")
        await s.settle()
        assert await s.metric(LIMITS, limit="max_subscribers") == 1
        assert s.upstream.requests == 1

    run(policy("coalescing"), test, max_subscribers=2)


def test_an_output_over_max_replay_bytes_is_not_kept_for_retries_nor_retained() -> None:
    async def test(s: Stack) -> None:
        payload = body(40, interval_ms=50)
        expected = await (await s.direct(payload).__aenter__()).read()
        first = await s.post(payload, key="call-1").__aenter__()
        got = b"".join([await first.content.readuntil(b"\n\n") for _ in range(3)])  # past the 200 bytes
        await refused(s, payload, "call-1", "max_replay_bytes")
        assert got + await first.read() == expected  # its own client gets everything
        await s.settle()
        assert s.proxy.retained == {}  # not kept for a late retry either
        assert await s.metric(LIMITS, limit="max_replay_bytes") == 1

    run(policy("coalescing-retain"), test, max_replay_bytes=200)
