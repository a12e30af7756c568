"""The live proxy in front of a real vLLM (the CPU build, a tiny random-weight Llama).

What the engine server models, checked on the engine itself: a client's disconnect through the
proxy aborts the execution in vLLM; vLLM's prompt-token counter skips an execution aborted
before its first output while its admission counter does not (Finding 4's mechanism); coalescing
attaches a retry to the running execution and deferred cancellation keeps it alive for W; the
engine's queue cap refuses with 503 in both forms; and the tracing plugin's trace accounts for
every prompt token the admission counter saw.

Every test runs twice: against `vllm serve` as a process and against the vLLM image's container
(`runtime`; the container cases skip, with the fix, where Docker or the image is missing). One vLLM
of each serves the module (start-up takes 30-110 s on a CPU), traced by the plugin; the queue-cap
test starts its own with `--max-num-queued-reqs 1`. Each test runs the proxy in its own event
loop, so its state (relays, subscribers) can be read directly, as in test_proxy_engine.py.

Nothing here depends on this machine's speed: every test starts from an idle engine and leaves one
(`idle_engine`), waits for the state it needs rather than for a fixed time, and sizes the work that
must outlast its actions from the engine's speed, measured once per module (`speed`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.containers import RUNTIMES
from fixtures.openai_client import completion
from fixtures.proxy_scenarios import attempt
from fixtures.stack import External, ProxyStack, policy, run_stack
from fixtures.vllm_real import (
    EngineSpeed,
    RealVllm,
    gauges,
    measure_speed,
    prompt,
    read_trace_so_far,
    scrape,
    start_real_vllm,
    trace_until,
    unsettled,
    wait_idle,
)
from fixtures.waiting import GENEROUS_S, until

from retrybench.analysis.prompt_work import prompt_work
from retrybench.conditions.config import ClientPolicy, ProxyPolicy, WorkloadSpec
from retrybench.loadgen.loadgen import LoadgenSettings, LoadResult, run_load
from retrybench.records.runlog import REFUSED_503
from retrybench.traffic.workload import Call, Trace

pytestmark = [pytest.mark.vllm, pytest.mark.live, pytest.mark.xdist_group("vllm")]

PREFILL_LEFT_S = 2.0  # prefill still to run once admission shows: far above the abort's few ms to take effect
LONG_DECODE_S = 30.0  # an execution a test disconnects from: far longer than any test waits on it

Stack = ProxyStack[External]


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    """How vLLM runs: a process, or the vLLM image's container."""
    return str(request.param)


