"""Refusal semantics and the circuit breaker end to end in simulate() (beyond the paper), on a short
overload pulse behind an engine queue cap, with the SDK profiles' clients."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from retrybench.analysis import summarize
from retrybench.conditions.client_profiles import load_client_profile
from retrybench.conditions.config import BreakerPolicy, ClientPolicy, EngineConfig, ProxyPolicy, WorkloadSpec
from retrybench.engine.profiles import EngineProfile, profile_for
from retrybench.records import runlog
from retrybench.records.runlog import RunLog
from retrybench.sim.run import simulate
from retrybench.traffic.workload import Call, generate_trace

pytestmark = pytest.mark.beyond

SPEC = WorkloadSpec(chat_calls_per_s=2.8, base_s=20, pulse_s=30, hold_s=60, pulse_rate_x=2.7)
META: dict[str, Any] = {"chat": 2.8, "pulse_start_s": 20.0, "pulse_end_s": 50.0, "hold_end_s": 110.0,
                        "attempt_timeout_s": 20.0, "delivery_horizon_s": 840.0}
BREAKER = BreakerPolicy(failures=5, window_s=10.0, open_s=10.0, probes=1)


@cache
def calls() -> tuple[Call, ...]:
    return generate_trace(SPEC, 3).calls


@cache
def capped() -> EngineProfile:
    return profile_for("qwen2.5-7b-instruct", engine=EngineConfig(max_num_queued_reqs=20))


def sdk(name: str) -> ClientPolicy:
    return replace(load_client_profile(name), attempt_timeout_s=20.0)


def run(proxy: ProxyPolicy, client: ClientPolicy, breaker: BreakerPolicy | None = None) -> RunLog:
    return simulate(capped(), calls(), client=client, proxy=proxy, seed=1, meta=dict(META), breaker=breaker)


def test_the_engine_cap_refuses_and_its_status_reaches_the_log() -> None:
    for status, outcome in ((503, runlog.REFUSED_503), (429, runlog.REFUSED_429), (529, runlog.REFUSED_529)):
        log = run(ProxyPolicy(engine_status=status), sdk("openai-sdk"))
        refused = [a for a in log.attempts if a.execution_id is not None and a.refusal_source == "engine"]
        assert refused and all(a.outcome == outcome for a in refused)
        assert summarize(log)["engine_refused"] == len(refused)


@pytest.mark.parametrize("profile", ["openai-sdk", "anthropic-sdk"])
def test_x_should_retry_false_turns_the_sdks_refusals_into_no_retries(profile: str) -> None:
    plain = summarize(run(ProxyPolicy(), sdk(profile)))
    told = run(ProxyPolicy(engine_no_retry=True), sdk(profile))
    retried_after_refusal = [a for a in told.attempts if a.attempt_no > 0
                             and any(b.call_index == a.call_index and b.attempt_no == a.attempt_no - 1
                                     and b.outcome == runlog.REFUSED_503 for b in told.attempts)]
    assert plain["engine_refused"] > 0 and retried_after_refusal == []
    assert any(c.failed_reason == "should_retry_false" for c in told.calls)


def test_the_papers_client_ignores_x_should_retry() -> None:
    client = replace(ClientPolicy(), attempt_timeout_s=20.0)
    assert run(ProxyPolicy(engine_no_retry=True), client).digest() == run(ProxyPolicy(), client).digest()


def test_a_breaker_counting_busy_answers_opens_and_one_counting_errors_only_does_not() -> None:
    client = sdk("openai-sdk")
    busy = run(ProxyPolicy(), client, replace(BREAKER, busy_is_fault=True))
    errors_only = run(ProxyPolicy(), client, replace(BREAKER, busy_is_fault=False))
    assert summarize(busy)["attempts_refused_breaker"] > 0
    assert 1 in busy.samples.breaker_state and 2 in busy.samples.breaker_state  # open, then half-open
    assert len(busy.samples.breaker_state) == len(busy.samples.engine_waiting)
    # with a 20-s attempt timeout, timeouts are faults for both; the busy answers only for the first
    assert summarize(errors_only).get("attempts_refused_breaker", 0) < summarize(busy)["attempts_refused_breaker"]


def test_a_run_without_a_breaker_logs_no_breaker_samples_and_reads_back() -> None:
    log = run(ProxyPolicy(), sdk("openai-sdk"))
    assert log.samples.breaker_state == [] and "breaker_state" not in log.to_json()
    with_breaker = run(ProxyPolicy(), sdk("openai-sdk"), BREAKER)
    again = RunLog.from_json(with_breaker.to_json())
    assert again.digest() == with_breaker.digest() and again.samples.breaker_state
    assert "drain_to_full_service_s" in summarize(with_breaker)
