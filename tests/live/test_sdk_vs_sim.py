"""The real openai SDK through the live proxy, in front of the engine server, against the simulator on the
same short trace: the same attempts per call, outcomes, attach and retained flags, executions created and
the SDK's retry schedule.

Two calls of 12,000 prompt and 400 output tokens, 0.2 s apart, on Qwen2.5-7B-Instruct (H100 profile), each
made by the SDK with a 1-s timeout and four retries, its jitter drawn as none (so the simulator's
openai-sdk profile with jitter "none" is the same client). An execution takes about 3.4 s, so every call
times out at least twice: with coalescing and retention (the proxy keeps the finished response) each
call is delivered on its third attempt and computed once; with coalescing alone each execution finishes
between two attempts, for nobody, and the call is never delivered. In the simulator no execution ends
within 0.33 s of an attempt's start or deadline, which is the room the live run has for its own timing.

It runs in real time (about 20 s): the SDK sleeps its backoff on the wall clock.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from fixtures.stack import ProxyStack, policy, run_stack

from retrybench.conditions.client_profiles import load_client_profile
from retrybench.conditions.config import ClientPolicy, ProxyPolicy, WorkloadSpec
from retrybench.engine.profiles import profile_for
from retrybench.engine_server.engine_server import EngineServer, EngineServerSettings
from retrybench.loadgen.loadgen import LoadResult
from retrybench.loadgen.sdk_driver import SdkLoadSettings, run_sdk_load
from retrybench.records.runlog import AttemptRecord, RunLog
from retrybench.sim.run import simulate
from retrybench.traffic.workload import Call, Trace

pytestmark = pytest.mark.live
pytest.importorskip("openai")

MODEL = "qwen2.5-7b-instruct"
ARRIVALS_S = (0.0, 0.2)
TIMING_S = 0.3  # what the live run may differ from the simulator by, on any send or delivery time


def trace() -> Trace:
    calls = tuple(Call(index=i, call_id=f"call-{i}", arrival_s=t, prompt_tokens=12_000, response_tokens=400,
                       phase="base") for i, t in enumerate(ARRIVALS_S))
    return Trace(spec=WorkloadSpec(chat_calls_per_s=1.0, shared_prefix_tokens=0), seed=0, calls=calls)


def sdk_client() -> ClientPolicy:
    """The openai-sdk profile with the test's timeout and retries, and no jitter (the SDK's is patched out)."""
    return dataclasses.replace(load_client_profile("openai-sdk"), attempt_timeout_s=1.0, max_retries=4,
                               jitter="none")


def simulated(proxy: ProxyPolicy) -> RunLog:
    return simulate(profile_for(MODEL, "h100"), trace().calls, client=sdk_client(), proxy=proxy, seed=0, meta={},
                    prefix_tokens=0)


def live(proxy: ProxyPolicy) -> tuple[LoadResult, float]:
    """The SDK's run through the proxy, and the executions the proxy created."""
    out: dict[str, Any] = {}

    async def test(s: ProxyStack[EngineServer]) -> None:
        out["result"] = await run_sdk_load(trace(), SdkLoadSettings(target=s.url, client=sdk_client()))
        out["created"] = await s.metric("retrybench_proxy_decisions_total", decision="created")

    run_stack(proxy, test, EngineServer(EngineServerSettings(model=MODEL, prefix_tokens=0)))
    return out["result"], out["created"]


def by_call(attempts: list[AttemptRecord]) -> dict[int, list[AttemptRecord]]:
    ordered = sorted(attempts, key=lambda a: (a.call_index, a.attempt_no))
    return {index: list(group) for index, group in itertools.groupby(ordered, key=lambda a: a.call_index)}


@pytest.mark.parametrize(("condition", "delivered"), [("coalescing-retain", True), ("coalescing", False)])
def test_the_sdk_through_the_live_proxy_does_what_the_simulator_predicts(
        condition: str, delivered: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    base_client = pytest.importorskip("openai._base_client")
    monkeypatch.setattr(base_client, "random", lambda: 0.0)  # the SDK's jitter factor 1 - 0.25 * random()
    proxy = policy(condition, retain_s=30.0) if condition.endswith("-retain") else policy(condition)
    sim = simulated(proxy)
    assert all((c.delivered_s is not None) is delivered for c in sim.calls), "the scenario changed in the simulator"
    result, created = live(proxy)

    assert created == len(sim.executions), f"executions created: live {created:g}, simulator {len(sim.executions)}"
    # The SDK starts its first request a little after the driver's clock: compare from that send.
    shift = min(a.sent_s for a in result.attempts)
    expected, got = by_call(sim.attempts), by_call(result.attempts)
    assert sorted(got) == sorted(expected) == [0, 1]
    for index in expected:
        want, have = expected[index], got[index]
        summary = [(a.attempt_no, round(a.sent_s - shift, 2), a.outcome, a.attached, a.retained) for a in have]
        assert [(a.outcome, a.retained) for a in have] == [(a.outcome, a.retained) for a in want], (
            f"call {index}: live {summary}")
        # An attempt that timed out got no response head (the proxy answers a whole response at its end),
        # so whether it had attached is known live only for those answered.
        answered = [(a.attached, b.attached) for a, b in zip(have, want, strict=True) if a.outcome != "timed_out"]
        assert all(x == y for x, y in answered), f"call {index}: live {summary}"
        for a, b in zip(have, want, strict=True):
            assert abs((a.sent_s - shift) - b.sent_s) <= TIMING_S, f"call {index}: live {summary}, simulator " \
                f"sends at {[round(x.sent_s, 2) for x in want]}"
    for live_call, sim_call in zip(result.calls, sim.calls, strict=True):
        assert live_call.attempts == sim_call.attempts
        assert (live_call.delivered_s is None) == (sim_call.delivered_s is None)
        if sim_call.delivered_s is not None and live_call.delivered_s is not None:
            assert abs(live_call.delivered_s - shift - sim_call.delivered_s) <= TIMING_S, (
                f"call {live_call.index} delivered at {live_call.delivered_s - shift:.2f} s live, "
                f"{sim_call.delivered_s:.2f} s simulated")
