"""Deadline propagation in the live proxy (beyond the paper): the proxy reads each attempt's deadline from
its headers, drops a queued execution and cancels a running one once that deadline passes, refuses at
admission what it estimates cannot finish in time, and forwards the time left upstream.

As in test_proxy_engine.py, nothing depends on this machine's speed: a test waits for the state it needs
with a generous timeout; the engine runs in real time (time scale 1) where a request must still hold its
state when the deadline falls (an 11-s reply against a deadline of a second or less)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fixtures.openai_client import completion, fetch_engine_state
from fixtures.stack import ProxyStack, policy, run_stack
from fixtures.stub_upstream import StubUpstream
from fixtures.waiting import until

from retrybench.analysis.conformance import replay
from retrybench.conditions.config import ProxyPolicy
from retrybench.engine_server.engine_server import EngineServer, EngineServerSettings

pytestmark = [pytest.mark.live, pytest.mark.beyond]

MODEL = "qwen2.5-7b-instruct"
Stack = ProxyStack[EngineServer]


def prompt(i: int) -> list[int]:
    return list(range(2000)) + [50_000 + 100 * i + j for j in range(100)]


async def engine_state(s: Stack) -> dict[str, Any]:
    return await fetch_engine_state(s.session, s.upstream_url)


def run(chosen: ProxyPolicy, test: Callable[[Stack], Awaitable[None]]) -> None:
    run_stack(chosen, test, EngineServer(EngineServerSettings(model=MODEL, time_scale=1.0)), seen=engine_state)


def test_a_queued_execution_is_dropped_at_its_deadline_and_never_reaches_the_engine() -> None:
    async def test(s: Stack) -> None:
        stats = s.upstream.core.stats
        holder = await s.post(completion(prompt(0), 2000), key="holder").__aenter__()  # 11 s, no deadline
        await until(lambda: len(stats) == 1, "the holder to reach the engine", seen=lambda: len(stats))
        async with s.post(completion(prompt(1), 50), key="late", **{"Request-Timeout-Ms": "300"}) as late:
            assert late.status == 503  # queued behind the cap until its deadline, then answered
            assert "deadline passed" in (await late.json())["error"]["message"]
        dropped = await s.logged("deadline")
        assert ["drop", dropped["execution"]] in dropped["actions"]
        assert len(stats) == 1  # only the holder ever reached the engine
        assert (await engine_state(s))["pending"] == 1
        holder.close()
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="dropped") == 1
        checked, mismatches = replay(chosen, s.proxy.log.events)  # the core replayed from the log agrees
        assert mismatches == [] and checked.get("drop") == 1, checked

    chosen = policy("deadline-propagation", max_outstanding=1, cancellation="immediate")
    run(chosen, test)


def test_a_call_that_cannot_finish_in_time_is_refused_at_admission_at_once() -> None:
    async def test(s: Stack) -> None:
        # With nothing observed the proxy's estimate of the first token is a second: 100 ms cannot do.
        async with s.post(completion(prompt(2), 50), key="hopeless", **{"Request-Timeout-Ms": "100"}) as refused:
            assert refused.status == 503
            assert "deadline" in (await refused.json())["error"]["message"]
        attempt = (await s.logged("attempt", call=0))  # the proxy's first call
        assert attempt["decision"] == "refuse" and attempt["status"] == 503
        assert len(s.upstream.core.stats) == 0  # refused before anything reached the engine
        async with s.post(completion(prompt(3), 5), key="timely", **{"Request-Timeout-Ms": "600000"}) as timely:
            assert timely.status == 200
            await timely.read()
        assert len(s.upstream.core.stats) == 1
        assert s.proxy.core.counts.deadline_admission_refused == 1
        await s.settle()

    run(policy("deadline-admission"), test)


def test_a_running_execution_is_cancelled_at_its_deadline_with_cancellation_off() -> None:
    async def test(s: Stack) -> None:
        stats = s.upstream.core.stats
        async with s.post(completion(prompt(4), 2000), key="slow", **{"Request-Timeout-Ms": "1000"}) as slow:
            assert slow.status == 200  # the client stays connected: only the deadline can end it
            await until(lambda: len(stats) == 1, "the request to reach the engine", seen=lambda: len(stats))
            mine = stats[max(stats)]
            body = await slow.read()
        assert b"the call's deadline passed" in body  # its stream ends with an error event, as vLLM's do
        cancelled = await s.logged("deadline")
        assert cancelled["actions"] == [["cancel", cancelled["execution"]]]
        await until(lambda: mine.abort_requested_s is not None, "the abort to reach the engine")
        assert mine.finished_s is None
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="cancelled") == 1
        checked, mismatches = replay(chosen, s.proxy.log.events)
        assert mismatches == [] and checked.get("cancel") == 1, checked

    chosen = policy("deadline-propagation")
    run(chosen, test)


def test_the_time_left_is_forwarded_and_a_bad_header_refused() -> None:
    async def test(s: ProxyStack[StubUpstream]) -> None:
        async with s.post(completion(prompt(5), 3), key="told", **{"x-stainless-timeout": "600"}) as told:
            assert told.status == 200
            await told.read()
        async with s.post(completion(prompt(6), 3), key="silent") as silent:
            await silent.read()
        forwarded, none = s.upstream.timeouts_ms
        assert none is None and forwarded is not None and 590_000 < int(forwarded) <= 600_000
        async with s.post(completion(prompt(7), 3), key="bad", **{"Request-Timeout-Ms": "soon"}) as bad:
            assert bad.status == 400
            error = json.loads(await bad.read())["error"]
            assert error["param"] == "Request-Timeout-Ms" and "must be a number of milliseconds" in error["message"]
        assert s.upstream.requests == 2
        await s.settle()

    run_stack(policy("deadline-propagation"), test, StubUpstream())
