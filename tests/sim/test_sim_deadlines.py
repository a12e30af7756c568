"""Deadline propagation end to end in simulate() (beyond the paper): each control on the short overload
pulse with a 20-s attempt deadline that the client sends with every attempt."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from retrybench.analysis import summarize
from retrybench.conditions.config import ClientPolicy, ProxyPolicy, WorkloadSpec, load_condition
from retrybench.engine.profiles import EngineProfile, profile_for
from retrybench.records import runlog
from retrybench.records.runlog import RunLog
from retrybench.sim.run import simulate
from retrybench.traffic.workload import Call, generate_trace

pytestmark = pytest.mark.beyond

SPEC = WorkloadSpec(chat_calls_per_s=2.8, base_s=20, pulse_s=30, hold_s=60, pulse_rate_x=2.7)
META: dict[str, Any] = {"chat": 2.8, "pulse_start_s": 20.0, "pulse_end_s": 50.0, "hold_end_s": 110.0,
                        "attempt_timeout_s": 20.0, "delivery_horizon_s": 840.0}
SENDS = ClientPolicy(attempt_timeout_s=20, sends_deadline=True)
SILENT = ClientPolicy(attempt_timeout_s=20)


@cache
def calls() -> tuple[Call, ...]:
    return generate_trace(SPEC, 3).calls


@cache
def qwen() -> EngineProfile:
    return profile_for("qwen2.5-7b-instruct")


@cache
def run(proxy: ProxyPolicy, client: ClientPolicy = SENDS) -> RunLog:
    return simulate(qwen(), calls(), client=client, proxy=proxy, seed=1, meta=dict(META))


def condition(name: str) -> ProxyPolicy:
    return load_condition(name).proxy


def fates(log: RunLog) -> Counter[str]:
    return Counter(e.fate for e in log.executions)


def test_without_a_deadline_to_hear_propagation_changes_nothing() -> None:
    off = run(ProxyPolicy(cancellation="off"), SILENT)
    assert run(condition("deadline-propagation"), SILENT).digest() == off.digest()


def test_propagation_cancels_at_the_deadline_with_cancellation_off() -> None:
    off, heard = run(ProxyPolicy(cancellation="off")), run(condition("deadline-propagation"))
    assert fates(off)[runlog.FATE_ORPHANED] > 50  # the paper's orphans
    assert fates(heard)[runlog.FATE_ORPHANED] == 0
    assert fates(heard)[runlog.FATE_CANCELLED] > 50
    attempts = {(a.call_index, a.attempt_no): a for a in heard.attempts}
    for e in heard.executions:
        if e.fate == runlog.FATE_CANCELLED:  # closed at its attempt's deadline (sent + 20 s), then the close's delay
            deadline = attempts[(e.call_index, e.attempt_no)].sent_s + 20.0
            assert e.abort_requested_s == pytest.approx(deadline + ProxyPolicy().cancel_delay_s)


def test_the_default_deadline_stands_in_for_a_client_that_sends_none() -> None:
    heard = run(ProxyPolicy(cancellation="off", deadline_propagation=True, default_deadline_s=20.0), SILENT)
    assert fates(heard)[runlog.FATE_ORPHANED] == 0 and fates(heard)[runlog.FATE_CANCELLED] > 50


def test_a_queued_execution_is_dropped_at_its_deadline_before_reaching_the_engine() -> None:
    """A proxy deadline (10 s) shorter than the client's (20 s): the proxy acts while the client still waits,
    so the drop is the deadline's, not a disconnect's. Newest first, so old executions wait in the queue."""
    policy = ProxyPolicy(cancellation="off", max_outstanding=20, queue_order="lifo", lifo_threshold=0,
                         deadline_propagation=True, default_deadline_s=10.0)
    log = run(policy, SILENT)
    dropped = {e.execution_id: e for e in log.executions if e.fate == runlog.FATE_DROPPED}
    assert len(dropped) > 10
    assert all(e.accepted_s is None and e.computed_prompt_tokens == 0 for e in dropped.values())
    told = [(a, dropped[a.execution_id]) for a in log.attempts
            if a.execution_id is not None and a.execution_id in dropped and not a.attached]
    assert told and all(a.outcome == runlog.REFUSED_503 for a, _ in told)  # answered 503 at the deadline
    assert all(a.ended_s == pytest.approx(e.created_s + 10.0) for a, e in told)
    assert fates(log)[runlog.FATE_ORPHANED] == 0


def test_admission_refuses_at_once_what_it_estimates_cannot_finish() -> None:
    heard, admitted = run(condition("deadline-propagation")), run(condition("deadline-admission"))
    refused = [a for a in admitted.attempts if a.outcome == runlog.REFUSED_503]
    assert len(refused) > 20
    assert all(a.execution_id is None and a.ended_s == a.sent_s for a in refused)
    assert summarize(admitted)["attempts_refused_deadline"] == len(refused)
    assert len(admitted.executions) < len(heard.executions)  # the refused never cost the engine anything


def test_deferral_from_the_deadline_lets_a_retry_attach() -> None:
    deferred = run(condition("deadline-deferred"))
    assert sum(1 for a in deferred.attempts if a.attached) > 20
    latest: dict[int, float] = {}
    for a in deferred.attempts:
        if a.execution_id is not None:
            latest[a.execution_id] = max(latest.get(a.execution_id, 0.0), a.sent_s + 20.0)
    cancelled = [e for e in deferred.executions if e.fate == runlog.FATE_CANCELLED]
    assert cancelled  # not a vacuous check
    for e in cancelled:  # 10 s after the last subscriber's deadline, then the close's delay
        assert e.abort_requested_s == pytest.approx(latest[e.execution_id] + 10.0 + ProxyPolicy().cancel_delay_s)


def test_the_paper_client_sends_no_deadline_and_the_sdks_do() -> None:
    from retrybench.conditions.client_profiles import load_client_profile

    assert not load_client_profile("paper").sends_deadline
    assert all(load_client_profile(p).sends_deadline for p in ("openai-sdk", "anthropic-sdk"))
    assert replace(SENDS, sends_deadline=False) == SILENT


@pytest.mark.parametrize("name", ["deadline-propagation", "deadline-admission", "deadline-deferred"])
def test_a_deployment_drives_the_deadlines_as_the_single_engine_run(name: str) -> None:
    from retrybench.sim.deployment import Deployment, simulate_deployment

    one = simulate_deployment([qwen()], calls(), client=SENDS, proxy=condition(name), seed=1, meta=dict(META),
                              deployment=Deployment())
    assert one.digest() == run(condition(name)).digest()
    two = simulate_deployment([qwen()] * 2, calls(), client=SENDS, proxy=condition("deadline-propagation"), seed=1,
                              meta=dict(META), deployment=Deployment(proxies=2))
    assert fates(two)[runlog.FATE_ORPHANED] == 0 and fates(two)[runlog.FATE_CANCELLED] > 0
