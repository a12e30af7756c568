"""The overload controls end to end in simulate(): coalescing, the retry budget, the proxy cap,
deferred cancellation, and determinism, on a short overload pulse with a 20-s attempt deadline."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from retrybench.analysis import summarize
from retrybench.conditions.config import ClientPolicy, ProxyPolicy, WorkloadSpec, load_condition
from retrybench.engine.profiles import EngineProfile, profile_for
from retrybench.records import runlog
from retrybench.records.runlog import ExecutionRecord, RunLog
from retrybench.sim.run import simulate
from retrybench.traffic.workload import Call, generate_trace

SPEC = WorkloadSpec(chat_calls_per_s=2.8, base_s=20, pulse_s=30, hold_s=60, pulse_rate_x=2.7)
META: dict[str, Any] = {"chat": 2.8, "pulse_start_s": 20.0, "pulse_end_s": 50.0, "hold_end_s": 110.0,
                        "attempt_timeout_s": 20.0, "delivery_horizon_s": 840.0}
CLIENT = ClientPolicy(attempt_timeout_s=20)  # short enough that the pulse times attempts out


@cache
def calls() -> tuple[Call, ...]:
    return generate_trace(SPEC, 3).calls


@cache
def qwen() -> EngineProfile:
    return profile_for("qwen2.5-7b-instruct")


def simulate_with(proxy: ProxyPolicy, client: ClientPolicy = CLIENT, seed: int = 1) -> RunLog:
    return simulate(qwen(), calls(), client=client, proxy=proxy, seed=seed, meta=dict(META))


@cache
def run(name: str, client: ClientPolicy = CLIENT) -> RunLog:
    condition = load_condition(name)
    return simulate_with(condition.proxy, replace(condition.client, attempt_timeout_s=client.attempt_timeout_s,
                                                  max_retries=client.max_retries))


def numbers(log: RunLog) -> dict[str, float]:
    """summarize(log)'s numeric fields: the counts and percentages these tests compare."""
    return {key: value for key, value in summarize(log).items() if isinstance(value, int | float)}


def by_id(log: RunLog) -> dict[int, ExecutionRecord]:
    return {e.execution_id: e for e in log.executions}


def test_the_trace_overloads_and_times_attempts_out() -> None:
    assert 250 <= len(calls()) <= 500
    log = run("no-control")
    assert sum(1 for a in log.attempts if a.outcome == runlog.TIMED_OUT) > 100
    assert numbers(log)["retries"] > 100


# -- coalescing ---------------------------------------------------------------------------------------


def test_coalescing_attaches_retries_to_their_own_calls_execution() -> None:
    log = run("coalescing")
    row = numbers(log)
    attached = [a for a in log.attempts if a.attached]
    assert row["retries_attached"] == len(attached) > 0
    assert row["retries_attached_pct"] == pytest.approx(100.0 * len(attached) / row["retries"], abs=1e-4)
    executions = by_id(log)
    for a in attached:
        assert a.attempt_no >= 1
        assert a.execution_id is not None
        execution = executions[a.execution_id]
        assert execution.call_index == a.call_index  # only a retry of the same call attaches
        assert execution.attempt_no < a.attempt_no
        assert execution.created_s <= a.sent_s
        assert execution.finished_s is None or execution.finished_s > a.sent_s  # it was still live
    # An attempt that did not attach created its own execution.
    for a in log.attempts:
        if not a.attached:
            assert a.execution_id is not None
            assert (executions[a.execution_id].call_index, executions[a.execution_id].attempt_no) == (
                a.call_index, a.attempt_no)


def test_coalescing_creates_a_calls_next_execution_only_after_the_last_one_finished() -> None:
    log = run("coalescing")  # cancellation off: an execution is live until it finishes
    per_call: dict[int, list[ExecutionRecord]] = defaultdict(list)
    for e in log.executions:
        per_call[e.call_index].append(e)
    pairs = 0
    for executions in per_call.values():
        executions.sort(key=lambda e: e.created_s)
        for before, after in itertools.pairwise(executions):
            pairs += 1
            assert before.finished_s is not None and before.finished_s <= after.created_s
    assert pairs > 0  # some retries arrived after their execution completed, as in Section 6.3


def test_coalescing_creates_fewer_executions_than_no_control() -> None:
    assert len(run("coalescing").executions) < len(run("no-control").executions) / 2
    assert numbers(run("no-control"))["retries_attached"] == 0


