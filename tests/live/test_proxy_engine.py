"""The live proxy in front of the engine server: what a policy decides must reach the engine.

Each test runs one event loop holding the engine server, the proxy and an aiohttp client, so every
request crosses real loopback sockets twice. The engine runs at a small time scale; the tests read
its state from /retrybench/engine and its core's per-request stats (the engine's rid is not the
proxy's execution id: a test finds its request as the newest rid once it was sent).

Nothing here depends on this machine's speed: a test waits for the state it needs (with a timeout
generous enough for a loaded machine, whose message says what was seen); where a request must still
be in a given state when the test acts (waiting, in prefill, streaming), the engine's time scale
keeps it there for a second or more of wall time; a policy's timers are checked on the proxy's own
clock, from its decision log.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures.openai_client import completion, fetch_engine_state, sse_events
from fixtures.proxy_scenarios import attempt, deferred_cancellation, retried_calls
from fixtures.stack import ProxyStack, policy, run_stack
from fixtures.waiting import until

from retrybench.analysis.conformance import replay
from retrybench.conditions.config import ProxyPolicy
from retrybench.engine.core import ExecutionStats
from retrybench.engine_server.engine_server import EngineServer, EngineServerSettings
from retrybench.records.tracefile import read_trace

pytestmark = pytest.mark.live

MODEL = "qwen2.5-7b-instruct"
PREFIX = list(range(2000))  # the shared prefix of every short prompt
LONG = 30_000  # tokens: four full prefill steps, time to act before the first token

Stack = ProxyStack[EngineServer]


def prompt(i: int) -> list[int]:
    """2,100 token ids: the shared prefix and a suffix of its own."""
    return PREFIX + [50_000 + 100 * i + j for j in range(100)]


def long_prompt(i: int) -> list[int]:
    return [100_000 + LONG * i + j for j in range(LONG)]


async def engine_state(s: Stack) -> dict[str, Any]:
    return await fetch_engine_state(s.session, s.upstream_url)


async def newest(s: Stack, seen: int) -> ExecutionStats:
    """The engine's stats of the request that arrives after `seen` requests."""
    stats = s.upstream.core.stats
    await until(lambda: len(stats) > seen, "the request to reach the engine", seen=lambda: len(stats))
    return stats[max(stats)]


def run(chosen: ProxyPolicy, test: Callable[[Stack], Awaitable[None]], **engine: Any) -> None:
    """`test` on the proxy in front of an engine server (time scale 0.05 unless given)."""
    engine.setdefault("time_scale", 0.05)
    run_stack(chosen, test, EngineServer(EngineServerSettings(model=MODEL, **engine)), seen=engine_state)


def texts(raw: bytes) -> list[str]:
    """The text of each streamed chunk, after checking that the stream ended with [DONE]."""
    events = sse_events(raw)
    assert events[-1] == "[DONE]", events[-3:]
    return [event["choices"][0]["text"] for event in events[:-1]]


# -- a client leaving -------------------------------------------------------------------------------


