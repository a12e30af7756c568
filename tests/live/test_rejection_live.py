"""Refusal semantics and the circuit breaker on the live stack (beyond the paper): the proxy answers
each refusal with its configured status and headers, the load generator's client obeys
`x-should-retry: false` as the SDK profiles say, and the breaker's half-open probe closes it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from aiohttp import web
from fixtures.stack import ProxyStack, policy, run_stack
from fixtures.stub_upstream import StubUpstream
from fixtures.waiting import until

from retrybench.conditions.client_profiles import load_client_profile
from retrybench.conditions.config import BreakerPolicy, ClientPolicy, ProxyPolicy, WorkloadSpec
from retrybench.loadgen.assemble import Scrape, resample
from retrybench.loadgen.loadgen import LoadgenSettings, LoadResult, run_load
from retrybench.records.runlog import COMPLETED, REFUSED_529
from retrybench.serving.app import new_app, start_app
from retrybench.traffic.workload import Call, Trace

pytestmark = [pytest.mark.live, pytest.mark.beyond]

Stack = ProxyStack[StubUpstream]


def run(chosen: ProxyPolicy, test: Callable[[Stack], Awaitable[None]], **settings: Any) -> None:
    run_stack(chosen, test, StubUpstream(), **settings)


def body(n: int = 2, stream: bool = False, **stub: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": [101, 102, 103, 104], "max_tokens": n, "stream": stream, "stub": stub}


# -- the proxy's answers ------------------------------------------------------------------------------


def test_the_budget_answers_529_with_x_should_retry_false_and_no_retry_after() -> None:
    async def test(s: Stack) -> None:
        async with s.post(body(), key="call-1") as first:
            await first.read()
        async with s.post(body(), key="call-1") as retry:
            assert retry.status == 529
            assert retry.headers["x-should-retry"] == "false"
            assert "Retry-After" not in retry.headers
            assert (await retry.json())["error"]["code"] == 529
        assert s.upstream.requests == 1

    run(policy("retry-budget-cancel-on", budget_status=529, budget_retry_after=False, budget_no_retry=True), test)


def test_the_engines_503_is_relayed_as_the_configured_status_with_its_headers() -> None:
    async def test(s: Stack) -> None:
        async with s.post(body(status=503)) as refused:
            assert refused.status == 429
            assert int(refused.headers["Retry-After"]) >= 1
            assert refused.headers["x-should-retry"] == "false"
            assert (await refused.json())["error"]["code"] == 429
        async with s.post(body()) as served:  # a success is not touched
            assert served.status == 200 and "x-should-retry" not in served.headers
        await s.settle()

    run(policy("no-control", engine_status=429, engine_retry_after=True, engine_no_retry=True), test)


def test_by_default_the_engines_503_passes_through_bare() -> None:
    async def test(s: Stack) -> None:
        async with s.post(body(status=503)) as refused:
            assert refused.status == 503
            assert "Retry-After" not in refused.headers and "x-should-retry" not in refused.headers
        await s.settle()

    run(policy("no-control"), test)


# -- the breaker's half-open probe ----------------------------------------------------------------------


def test_the_breaker_opens_refuses_then_lets_one_probe_through_which_closes_it() -> None:
    breaker = BreakerPolicy(failures=2, window_s=600.0, open_s=1.0, probes=1, busy_is_fault=True, status=529)

    async def test(s: Stack) -> None:
        gate = s.proxy.breaker
        assert gate is not None
        for _ in range(2):  # two busy answers from the engine: counted as faults, they open it
            async with s.post(body(status=503)) as busy:
                assert busy.status == 503
        assert gate.state_code() == 1
        assert await s.metric("retrybench_proxy_breaker_state") == 1  # what a live run samples each second
        async with s.post(body()) as shed:
            assert shed.status == 529 and int(shed.headers["Retry-After"]) >= 1
            assert (await shed.json())["error"]["message"] == "the circuit breaker is open"
        requests = s.upstream.requests
        await until(lambda: gate.state_code() == 2, "the breaker's cool-down to end (half-open)")

        async def slow_probe() -> int:
            async with s.post(body(n=2, interval_ms=2000)) as response:  # 4 s upstream: still out below
                await response.read()
                return int(response.status)

        probe = asyncio.create_task(slow_probe())
        await until(lambda: s.upstream.requests == requests + 1, "the probe to reach the engine")
        async with s.post(body()) as second:  # one probe only: the next attempt is still shed
            assert second.status == 529
        assert await probe == 200
        await until(lambda: gate.state_code() == 0, "the probe's success to close the breaker")
        async with s.post(body()) as after:
            assert after.status == 200
        assert await s.metric("retrybench_proxy_breaker_state") == 0
        assert gate.core.counts.opened == 1 and gate.core.counts.closed == 1
        await s.settle()

    run(policy("no-control"), test, breaker=breaker)


# -- the load generator's client --------------------------------------------------------------------------


@dataclass
class _Refuser:
    """An upstream that answers each call's first attempt 529 with `x-should-retry: false`, then 200."""

    seen: list[tuple[str, int]] = field(default_factory=list)
    runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = new_app([web.post("/v1/completions", self.handle)], client_max_size=1 << 20)
        self.runner, port = await start_app(app, "127.0.0.1", 0)
        return f"http://127.0.0.1:{port}"

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        call_id, attempt = request.headers["Idempotency-Key"], int(request.headers["X-Retrybench-Attempt"])
        self.seen.append((call_id, attempt))
        if attempt == 0:
            return web.json_response({"error": {"code": 529, "message": "overloaded"}}, status=529,
                                     headers={"x-should-retry": "false"})
        return web.json_response({"choices": [{"text": "ttt"}]})