def test_coalescing_with_immediate_cancellation_attaches_nothing() -> None:
    """Finding 7: the first attempt's execution is cancelled at its deadline, before the retry comes."""
    log = run("coalescing-cancel-on")
    row = numbers(log)
    assert row["retries"] > 100
    assert row["retries_attached"] == 0
    assert row["executions_cancelled"] > 100
    assert all(not a.attached for a in log.attempts)


# -- the retry budget ---------------------------------------------------------------------------------


def test_budget_refuses_retries_with_429_and_a_retry_after() -> None:
    log = run("retry-budget")
    row = numbers(log)
    refused = [a for a in log.attempts if a.outcome == runlog.REFUSED_429]
    assert row["retries_refused"] == len(refused) > 0
    assert row["retries_refused_live"] == 0  # no coalescing: the budget never knows of a live execution
    for a in refused:
        assert a.attempt_no >= 1  # first attempts are never refused
        assert a.execution_id is None
        assert a.retry_after_s is not None and a.retry_after_s > 0
        assert a.ended_s == a.sent_s  # answered at once
    # The client waited the Retry-After before its next attempt.
    sent = {(a.call_index, a.attempt_no): a.sent_s for a in log.attempts}
    followed = 0
    for a in refused:
        nxt = sent.get((a.call_index, a.attempt_no + 1))
        if nxt is not None and a.retry_after_s is not None:
            followed += 1
            assert nxt == pytest.approx(a.ended_s + a.retry_after_s)
    assert followed > 0


def test_budget_admits_at_most_ten_percent_of_first_attempts_over_sixty_seconds() -> None:
    log = run("retry-budget")
    firsts = sorted(a.sent_s for a in log.attempts if a.attempt_no == 0)
    admitted = sorted(a.sent_s for a in log.attempts if a.attempt_no >= 1 and a.outcome != runlog.REFUSED_429)
    assert admitted
    for t in admitted:
        in_window = sum(1 for f in firsts if t - 60.0 < f <= t)
        retries = sum(1 for r in admitted if t - 60.0 < r <= t)
        assert retries <= 0.1 * in_window


def test_budget_first_refuses_live_calls_and_lookup_first_does_not() -> None:
    budget_first, lookup_first = run("budget-first"), run("lookup-first")
    bf, lf = numbers(budget_first), numbers(lookup_first)
    assert bf["retries_refused_live"] > 0
    assert lf["retries_refused_live"] == 0
    assert lf["retries_refused"] < bf["retries_refused"]
    assert lf["retries_attached"] > bf["retries_attached"]
    # A budget-first refusal marked live had its call's execution live when the retry was sent.
    executions = budget_first.executions
    for a in budget_first.attempts:
        if a.refused_live:
            assert a.outcome == runlog.REFUSED_429
            assert any(e.call_index == a.call_index and e.created_s <= a.sent_s
                       and (e.finished_s is None or e.finished_s > a.sent_s) for e in executions)


# -- the proxy cap ------------------------------------------------------------------------------------


def engine_load(log: RunLog) -> list[int]:
    return [w + r for w, r in zip(log.samples.engine_waiting, log.samples.engine_running, strict=True)]


def cancelled_still_in_engine(log: RunLog, t: float, cancel_delay_s: float) -> int:
    """Executions the proxy had cancelled by time t that the engine still held (abort not yet applied)."""
    return sum(1 for e in log.executions
               if e.abort_requested_s is not None and e.abort_requested_s - cancel_delay_s <= t + 1e-9
               and (e.aborted_s is None or e.aborted_s > t) and (e.finished_s is None or e.finished_s > t))


def test_proxy_cap_without_cancellation_keeps_the_engine_within_the_cap() -> None:
    proxy = ProxyPolicy(max_outstanding=100)
    log = simulate_with(proxy)
    assert max(log.samples.proxy_waiting) > 0
    load = engine_load(log)
    assert max(load) == 100  # the cap binds
    assert all(n <= 100 for n in load)


@pytest.mark.parametrize("name", ["proxy-cap", "lifo"])
def test_proxy_cap_with_cancellation_queues_and_bounds_the_engine(name: str) -> None:
    log = run(name)
    proxy = load_condition(name).proxy
    assert proxy.max_outstanding == 100
    assert max(log.samples.proxy_waiting) > 0
    # Over the cap only by executions the proxy cancelled and the engine has not yet aborted.
    for t, n in enumerate(engine_load(log)):
        assert n <= 100 + cancelled_still_in_engine(log, float(t), proxy.cancel_delay_s)