@pytest.mark.parametrize("cancel", [True, False], ids=["cancel-on", "cancel-off"])
@pytest.mark.parametrize("moment", ["waiting", "prefill", "mid_stream"])
def test_a_client_leaving_aborts_the_engine_request_only_with_cancellation(moment: str, cancel: bool,
                                                                           tmp_path: Path) -> None:
    """Cancellation on: the abort reaches the engine wherever the request was (queued in the engine,
    in prefill, streaming), before the request could end otherwise (seconds later). Off: the engine
    runs it to completion for nobody.

    The engine runs in real time (time scale 1), so that each state lasts a second or more of wall
    time: two 30,000-token prefills ahead keep a request waiting for 2 s, a 30,000-token prefill
    takes 1 s, and a reply streams a token each 5.5 ms."""
    trace_path = tmp_path / "trace.jsonl"
    result: dict[str, int] = {}

    async def test(s: Stack) -> None:
        holders = []
        if moment == "waiting":  # two long prefills ahead of it keep the next request waiting
            for i in range(2):
                holders.append(await s.direct(completion(long_prompt(i), 2000)).__aenter__())
            await newest(s, 1)
        seen = len(s.upstream.core.stats)
        tokens = 2000 if cancel else 20 if moment == "prefill" else 300  # with cancellation: it would run 11 s
        payload = completion(long_prompt(9) if moment == "prefill" else prompt(0), tokens)
        response = await s.post(payload, key="call-1").__aenter__()
        assert response.status == 200
        mine = await newest(s, seen)
        result["rid"] = mine.rid
        if moment == "waiting":
            assert mine.first_scheduled_s is None and (await engine_state(s))["waiting"] >= 1
        elif moment == "prefill":
            await until(lambda: mine.first_scheduled_s is not None, "its prefill to start")
            assert mine.first_token_s is None
        else:
            for _ in range(3):
                await response.content.readuntil(b"\n\n")
            assert mine.finished_s is None
        before = await engine_state(s)
        left = time.monotonic()
        response.close()
        if cancel:
            state: dict[str, Any] = {}

            async def gone() -> bool:  # by the abort, or by finishing
                state.update(await engine_state(s))
                return bool(state["live"] < before["live"])

            await until(gone, "the request to leave the engine", seen=lambda: state)
            assert state["aborted"] == before["aborted"] + 1 and state["pending"] == before["pending"] - 1, (
                f"{time.monotonic() - left:.3f} s after the client left, the request left the engine without an "
                f"abort: before {before}, after {state}")
            counts = {"waiting": "waiting", "prefill": "running", "mid_stream": "running"}[moment]
            assert state[counts] < before[counts], (before, state)
            assert mine.abort_requested_s is not None and mine.finished_s is None
            await s.settle()
            assert await s.metric("retrybench_proxy_executions_total", fate="cancelled") == 1
        for holder in holders:
            holder.close()
        if not cancel:
            await until(lambda: mine.finished_s is not None, "the orphan to finish",
                        seen=lambda: f"{s.upstream.core.output_tokens(mine.rid)} of {tokens} tokens")
            assert mine.abort_requested_s is None
            await s.settle()
            assert await s.metric("retrybench_proxy_executions_total", fate="orphaned") == 1
            assert await s.metric("retrybench_proxy_executions_total", fate="cancelled") == 0

    chosen = policy("retries-on-cancel-on" if cancel else "retries-on-cancel-off")
    run(chosen, test, time_scale=1.0, trace_path=trace_path)
    _, events = read_trace(trace_path)
    kinds = [e["event"] for e in events if e.get("execution") == result["rid"]]
    assert ("abort_requested" in kinds) == cancel and ("finished" in kinds) == (not cancel)
    if cancel and moment != "mid_stream":
        assert "first_token" not in kinds  # aborted before it produced anything


# -- coalescing and deferral ------------------------------------------------------------------------


def test_a_retry_with_the_same_key_attaches_and_gets_the_whole_output() -> None:
    payload = completion(prompt(1), 300)  # 1.7 s at time scale 1: the retry comes within milliseconds

    async def test(s: Stack) -> None:
        async with s.post(payload, key="unbroken") as response:
            unbroken = texts(await response.read())
        seen = len(s.upstream.core.stats)
        first = await s.post(payload, key="call-1").__aenter__()
        assert first.headers["X-Retrybench-Attached"] == "0"
        await first.content.readuntil(b"\n\n")
        first.close()  # its client timed out; cancellation is off, so the execution runs on
        await s.logged("left", attempt=0, call=1)  # the proxy saw it leave: the retry attaches to an orphan
        async with s.post(payload, key="call-1") as retry:
            assert retry.headers["X-Retrybench-Attached"] == "1"
            assert retry.headers["X-Retrybench-Execution"] == first.headers["X-Retrybench-Execution"]
            attached = texts(await retry.read())
        assert "".join(attached) == "".join(unbroken) == " tok" * 300
        assert len(attached) == len(unbroken)  # replayed from the first chunk, then live
        assert len(s.upstream.core.stats) == seen + 1  # both attempts were served by one engine request
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="attached") == 1

    run(policy("coalescing"), test, time_scale=1.0)


