"""Stacked retry layers over real HTTP (docs/stacks.md): the load generator's stacked client in front of the
live proxy and the engine server, in one event loop.

The multiplication is counted at the proxy: a deadline check whose limit is below the proxy's first estimate
(no first token seen yet: one prompt per second, so 1 s) refuses every attempt with a 503, whatever the
machine's speed. A first-byte timeout is checked on a long prompt whose prefill alone takes longer than the
gateway waits, and on a long response whose first token comes well within it.
"""

from __future__ import annotations

import pytest
from fixtures.stack import ProxyStack, policy, run_stack

from retrybench.conditions.client_stack import StackLayer
from retrybench.conditions.config import ClientPolicy, WorkloadSpec
from retrybench.engine_server.engine_server import EngineServer, EngineServerSettings
from retrybench.loadgen.loadgen import LoadgenSettings, run_load
from retrybench.records.runlog import COMPLETED, REFUSED_503, TIMED_OUT
from retrybench.traffic.workload import Call, Trace

pytestmark = [pytest.mark.live, pytest.mark.beyond]

MODEL = "qwen2.5-7b-instruct"
SPEC = WorkloadSpec(chat_calls_per_s=1.0, prompt_tokens_mean=200.0, prompt_tokens_sd=0.0, shared_prefix_tokens=64)
NO_WAIT: dict[str, object] = {"backoff": "uniform", "backoff_min_s": 0.0, "backoff_max_s": 0.0}
CALLS = 3
Stack = ProxyStack[EngineServer]


def layer(name: str, retries: int, timeout_s: float, kind: str = "total") -> StackLayer:
    return StackLayer(name=name, timeout_kind=kind,
                      policy=ClientPolicy(max_retries=retries, attempt_timeout_s=timeout_s, **NO_WAIT))  # type: ignore[arg-type]


def trace(n: int, prompt_tokens: int = 200, response_tokens: int = 3) -> Trace:
    calls = tuple(Call(index=i, call_id=f"call-0-{i:06d}", arrival_s=0.1 * i, prompt_tokens=prompt_tokens,
                       response_tokens=response_tokens, phase="base") for i in range(n))
    return Trace(spec=SPEC, seed=0, calls=calls)


def engine(time_scale: float) -> EngineServer:
    return EngineServer(EngineServerSettings(model=MODEL, time_scale=time_scale))


def test_two_retries_inside_three_reach_the_proxy_as_twelve_requests_per_call() -> None:
    layers = (layer("app", 3, 100.0), layer("sdk", 2, 100.0))
    refuse_all = policy("no-control", deadline_check=True, attempt_deadline_s=0.5, max_outstanding=64)

    async def test(s: Stack) -> None:
        load = await run_load(trace(CALLS), LoadgenSettings(target=s.url, client=ClientPolicy(), stack=layers))
        assert [c.attempts for c in load.calls] == [12] * CALLS
        assert all(c.failed_reason == "attempts_exhausted" and c.delivered_s is None for c in load.calls)
        for call in load.calls:
            mine = [a for a in load.attempts if a.call_index == call.index]
            assert sorted(a.attempt_no for a in mine) == list(range(12))
            assert {a.outcome for a in mine} == {REFUSED_503}
        assert load.meta["stack"]["attempts"] == [4 * CALLS, 12 * CALLS]
        assert await s.metric("retrybench_proxy_attempts_total") == 12 * CALLS  # on the wire
        assert await s.metric("retrybench_proxy_retries_total") == 11 * CALLS  # every one after the first
        assert not s.upstream.core.stats  # nothing reached the engine

    run_stack(refuse_all, test, engine(0.05))


def test_a_gateway_cuts_a_request_with_no_first_byte_and_retries_it() -> None:
    """30,000 prompt tokens take several prefill steps (over a second of engine time, at time scale 1): the
    gateway's 0.05 s pass first, every time, however slow the machine."""
    layers = (layer("sdk", 0, 600.0), layer("gateway", 1, 0.05, "first_byte"))

    async def test(s: Stack) -> None:
        load = await run_load(trace(1, prompt_tokens=30_000), LoadgenSettings(target=s.url, client=ClientPolicy(),
                                                                              stack=layers))
        assert [c.attempts for c in load.calls] == [2]
        assert [(a.outcome, a.first_token_s) for a in load.attempts] == [(TIMED_OUT, None)] * 2
        # each cut at its scheduled send (0 s, then at once 0.05 s) plus the gateway's 0.05 s
        assert [round(a.ended_s, 9) for a in load.attempts] == [0.05, 0.1]
        assert load.meta["stack"]["attempts"] == [1, 2]

    run_stack(policy("no-control"), test, engine(1.0))


def test_a_first_token_lifts_the_gateways_timeout() -> None:
    """A short prompt's first token comes within the gateway's 1 s (a few tens of milliseconds of engine time);
    its 400 tokens then stream for longer than that, and the response completes."""
    layers = (layer("sdk", 0, 600.0), layer("gateway", 0, 1.0, "first_byte"))

    async def test(s: Stack) -> None:
        load = await run_load(trace(1, response_tokens=400), LoadgenSettings(target=s.url, client=ClientPolicy(),
                                                                             stack=layers))
        [attempt] = load.attempts
        assert attempt.outcome == COMPLETED and attempt.first_token_s is not None
        assert attempt.first_token_s - attempt.sent_s < 1.0 < attempt.ended_s - attempt.sent_s

    run_stack(policy("no-control"), test, engine(1.0))