def test_lifo_drops_queued_executions_that_never_reach_the_engine() -> None:
    log = run("lifo")
    row = numbers(log)
    dropped = [e for e in log.executions if e.fate == runlog.FATE_DROPPED]
    assert row["executions_dropped"] == len(dropped) > 0
    for e in dropped:
        assert e.accepted_s is None and e.first_scheduled_s is None and e.computed_prompt_tokens == 0
    # Every attempt of a dropped execution timed out.
    dropped_ids = {e.execution_id for e in dropped}
    assert all(a.outcome == runlog.TIMED_OUT for a in log.attempts if a.execution_id in dropped_ids)


# -- deferred cancellation ----------------------------------------------------------------------------


def test_deferred_cancellation_cancels_nothing_when_every_timed_out_call_retries() -> None:
    """With retries enough that no call gives up, every departure is followed by a retry within
    0.25-3 s < 10 s: the deferral never cancels, and the run is coalescing without cancellation."""
    patient = ClientPolicy(attempt_timeout_s=20, max_retries=10)
    deferred, coalescing = run("deferred-cancellation", patient), run("coalescing", patient)
    assert all(c.delivered_s is not None for c in deferred.calls)
    assert sum(1 for a in deferred.attempts if a.outcome == runlog.TIMED_OUT) > 100
    assert numbers(deferred)["executions_cancelled"] == 0
    assert all(e.abort_requested_s is None for e in deferred.executions)
    assert [e.fate for e in deferred.executions] == [e.fate for e in coalescing.executions]
    assert deferred.digest() == coalescing.digest()


def test_deferred_cancellation_cancels_only_after_a_call_gives_up() -> None:
    log = run("deferred-cancellation")
    row = numbers(log)
    assert row["retries_attached"] > 0
    calls_by_index = {c.index: c for c in log.calls}
    cancelled = [e for e in log.executions if e.fate == runlog.FATE_CANCELLED]
    assert cancelled  # some calls gave up after their last attempt: cleanup ran, 10 s late
    policy = load_condition("deferred-cancellation").proxy
    for e in cancelled:
        call = calls_by_index[e.call_index]
        assert call.failed_reason == "attempts_exhausted"
        assert call.delivered_s is None
        assert e.abort_requested_s is not None and call.failed_s is not None
        assert e.abort_requested_s == pytest.approx(call.failed_s + policy.defer_s + policy.cancel_delay_s)


# -- determinism --------------------------------------------------------------------------------------


def test_lifo_runs_are_deterministic() -> None:
    condition = load_condition("lifo")
    client = replace(condition.client, attempt_timeout_s=20)
    first, second = simulate_with(condition.proxy, client), simulate_with(condition.proxy, client)
    assert first.digest() == second.digest()
    assert first == second
    assert numbers(first)["executions_dropped"] > 0  # the LIFO path was exercised


# -- result retention (beyond the paper) --------------------------------------------------------------


def test_retention_serves_the_retries_that_arrive_after_their_execution_completed() -> None:
    """With coalescing alone, a retry sent after its call's execution completed for nobody finds
    nothing to attach to and computes the call again; with the response kept, it is answered at
    once and no call is computed twice."""
    plain, kept = run("coalescing"), run("coalescing-retain")
    served = [a for a in kept.attempts if a.retained]
    assert served, "no retry arrived after its execution completed: the test's trace does not exercise retention"
    executions = {e.execution_id: e for e in kept.executions}
    for a in served:
        assert a.outcome == runlog.COMPLETED and a.ended_s == a.sent_s
        assert a.execution_id is not None
        finished = executions[a.execution_id].finished_s
        assert finished is not None and a.sent_s - finished < 10.0, "served outside the 10-s window"
        assert executions[a.execution_id].fate == runlog.FATE_COMPLETED  # its response reached a client
    per_call: defaultdict[int, int] = defaultdict(int)
    for e in kept.executions:
        per_call[e.call_index] += 1
    assert max(per_call.values()) == 1, "a call was computed twice although its response was kept"
    assert len(kept.executions) < len(plain.executions)
    assert numbers(kept)["calls_delivered"] >= numbers(plain)["calls_delivered"]
    assert numbers(kept)["attempts_served_retained"] == len(served)
    assert "attempts_served_retained" not in numbers(plain)
