"""simulate(): determinism, call and attempt accounting, and the cancellation timing it carries out."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from functools import cache
from typing import Any

import pytest

from retrybench.conditions.config import ClientPolicy, EngineConfig, ProxyPolicy, WorkloadSpec
from retrybench.engine.profiles import EngineProfile, profile_for
from retrybench.records import runlog
from retrybench.records.runlog import AttemptRecord, RunLog
from retrybench.sim.run import simulate
from retrybench.traffic.workload import Call, generate_trace

SPEC = WorkloadSpec(chat_calls_per_s=0.5, base_s=20, pulse_s=10, hold_s=30)
META: dict[str, Any] = {"test": "sim", "pulse_start_s": SPEC.pulse_start_s, "pulse_end_s": SPEC.pulse_end_s,
                        "hold_end_s": SPEC.hold_end_s}
# A deadline short enough that this small trace times attempts out (retries, cancellations).
TIGHT = 5.0


@cache
def calls(seed: int = 7) -> tuple[Call, ...]:
    return generate_trace(SPEC, seed).calls


@cache
def qwen() -> EngineProfile:
    return profile_for("qwen2.5-7b-instruct")


def run(*, client: ClientPolicy | None = None, proxy: ProxyPolicy | None = None, seed: int = 1,
        trace_seed: int = 7, trace: list[dict[str, Any]] | None = None) -> RunLog:
    return simulate(qwen(), calls(trace_seed), client=client or ClientPolicy(),
                    proxy=proxy or ProxyPolicy(cancellation="immediate"), seed=seed, meta=dict(META),
                    trace=trace)


def test_trace_is_small_but_not_empty() -> None:
    assert 10 <= len(calls()) <= 80


# -- determinism -------------------------------------------------------------------------------------


@pytest.mark.parametrize("client", [ClientPolicy(), ClientPolicy(attempt_timeout_s=TIGHT)])
def test_same_inputs_give_the_same_digest(client: ClientPolicy) -> None:
    digests = {run(client=client).digest() for _ in range(3)}
    assert len(digests) == 1


def test_digest_survives_a_json_round_trip() -> None:
    log = run(client=ClientPolicy(attempt_timeout_s=TIGHT))
    again = RunLog.from_json(log.to_json())
    assert again.digest() == log.digest()
    assert again == log


def test_a_different_trace_seed_gives_a_different_digest() -> None:
    assert run(trace_seed=7).digest() != run(trace_seed=8).digest()


def test_a_different_client_seed_changes_the_backoffs() -> None:
    client = ClientPolicy(attempt_timeout_s=TIGHT)
    a, b = run(client=client, seed=1), run(client=client, seed=2)
    assert any(r.attempt_no > 0 for r in a.attempts)  # retries happened, so backoffs were drawn
    assert a.digest() != b.digest()


def test_the_client_seed_is_only_used_for_backoffs() -> None:
    # With no retry drawn the client's seed cannot matter.
    no_retry = ClientPolicy(retries=False, attempt_timeout_s=TIGHT)
    assert run(client=no_retry, seed=1).digest() == run(client=no_retry, seed=2).digest()


def test_meta_is_kept() -> None:
    assert run().meta == META


# -- calls and attempts -------------------------------------------------------------------------------


POLICIES = [
    (ClientPolicy(), ProxyPolicy(cancellation="immediate")),
    (ClientPolicy(attempt_timeout_s=TIGHT), ProxyPolicy(cancellation="off")),
    (ClientPolicy(attempt_timeout_s=TIGHT), ProxyPolicy(cancellation="immediate")),
    (ClientPolicy(attempt_timeout_s=TIGHT), ProxyPolicy(cancellation="deferred", defer_s=2.0)),
    (ClientPolicy(retries=False, attempt_timeout_s=TIGHT), ProxyPolicy(cancellation="immediate")),
    (ClientPolicy(attempt_timeout_s=TIGHT, max_retries=1), ProxyPolicy(cancellation="off")),
]


@pytest.mark.parametrize(("client", "proxy"), POLICIES)
def test_every_call_ends_delivered_or_failed(client: ClientPolicy, proxy: ProxyPolicy) -> None:
    log = run(client=client, proxy=proxy)
    assert len(log.calls) == len(calls())
    by_call = Counter(a.call_index for a in log.attempts)
    for call in log.calls:
        assert (call.delivered_s is None) != (call.failed_s is None), call
        assert 1 <= call.attempts <= client.max_attempts
        assert by_call[call.index] == call.attempts
        if call.delivered_s is not None:
            assert call.failed_reason is None
            assert call.delivered_s >= call.arrival_s
        else:
            assert call.failed_reason == "attempts_exhausted"
            assert call.attempts == client.max_attempts
    for attempt in log.attempts:
        assert attempt.outcome in (runlog.COMPLETED, runlog.TIMED_OUT, runlog.REFUSED_503)
        assert attempt.ended_s >= attempt.sent_s
        if attempt.outcome == runlog.TIMED_OUT:
            assert attempt.ended_s == pytest.approx(attempt.sent_s + client.attempt_timeout_s)
        if attempt.outcome == runlog.COMPLETED:
            assert attempt.ended_s <= attempt.sent_s + client.attempt_timeout_s
    # Delivered calls end with a completed attempt, at its end.
    last: dict[int, AttemptRecord] = {}
    for attempt in log.attempts:
        if attempt.call_index not in last or attempt.attempt_no > last[attempt.call_index].attempt_no:
            last[attempt.call_index] = attempt
    for call in log.calls:
        if call.delivered_s is not None:
            assert last[call.index].outcome == runlog.COMPLETED
            assert last[call.index].ended_s == call.delivered_s
    # Pass-through: one execution per attempt.
    assert len(log.executions) == len(log.attempts)
    # (with as many attempts as executions, an attempt without one leaves the lists unequal)
    assert sorted(a.execution_id for a in log.attempts if a.execution_id is not None) == [
        e.execution_id for e in log.executions]


def test_tight_deadlines_do_time_attempts_out() -> None:
    log = run(client=ClientPolicy(attempt_timeout_s=TIGHT))
    outcomes = Counter(a.outcome for a in log.attempts)
    assert outcomes[runlog.TIMED_OUT] > 0
    assert outcomes[runlog.COMPLETED] > 0


def test_retries_off_means_one_attempt_per_call() -> None:
    log = run(client=ClientPolicy(retries=False, attempt_timeout_s=TIGHT))
    assert all(call.attempts == 1 for call in log.calls)
    assert Counter(a.call_index for a in log.attempts) == Counter(range(len(log.calls)))
    assert all(a.attempt_no == 0 for a in log.attempts)
    assert any(call.failed_s is not None for call in log.calls)


def test_retries_follow_the_timeout_after_a_backoff() -> None:
    client = ClientPolicy(attempt_timeout_s=TIGHT)
    log = run(client=client)
    attempts = {(a.call_index, a.attempt_no): a for a in log.attempts}
    retried = [a for a in log.attempts if a.attempt_no > 0]
    assert retried
    for a in retried:
        before = attempts[(a.call_index, a.attempt_no - 1)]
        assert before.outcome == runlog.TIMED_OUT
        wait = a.sent_s - before.ended_s
        assert client.backoff_min_s - 1e-9 <= wait <= client.backoff_max_s + 1e-9


# -- cancellation timing ------------------------------------------------------------------------------


def executions_by_id(log: RunLog) -> dict[int, runlog.ExecutionRecord]:
    return {e.execution_id: e for e in log.executions}


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3])
def test_immediate_cancellation_reaches_the_engine_after_the_cancel_delay(delay: float) -> None:
    log = run(client=ClientPolicy(attempt_timeout_s=TIGHT),
              proxy=ProxyPolicy(cancellation="immediate", cancel_delay_s=delay))
    execs = executions_by_id(log)
    timed_out = [a for a in log.attempts if a.outcome == runlog.TIMED_OUT]
    assert timed_out
    cancelled = 0
    for a in timed_out:
        assert a.execution_id is not None
        e = execs[a.execution_id]
        if e.abort_requested_s is not None:
            cancelled += 1
            assert e.abort_requested_s - a.ended_s == pytest.approx(delay, abs=1e-9)
            assert e.fate == runlog.FATE_CANCELLED
            assert e.aborted_s is not None and e.aborted_s >= e.abort_requested_s
            assert e.finished_s is None
        else:
            # The engine finished it before the close arrived.
            assert e.finished_s is not None
            assert e.finished_s <= a.ended_s + delay
            assert e.fate == runlog.FATE_ORPHANED
    assert cancelled > 0
    # Nothing that completed for its subscriber is aborted.
    for a in log.attempts:
        if a.outcome == runlog.COMPLETED:
            assert a.execution_id is not None
            e = execs[a.execution_id]
            assert e.abort_requested_s is None and e.fate == runlog.FATE_COMPLETED


def test_deferred_cancellation_waits_defer_s_plus_the_delay() -> None:
    proxy = ProxyPolicy(cancellation="deferred", defer_s=2.0, cancel_delay_s=0.05)
    log = run(client=ClientPolicy(attempt_timeout_s=TIGHT), proxy=proxy)
    execs = executions_by_id(log)
    cancelled = 0
    for a in log.attempts:
        if a.outcome != runlog.TIMED_OUT:
            continue
        assert a.execution_id is not None
        e = execs[a.execution_id]
        if e.abort_requested_s is not None:
            cancelled += 1
            assert e.abort_requested_s - a.ended_s == pytest.approx(2.05, abs=1e-9)
        else:
            assert e.finished_s is not None and e.finished_s <= a.ended_s + 2.05
    assert cancelled > 0


def test_cancellation_off_orphans_timed_out_executions() -> None:
    log = run(client=ClientPolicy(attempt_timeout_s=TIGHT), proxy=ProxyPolicy(cancellation="off"))
    execs = executions_by_id(log)
    assert all(e.abort_requested_s is None and e.aborted_s is None for e in log.executions)
    timed_out = [a for a in log.attempts if a.outcome == runlog.TIMED_OUT]
    assert timed_out
    for a in timed_out:
        assert a.execution_id is not None
        assert execs[a.execution_id].fate == runlog.FATE_ORPHANED


def test_engine_queue_cap_refusals_are_503s() -> None:
    capped = dataclasses.replace(qwen(), engine=EngineConfig(max_num_queued_reqs=2))
    log = simulate(capped, calls(), client=ClientPolicy(attempt_timeout_s=TIGHT),
                   proxy=ProxyPolicy(cancellation="immediate"), seed=1, meta={})
    refused = [a for a in log.attempts if a.outcome == runlog.REFUSED_503]
    assert refused
    execs = executions_by_id(log)
    for a in refused:
        assert a.execution_id is not None
        e = execs[a.execution_id]
        assert e.fate == runlog.FATE_REFUSED
        assert e.accepted_s is None and e.refused_s == a.ended_s == a.sent_s
    for call in log.calls:
        assert (call.delivered_s is None) != (call.failed_s is None)


# -- the run log's engine side ------------------------------------------------------------------------


def test_execution_records_are_consistent() -> None:
    log = run(client=ClientPolicy(attempt_timeout_s=TIGHT))
    for e in log.executions:
        assert e.accepted_s == e.created_s  # dispatched at once, no cap
        if e.first_scheduled_s is not None:
            assert e.first_scheduled_s >= e.accepted_s
        if e.first_token_s is not None:
            assert e.first_scheduled_s is not None and e.first_token_s > e.first_scheduled_s
        if e.finished_s is not None:
            assert e.first_token_s is not None and e.finished_s >= e.first_token_s
        assert e.computed_prompt_tokens >= 0
        if e.fate == runlog.FATE_COMPLETED:
            # Computed or taken from the prefix cache, the whole prompt was prefilled.
            assert 0 < e.computed_prompt_tokens <= e.prompt_tokens or e.preemptions > 0
    counters = log.counters
    started = sum(e.prompt_tokens for e in log.executions if e.first_token_s is not None)
    assert counters["prompt_tokens_total"] == started
    assert counters["prefix_cache_queries_total"] >= counters["prompt_tokens_total"]
    assert counters["prefix_cache_hits_total"] <= counters["prefix_cache_queries_total"]


def test_queue_samples_once_per_second() -> None:
    log = run()
    n = len(log.samples.engine_waiting)
    assert n == math.floor(log.end_s) + 1  # t = 0, 1, ..., floor(end_s)
    for series in (log.samples.engine_running, log.samples.proxy_waiting, log.samples.prompt_tokens_total,
                   log.samples.prefix_cache_queries_total):
        assert len(series) == n
    totals = log.samples.prompt_tokens_total
    assert totals == sorted(totals)  # a counter never decreases
    assert totals[-1] <= log.counters["prompt_tokens_total"]
    queries = log.samples.prefix_cache_queries_total
    assert queries == sorted(queries)
    assert all(q >= p for q, p in zip(queries, totals, strict=True))  # admitted before the first token
    assert all(x >= 0 for x in log.samples.engine_waiting)


def test_trace_is_recorded_when_asked() -> None:
    trace: list[dict[str, Any]] = []
    log = run(client=ClientPolicy(attempt_timeout_s=TIGHT), trace=trace)
    kinds = Counter(e["event"] for e in trace)
    assert kinds["queued"] == len(log.executions)
    assert kinds["finished"] == sum(1 for e in log.executions if e.finished_s is not None)
    assert kinds["aborted"] == sum(1 for e in log.executions if e.aborted_s is not None)
    times = [e["t"] for e in trace]
    assert times == sorted(times)
    assert run(client=ClientPolicy(attempt_timeout_s=TIGHT)).digest() == log.digest()  # tracing changes nothing


# -- the end of a run ---------------------------------------------------------------------------------


def one_long_call() -> list[Call]:
    """One call that cannot finish within a 5-s deadline: 12,000 prompt tokens, 2,000 to generate."""
    return [Call(index=0, call_id="call-0-000000", arrival_s=0.0, prompt_tokens=12_000, response_tokens=2000,
                 phase="base")]


def lone_timeout(mode: str) -> RunLog:
    return simulate(qwen(), one_long_call(), client=ClientPolicy(retries=False, attempt_timeout_s=TIGHT),
                    proxy=ProxyPolicy(cancellation=mode, cancel_delay_s=0.05), seed=1, meta={})


def test_a_lone_call_that_times_out_fails() -> None:
    log = lone_timeout("off")
    assert [a.outcome for a in log.attempts] == [runlog.TIMED_OUT]
    assert log.calls[0].failed_s == TIGHT
    assert log.end_s == TIGHT
    (e,) = log.executions
    assert e.first_token_s is not None and e.finished_s is None  # it was decoding at the deadline
    assert e.fate == runlog.FATE_ORPHANED


def test_the_last_timed_out_execution_is_cancelled_under_immediate_cancellation() -> None:
    log = lone_timeout("immediate")
    (e,) = log.executions
    assert e.abort_requested_s == pytest.approx(TIGHT + 0.05)
    assert e.fate == runlog.FATE_CANCELLED


def test_an_execution_live_at_the_end_reports_its_computed_prompt() -> None:
    # (ExecutionStats used to be filled only when an execution finished or was aborted, so one
    # still running at the run's end was logged with 0 computed prompt tokens.)
    log = lone_timeout("off")
    (e,) = log.executions
    assert e.first_token_s is not None  # the whole prompt was prefilled ...
    assert e.computed_prompt_tokens == 12_000  # ... none of it from the cache (the first call)