def _load(client: ClientPolicy) -> tuple[LoadResult, _Refuser]:
    spec = WorkloadSpec(chat_calls_per_s=1.0, prompt_tokens_mean=200.0, prompt_tokens_sd=0.0, shared_prefix_tokens=64)
    calls = tuple(Call(index=i, call_id=f"call-0-{i:06d}", arrival_s=0.05 * i, prompt_tokens=150, response_tokens=3,
                       phase="base") for i in range(3))
    upstream = _Refuser()

    async def main() -> LoadResult:
        target = await upstream.start()
        try:
            return await run_load(Trace(spec=spec, seed=0, calls=calls),
                                  LoadgenSettings(target=target, client=client, stream=False))
        finally:
            assert upstream.runner is not None
            await upstream.runner.cleanup()

    return asyncio.run(main()), upstream


@pytest.mark.parametrize("profile", ["openai-sdk", "anthropic-sdk"])
def test_the_sdk_profiles_obey_x_should_retry_false(profile: str) -> None:
    client = replace(load_client_profile(profile), attempt_timeout_s=5.0, backoff_base_s=0.05, backoff_cap_s=0.05)
    result, upstream = _load(client)
    assert all(attempt == 0 for _, attempt in upstream.seen) and len(upstream.seen) == 3
    assert all(a.outcome == REFUSED_529 for a in result.attempts)
    assert all(c.failed_reason == "should_retry_false" and c.attempts == 1 for c in result.calls)


def test_the_papers_client_retries_a_529_whatever_the_header() -> None:
    client = ClientPolicy(max_retries=2, attempt_timeout_s=5.0, backoff_min_s=0.05, backoff_max_s=0.05)
    result, upstream = _load(client)
    assert sorted(attempt for _, attempt in upstream.seen) == [0, 0, 0, 1, 1, 1]
    assert all(c.delivered_s is not None and c.attempts == 2 for c in result.calls)
    assert {a.outcome for a in result.attempts} == {REFUSED_529, COMPLETED}


def test_a_live_runs_samples_carry_the_breakers_state_only_where_the_proxy_has_one() -> None:
    scrapes = [Scrape(at_unix=100.0 + t, engine_waiting=0, engine_running=0, proxy_waiting=0, prompt_tokens_total=0,
                      prefix_cache_queries_total=0, breaker_state=state) for t, state in enumerate((0, 1, 2, 0))]
    assert resample(scrapes, 100.0, 1.0, 4.0).breaker_state == [0, 1, 2, 0]
    plain = [replace(s, breaker_state=None) for s in scrapes]
    assert resample(plain, 100.0, 1.0, 4.0).breaker_state == []


def test_a_named_conditions_breaker_reaches_the_proxys_settings() -> None:
    from retrybench.cli.live import _proxy_settings

    values: dict[str, Any] = {"upstreams": ["http://127.0.0.1:9"], "route": None, "policy_name": "breaker-busy-faults",
                              "retain_s": None, "retain_max_bytes": None, "prefix_tokens": 2000,
                              "max_body_bytes": 1 << 20, "log_path": None, "time_scale": 1.0, "connect_timeout_s": 10.0,
                              "idle_timeout_s": 100.0, "max_executions": 10, "max_subscribers": 10,
                              "max_replay_bytes": 1 << 20, "drain_timeout_s": 1.0}
    assert _proxy_settings(values, None).breaker == BreakerPolicy(failures=20, busy_is_fault=True)
    assert _proxy_settings({**values, "policy_name": "no-control"}, None).breaker is None