def test_deferred_cancellation_aborts_after_w_only_when_nobody_reattached() -> None:
    """The timers are checked on the proxy's clock, from its decision log (when each attempt left,
    when each timer fell due), whatever this machine's speed made of the wall time in between."""
    w = 1.0

    async def test(s: Stack) -> None:
        stats = s.upstream.core.stats
        # 33 s at time scale 0.2: longer than the test
        await deferred_cancellation(s, completion(prompt(2), 30_000), w,
                                    untouched=lambda: all(r.abort_requested_s is None for r in stats.values()))
        mine = await newest(s, 0)
        await until(lambda: mine.abort_requested_s is not None, "the deferred cancellation to reach the engine",
                    seen=lambda: s.proxy.log.events[-3:])
        assert len(s.upstream.core.stats) == 1 and mine.finished_s is None
        await s.settle()

    run(policy("deferred-cancellation", defer_s=w), test, time_scale=0.2)


# -- refusals ---------------------------------------------------------------------------------------


def test_a_retry_beyond_the_budget_gets_429_and_never_reaches_the_engine() -> None:
    async def test(s: Stack) -> None:
        payload = completion(prompt(3), 5, stream=False)
        async with s.post(payload, key="call-1") as first:
            assert first.status == 200
            assert len((await first.json())["choices"][0]["text"].split()) == 5
        async with s.post(payload, key="call-1") as retry:
            assert retry.status == 429
            assert int(retry.headers["Retry-After"]) >= 1
            assert (await retry.json())["error"]["type"] == "RateLimitError"
        assert len(s.upstream.core.stats) == 1
        assert (await engine_state(s))["successes"] == 1
        assert await s.metric("retrybench_proxy_decisions_total", decision="refused_429") == 1

    run(policy("retry-budget-cancel-on"), test)


def test_the_engines_queue_cap_503_passes_through_in_both_forms() -> None:
    async def test(s: Stack) -> None:
        holder = await s.direct(completion(prompt(4), 30_000)).__aenter__()  # 8 s at time scale 0.05
        await newest(s, 0)
        async with s.post(completion(prompt(5), 5, stream=False)) as plain:
            assert plain.status == 503
            error = (await plain.json())["error"]
        assert error["code"] == 503 and error["type"] == "ServiceUnavailableError"
        async with s.post(completion(prompt(6), 5)) as streamed:
            assert streamed.status == 200  # vLLM refuses a stream inside it: an SSE error event
            events = sse_events(await streamed.read())
        assert events[0]["error"]["code"] == 503 and events[1:] == ["[DONE]"]
        holder.close()
        await s.settle()
        assert s.upstream.refused == 2
        assert await s.metric("retrybench_proxy_executions_total", fate="refused") == 2
        assert await s.metric("retrybench_proxy_executions_total", fate="completed") == 0

    run(policy("no-control"), test, max_num_queued_reqs=1)


# -- conformance ------------------------------------------------------------------------------------


def test_the_decision_log_of_a_mixed_workload_replays_with_the_same_decisions() -> None:
    """A dozen concurrent calls, half leaving early and retried with their key, then one left alone:
    the simulator's core, fed the live log, decides the same creates, attaches and cancellations."""
    w = 1.0
    chosen = policy("deferred-cancellation", defer_s=w)

    async def test(s: Stack) -> None:
        # Six of twelve calls leave early (their executions stream on for over a second) and retry at once.
        bodies = await retried_calls(s, 12, lambda i, n: completion(prompt(10 + i), n), short=20, long=1000)
        assert all(len(texts(body)) > 1 for body in bodies)
        # One call left alone (over 3 s of stream): cancelled W after it left.
        await attempt(s, completion(prompt(109), 3000), "call-99", leave_after_events=1)
        await until(lambda: s.upstream.aborts == 1, "call 99's deferred cancellation to reach the engine",
                    seen=lambda: s.proxy.log.events[-3:])
        await s.settle()
        checked, mismatches = replay(chosen, s.proxy.log.events)
        assert mismatches == []
        assert (checked.get("create"), checked.get("attach"), checked.get("cancel")) == (13, 6, 1), checked
        assert len(s.upstream.core.stats) == 13 and s.upstream.aborts == 1

    run(chosen, test, time_scale=0.2)