@pytest.fixture(scope="module")
def vllm(runtime: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    with start_real_vllm(tmp_path_factory.mktemp(f"vllm-{runtime}"), trace=True, runtime=runtime) as engine:
        yield engine


@pytest.fixture(scope="module")
def speed(vllm: RealVllm) -> EngineSpeed:
    return measure_speed(vllm)


@pytest.fixture(autouse=True)
def idle_engine(vllm: RealVllm) -> Iterator[None]:
    """Each test starts from an idle engine and must leave one: no work leaks into the next test."""
    wait_idle(vllm, "before the test")
    yield
    wait_idle(vllm, "after the test (it left work behind)")


def new_events(engine: RealVllm, first: int, condition: Callable[[list[dict[str, Any]]], bool],
               what: str) -> list[dict[str, Any]]:
    """The trace's events from index `first` on, once `condition` holds on them."""
    return trace_until(engine, lambda events: condition(events[first:]), what)[first:]


def ended(events: list[dict[str, Any]]) -> bool:
    """Some execution was queued, and every one queued has finished or been aborted."""
    return any(e["event"] == "queued" for e in events) and not unsettled(events)


async def engine_metrics(s: Stack) -> dict[str, float]:
    return await asyncio.to_thread(scrape, s.upstream_url)


async def until_engine(s: Stack, busy: bool, what: str) -> float:
    """Wait for vLLM's running + waiting gauges to be non-zero (busy) or zero; return how long."""
    seen: dict[str, float] = {}

    async def holds() -> bool:
        seen.update(await asyncio.to_thread(gauges, s.upstream_url))
        return (sum(seen.values()) > 0) == busy

    return await until(holds, what, seen=lambda: seen)


def run(engine: RealVllm, chosen: ProxyPolicy, test: Callable[[Stack], Awaitable[None]]) -> None:
    run_stack(chosen, test, External(engine.url))


def executions(events: list[dict[str, Any]]) -> dict[int, str]:
    """Execution number -> vLLM request id, for every execution the trace shows queued."""
    return {e["execution"]: e["request_id"] for e in events if e["event"] == "queued"}


def fates(events: list[dict[str, Any]]) -> dict[int, str]:
    """Execution number -> 'finished' or 'aborted', for every execution that ended."""
    return {e["execution"]: e["event"] for e in events if e["event"] in ("finished", "aborted")}


# -- aborts -----------------------------------------------------------------------------------------


def test_a_disconnect_through_the_proxy_aborts_the_execution_in_vllm(
        vllm: RealVllm, speed: EngineSpeed, record_property: Callable[[str, object], None]) -> None:
    first = len(read_trace_so_far(vllm))
    max_tokens = speed.decode_tokens_for(LONG_DECODE_S)
    took: list[float] = []

    async def test(s: Stack) -> None:
        response = await s.post(completion(prompt(64), max_tokens)).__aenter__()
        await response.content.readuntil(b"\n\n")  # the first token: it is running
        await until_engine(s, busy=True, what="vLLM's gauges to show the execution")
        response.close()
        took.append(await until_engine(s, busy=False, what="vLLM's gauges to drop after the disconnect"))
        await s.settle()
        assert await s.metric("retrybench_proxy_executions_total", fate="cancelled") == 1

    run(vllm, policy("retries-on-cancel-on"), test)
    record_property("abort_after_disconnect_s", round(took[0], 4))
    events = new_events(vllm, first, ended, "the execution's end in the trace")
    assert list(fates(events).values()) == ["aborted"], (
        f"the execution was not aborted ({fates(events)}); the gauges dropped {took[0]:.3f} s after the "
        f"disconnect, and it had about {LONG_DECODE_S:.0f} s of decoding left ({speed.describe()})")
    last = next(e for e in events if e["event"] == "aborted")
    assert last["computed_prompt_tokens"] == 64 and last["unscheduled"] is False


def prefill_to_abort(speed: EngineSpeed) -> int:
    """Prompt tokens whose prefill outlasts its first step (when admission shows on the gauges) by
    PREFILL_LEFT_S at the measured speed, within the model's context."""
    steps = 1 + math.ceil(PREFILL_LEFT_S / speed.step_prefill_s)
    return min(steps * speed.max_num_batched_tokens, speed.max_model_len - 64)


def test_an_abort_before_the_first_output_is_missed_by_the_prompt_counter_but_not_by_admission(
        vllm: RealVllm, speed: EngineSpeed) -> None:
    """Finding 4's mechanism: vllm:prompt_tokens_total grows at the first output token, so an
    execution aborted in prefill never counts; vllm:prefix_cache_queries_total grows at admission."""
    tokens = prefill_to_abort(speed)
    first = len(read_trace_so_far(vllm))
    before: dict[str, float] = {}
    after: dict[str, float] = {}

    async def test(s: Stack) -> None:
        before.update(await engine_metrics(s))
        response = await s.post(completion(prompt(tokens), 50)).__aenter__()
        await until_engine(s, busy=True, what="the execution to be admitted")
        response.close()
        await until_engine(s, busy=False, what="the abort")
        after.update(await engine_metrics(s))
        await s.settle()

    run(vllm, policy("retries-on-cancel-on"), test)
    events = new_events(vllm, first, ended, "the execution's end in the trace")
    first_tokens = {e["execution"] for e in events if e["event"] == "first_token"}
    aborted = [e for e in events if e["event"] == "aborted"]
    assert aborted and not first_tokens, (
        f"the {tokens}-token prefill reached its first output before the abort took effect, so this run "
        f"cannot show the counter's rule (sized for {PREFILL_LEFT_S} s of prefill after the first step: "
        f"{speed.describe()}); the trace's fates: {fates(events)}")
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == tokens
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 0


def test_a_completed_execution_counts_its_whole_prompt_once(vllm: RealVllm) -> None:
    tokens = 500
    counts: list[dict[str, float]] = []

    async def test(s: Stack) -> None:
        counts.append(await engine_metrics(s))
        async with s.post(completion(prompt(tokens), 8, stream=False)) as response:
            assert response.status == 200
            usage = (await response.json())["usage"]
        assert usage["prompt_tokens"] == tokens and usage["completion_tokens"] == 8
        await until_engine(s, busy=False, what="the execution to leave vLLM's gauges")
        counts.append(await engine_metrics(s))

    run(vllm, policy("retries-on-cancel-on"), test)
    before, after = counts
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == tokens
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == tokens


# -- coalescing and deferral ------------------------------------------------------------------------


def test_coalescing_attaches_a_retry_to_the_execution_still_running(vllm: RealVllm, speed: EngineSpeed) -> None:
    first = len(read_trace_so_far(vllm))

    async def test(s: Stack) -> None:
        payload = completion(prompt(64), speed.decode_tokens_for(5.0))  # a few seconds of decoding
        response = await s.post(payload, key="call-coalesce").__aenter__()
        await response.content.readuntil(b"\n\n")
        response.close()  # the client's deadline: it gives up and retries at once
        async with s.post(payload, key="call-coalesce") as retry:
            assert retry.headers["X-Retrybench-Attached"] == "1"
            body = await retry.read()
        assert body.rstrip().endswith(b"data: [DONE]")
        assert await s.metric("retrybench_proxy_decisions_total", decision="attached") == 1
        assert await s.metric("retrybench_proxy_executions_total", fate="completed") == 1
        await s.settle()

    run(vllm, policy("coalescing"), test)
    events = new_events(vllm, first, ended, "the execution's end in the trace")
    assert len(executions(events)) == 1, f"the retry reached vLLM as an execution of its own: {fates(events)}"


def test_deferred_cancellation_keeps_the_execution_alive_for_w(vllm: RealVllm, speed: EngineSpeed) -> None:
    """The deferral is checked on the proxy's clock (when the client left, when the timer cancelled)
    and, as a lower bound, on the wall clock: a slow machine only makes both gaps longer."""
    w = 1.0
    first = len(read_trace_so_far(vllm))
    took: list[float] = []

    async def test(s: Stack) -> None:
        response = await s.post(completion(prompt(64), speed.decode_tokens_for(LONG_DECODE_S)),
                                key="call-defer").__aenter__()
        await response.content.readuntil(b"\n\n")
        response.close()
        closed = time.monotonic()
        left = await s.logged("left", call=0, attempt=0)
        busy = sum((await asyncio.to_thread(gauges, s.upstream_url)).values()) > 0
        if not s.events("timer"):  # read before the deferral ran out: the execution must still be there
            assert busy, "vLLM dropped the execution within W, before the proxy cancelled it"
        await until_engine(s, busy=False, what="the deferred abort")
        took.append(time.monotonic() - closed)
        cancel = await s.logged("timer")
        assert cancel["actions"] == [["cancel", cancel["execution"]]], cancel
        after = cancel["t"] - left["t"]
        assert after >= w, f"cancelled {after:.3f} s after the client left (proxy clock): sooner than W = {w} s"
        await s.settle()

    run(vllm, policy("deferred-cancellation", defer_s=w), test)
    assert took[0] >= w, f"vLLM aborted {took[0]:.3f} s after the disconnect, before W = {w} s"
    events = new_events(vllm, first, ended, "the execution's end in the trace")
    assert list(fates(events).values()) == ["aborted"], (
        f"the execution was not cancelled after W = {w} s ({fates(events)}; the gauges dropped {took[0]:.3f} s "
        f"after the disconnect, with about {LONG_DECODE_S:.0f} s of decoding left: {speed.describe()})")


# -- the engine's queue cap -------------------------------------------------------------------------


def test_the_engines_queue_cap_503_reaches_the_client_in_both_forms(tmp_path: Path, speed: EngineSpeed,
                                                                    runtime: str) -> None:
    """vLLM refuses past --max-num-queued-reqs; the proxy passes the refusal on, and the paper's
    client (the load generator) records each attempt as refused with 503 and retries it. A refusal may
    take seconds to come back on a loaded machine, so an attempt waits GENEROUS_S for it and the
    holder decodes for as long as the model's context allows (it is aborted at the end)."""
    client = ClientPolicy(max_retries=1, attempt_timeout_s=GENEROUS_S, backoff_min_s=0.1, backoff_max_s=0.1)
    results: dict[bool, LoadResult] = {}

    async def test(s: Stack) -> None:
        holder = await s.direct(completion(prompt(64), speed.longest_decode())).__aenter__()
        await until_engine(s, busy=True, what="the holder to run")
        for stream in (False, True):
            calls = tuple(Call(index=i, call_id=f"cap-{stream}-{i}", arrival_s=0.01 * i, prompt_tokens=40,
                               response_tokens=4, phase="base") for i in range(2))
            trace = Trace(spec=WorkloadSpec(chat_calls_per_s=1.0), seed=0, calls=calls)
            results[stream] = await run_load(trace, LoadgenSettings(target=s.url, client=client, stream=stream))
        holder.close()
        await s.settle()
        await until_engine(s, busy=False, what="the holder's abort")
        assert await s.metric("retrybench_proxy_executions_total", fate="refused") == 8

    with start_real_vllm(tmp_path, extra_args=["--max-num-queued-reqs", "1"], runtime=runtime) as capped:
        wait_idle(capped, "before the test")
        run(capped, policy("no-control"), test)
    for stream, result in results.items():
        outcomes = [a.outcome for a in result.attempts]
        took = [round(a.ended_s - a.sent_s, 3) for a in result.attempts]
        assert outcomes == [REFUSED_503] * 4, f"stream={stream}: {outcomes} after {took} s"
        assert [c.delivered_s for c in result.calls] == [None, None]


# -- the tracing plugin -----------------------------------------------------------------------------


def test_the_trace_accounts_for_every_prompt_token_the_admission_counter_saw(vllm: RealVllm) -> None:
    """A mix of completed calls and calls left before their first token or mid-stream: the prompt tokens of the
    executions the trace shows admitted equal the admission counter's growth, and their computed
    prompt tokens plus prefix hits cover them."""
    counts: list[dict[str, float]] = []
    first = len(read_trace_so_far(vllm))

    async def test(s: Stack) -> None:
        counts.append(await engine_metrics(s))

        # Three calls read to the end; three leave, before their first token or after it.
        await asyncio.gather(*(attempt(s, completion(prompt(n), 40), leave_after_events=leave) for n, leave in
                               [(3000, None), (6000, 0), (1200, None), (5000, 1), (800, 0), (2500, None)]))
        await until_engine(s, busy=False, what="vLLM to drain")
        counts.append(await engine_metrics(s))
        await s.settle()

    run(vllm, policy("retries-on-cancel-on"), test)
    events = new_events(vllm, first, lambda seen: ended(seen) and len(executions(seen)) == 6,
                        "the six executions' ends in the trace")
    admitted: dict[int, int] = {}  # execution -> prefix hit at admission
    computed: dict[int, int] = {}
    for event in events:
        if event["event"] == "step":
            for rid, hit in event["cached_tokens"].items():
                admitted.setdefault(int(rid), int(hit))
            for rid, n in event["prompt_tokens"].items():
                computed[int(rid)] = computed.get(int(rid), 0) + int(n)
    prompts = {e["execution"]: e["prompt_tokens"] for e in events if e["event"] == "queued"}
    before, after = counts
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    assert sum(prompts[rid] for rid in admitted) == queries
    for rid in admitted:
        assert admitted[rid] + computed.get(rid, 0) <= prompts[rid]
    finished = {e["execution"] for e in events if e["event"] == "first_token"}
    for rid in finished:
        assert admitted[rid] + computed[rid] == prompts[rid], f"execution {rid}'s prompt is not all accounted for"
    counted = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    assert counted == sum(prompts[rid] for rid in finished)
    work = prompt_work(events)
    assert work.computed_tokens == sum(computed.values())
