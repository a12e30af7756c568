"""A rolling restart of the proxy instances loses no call and computes none twice.

Two `retrybench proxy` instances (coalescing) behind nginx's key-affine front (fixtures/front.py's
deployment, with `failover`: a connection a restarting instance refuses goes to the other one) in front
of one engine server, under a steady open-loop load from two load generators at once, one streaming
and one not. Each instance in turn gets SIGTERM, is waited for until it exits on its own, and is
started again on its port. Every call completes; no attempt ends in an error; the engine's trace
holds exactly one execution per call (each call has a prompt length of its own, which the trace
records), so no call was computed twice because of the restart and nothing was aborted; and each
restarted instance serves calls again. Every clock runs at TIME_SCALE of real time.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import pytest
from fixtures.draining import ProxyProcess
from fixtures.front import require_nginx
from fixtures.live import EngineFactory, start_server
from fixtures.nginx_front import nginx_command, nginx_conf
from fixtures.waiting import GENEROUS_S, within

from retrybench.conditions.config import WorkloadSpec, load_condition
from retrybench.loadgen.loadgen import LoadgenSettings, LoadResult, run_load
from retrybench.proxy.eventlog import read_event_log
from retrybench.serving.aio import run_event_loop
from retrybench.serving.launch import free_port
from retrybench.traffic.workload import Call, Trace

pytestmark = pytest.mark.live

TIME_SCALE = 0.25  # wall seconds per trace (and engine, and proxy) second
CALLS = 160  # per load generator: streamed, and whole
GAP_S = 0.25  # trace seconds between two calls of one load generator: 8 calls a wall second in all
RESPONSE_TOKENS = 200
FIRST_PROMPT = 32  # prompt lengths FIRST_PROMPT, FIRST_PROMPT + 1, ...: one per call, in both loads
RESTART_AT_S = (2.0, 6.0)  # wall seconds after the load starts when each instance gets SIGTERM


def trace(first_prompt: int, prefix: str) -> Trace:
    """CALLS calls GAP_S apart, each with a prompt length of its own (the engine's trace names it)."""
    spec = WorkloadSpec(chat_calls_per_s=1.0, shared_prefix_tokens=0)
    calls = tuple(Call(index=i, call_id=f"{prefix}-{i}", arrival_s=i * GAP_S, prompt_tokens=first_prompt + i,
                       response_tokens=RESPONSE_TOKENS, phase="base") for i in range(CALLS))
    return Trace(spec=spec, seed=7, calls=calls)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[str, list[ProxyProcess], EngineFactory]]:
    """(nginx's URL, the two instances, the engine factory whose engine is the first it started)."""
    binary = require_nginx()
    with closing(EngineFactory(tmp_path)) as engines, ExitStack() as stack:
        engine = engines(time_scale=TIME_SCALE, trace=True)
        proxies = [ProxyProcess(free_port(), [engine.url], "coalescing", tmp_path,
                                extra=("--time-scale", repr(TIME_SCALE))) for _ in range(2)]
        for proxy in proxies:
            stack.callback(proxy.close)
            proxy.start()
        workdir = tmp_path / "nginx"
        workdir.mkdir()
        ports = [proxy.port for proxy in proxies]
        _, url = start_server(stack, lambda port: nginx_command(binary, nginx_conf(
            workdir, port, ports, front="key-affine", failover=True)), workdir / "nginx.log")
        yield url, proxies, engines


async def restart(proxy: ProxyProcess, timings: list[dict[str, float]]) -> None:
    """SIGTERM, wait until it exits on its own, start it again on its port (blocking steps in threads)."""
    proxy.terminate()
    code, exit_s = await asyncio.to_thread(proxy.wait_exit)
    assert code == 0, proxy.output()
    await asyncio.to_thread(proxy.start)
    timings.append({"exit_s": exit_s, "code": code})


def test_rolling_restart_loses_no_call(deployment: tuple[str, list[ProxyProcess], EngineFactory],
                                       tmp_path: Path) -> None:
    url, proxies, engines = deployment
    client = load_condition("coalescing").client
    timings: list[dict[str, float]] = []

    async def main() -> list[LoadResult]:
        loads = [asyncio.create_task(run_load(trace(FIRST_PROMPT + CALLS * i, name), LoadgenSettings(
            target=url, client=client, seed=i, time_scale=TIME_SCALE, stream=name == "streamed")))
            for i, name in enumerate(("streamed", "whole"))]
        began = asyncio.get_running_loop().time()
        for proxy, at_s in zip(proxies, RESTART_AT_S, strict=True):
            await asyncio.sleep(max(0.0, began + at_s - asyncio.get_running_loop().time()))
            await restart(proxy, timings)
        return list(await asyncio.gather(*loads))

    results = run_event_loop(lambda: within(main(), "the load through the rolling restart", 3 * GENEROUS_S))
    for proxy in proxies:  # the second lives' decision logs are complete once they stopped
        proxy.close()
    engine_trace = engines.directory / "engine-1.trace.jsonl"
    engines.close()  # flushes the engine's trace

    calls = [call for result in results for call in result.calls]
    attempts = [attempt for result in results for attempt in result.attempts]
    outcomes = Counter(attempt.outcome for attempt in attempts)
    queued = Counter(e["prompt_tokens"] for e in _trace_events(engine_trace) if e.get("event") == "queued")
    aborted = sum(1 for e in _trace_events(engine_trace) if e.get("event") == "abort_requested")
    served_after = [_created(proxy.log_path(2)) for proxy in proxies]
    drains = [_drain(proxy.log_path(1)) for proxy in proxies]
    print(f"rolling restart: {len(calls)} calls, {len(attempts)} attempts {dict(outcomes)}, "
          f"{sum(queued.values())} engine executions, {aborted} aborted; drains {drains}, exits {timings}; "
          f"executions created after the restart per instance {served_after}")
    assert all(d["subscribers"] > 0 and d["reason"] == "idle" and not d["cut"] for d in drains), \
        f"each instance must drain calls in flight, and end idle: {drains}"
    assert len(calls) == 2 * CALLS
    undelivered = [c.index for c in calls if c.delivered_s is None]
    assert not undelivered, f"calls not delivered: {undelivered[:20]}; attempts {dict(outcomes)}"
    assert outcomes["error"] == 0 and outcomes["timed_out"] == 0, dict(outcomes)
    expected = {FIRST_PROMPT + i for i in range(2 * CALLS)}
    twice = {prompt: n for prompt, n in queued.items() if n > 1}
    assert not twice, f"calls computed more than once (prompt length: executions): {twice}"
    assert set(queued) == expected, f"calls missing from the engine: {sorted(expected - set(queued))[:20]}"
    assert aborted == 0, f"{aborted} executions aborted at the engine"
    assert all(n > 0 for n in served_after), f"executions created by each restarted instance: {served_after}"


def _trace_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _drain(log: Path) -> dict[str, Any]:
    """What an instance's decision log says of its drain: the calls in flight at SIGTERM, how it ended."""
    _, events = read_event_log(log)
    start, end = (e for e in events if e["ev"] == "drain")
    return {"subscribers": start["subscribers"], "reason": end["reason"], "cut": end["cut"],
            "refused": end["refused"], "waited_s": round(end["waited_s"], 3)}


def _created(log: Path) -> int:
    """Executions an instance's life created (from its decision log)."""
    _, events = read_event_log(log)
    return sum(1 for e in events if e["ev"] == "attempt" and e.get("decision") == "create")
