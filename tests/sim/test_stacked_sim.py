"""Stacked retry layers in the simulator (docs/stacks.md): a one-layer stack is the plain client's run, a
first-byte layer cuts only attempts with no first token, and the run log counts what each layer did."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from retrybench.conditions.client_profiles import load_client_profile
from retrybench.conditions.client_stack import StackLayer
from retrybench.conditions.config import ClientPolicy, ProxyPolicy, WorkloadSpec
from retrybench.engine.profiles import EngineProfile, profile_for
from retrybench.records import runlog
from retrybench.records.runlog import RunLog
from retrybench.sim.run import simulate
from retrybench.traffic.workload import Call, generate_trace

pytestmark = pytest.mark.beyond

SPEC = WorkloadSpec(chat_calls_per_s=0.5, base_s=20, pulse_s=10, hold_s=30)  # a small trace, as test_sim_run's
META: dict[str, Any] = {"pulse_start_s": SPEC.pulse_start_s, "pulse_end_s": SPEC.pulse_end_s,
                        "hold_end_s": SPEC.hold_end_s}
TIGHT = 5.0  # a deadline that times attempts of this trace out


@cache
def calls(seed: int = 7) -> tuple[Call, ...]:
    return generate_trace(SPEC, seed).calls


@cache
def qwen() -> EngineProfile:
    return profile_for("qwen2.5-7b-instruct")

GATEWAY_S = 0.3  # below the small trace's time to first token for some attempts: the gateway cuts them
PROXY = ProxyPolicy(cancellation="immediate")
PAPER = ClientPolicy()


def run(stack: list[StackLayer] | None, client: ClientPolicy = PAPER, proxy: ProxyPolicy = PROXY) -> RunLog:
    return simulate(qwen(), calls(7), client=client, proxy=proxy, seed=1, meta=dict(META), stack=stack)


def _shape(log: RunLog) -> tuple[Any, ...]:
    return (log.calls, log.attempts, log.executions, log.end_s)


@pytest.mark.parametrize("profile", ["paper", "openai-sdk"])
def test_a_one_layer_stack_runs_as_the_plain_client(profile: str) -> None:
    policy = load_client_profile(profile)
    tight = replace(policy, attempt_timeout_s=TIGHT)
    plain = run(None, tight)
    stacked = run([StackLayer(name="only", policy=tight)])
    assert any(a.attempt_no > 0 for a in plain.attempts)  # retries happened: the comparison has teeth
    assert _shape(stacked) == _shape(plain)
    assert "stack" not in plain.meta and stacked.meta["stack"]["attempts"] == [len(plain.attempts)]


def gateway_stack(retries: int = 2) -> list[StackLayer]:
    return [StackLayer(name="sdk", policy=ClientPolicy(max_retries=2, attempt_timeout_s=600.0)),
            StackLayer(name="gateway", timeout_kind="first_byte",
                       policy=ClientPolicy(max_retries=retries, attempt_timeout_s=GATEWAY_S))]


def test_a_first_byte_timeout_cuts_only_attempts_without_a_first_token() -> None:
    log = run(gateway_stack())
    cut = [a for a in log.attempts if a.outcome == runlog.TIMED_OUT]
    slow = [a for a in log.attempts if a.outcome == runlog.COMPLETED and a.ended_s - a.sent_s > GATEWAY_S]
    assert cut and slow  # both kinds happen on this trace
    assert all(a.first_token_s is None and math.isclose(a.ended_s - a.sent_s, GATEWAY_S) for a in cut)
    assert all(a.first_token_s is not None and a.first_token_s - a.sent_s <= GATEWAY_S + 1e-9 for a in slow)


def test_the_log_counts_each_layers_attempts_and_the_wire_numbers_them_across_layers() -> None:
    log = run(gateway_stack())
    stack = log.meta["stack"]
    assert stack["layers"] == ["sdk", "gateway"] and stack["timeout_kinds"] == ["total", "first_byte"]
    assert stack["attempts"][-1] == sum(c.attempts for c in log.calls) == len(log.attempts)
    assert stack["attempts"][0] >= len(log.calls) and stack["max_attempts"][-1] <= 3 * 3
    for call in log.calls:
        numbers = sorted(a.attempt_no for a in log.attempts if a.call_index == call.index)
        assert numbers == list(range(call.attempts))


def test_gateway_retries_multiply_the_requests_a_call_makes() -> None:
    with_retries, without = run(gateway_stack(2)), run(gateway_stack(0))
    assert len(with_retries.attempts) > len(without.attempts) >= len(without.calls)
    assert without.meta["stack"]["attempts"][0] == without.meta["stack"]["attempts"][1]  # one request per SDK attempt
