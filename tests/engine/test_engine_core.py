"""EngineCore: the batch pipeline (async scheduling keeps two batches in flight), aborts applied at a
batch's completion, the engine queue cap, the event stream and the trace."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from retrybench.conditions.config import EngineConfig
from retrybench.engine.core import EngineCore, EngineEvent
from retrybench.engine.profiles import EngineProfile, profile_for

MODEL = "qwen2.5-7b-instruct"


def profile(**engine: Any) -> EngineProfile:
    return profile_for(MODEL, engine=EngineConfig(**engine))


def tiny_profile(blocks: int, **engine: Any) -> EngineProfile:
    """A profile whose KV cache holds exactly `blocks` blocks (a GPU with just enough memory)."""
    base = profile(**engine)
    per_block = base.engine.block_size * base.model.kv_bytes_per_token
    have = base.kv_blocks
    gpu = dataclasses.replace(base.gpu, memory_bytes=base.gpu.memory_bytes
                              - (have - blocks - 0.5) * per_block / base.engine.gpu_memory_utilization)
    tiny = dataclasses.replace(base, gpu=gpu)
    assert tiny.kv_blocks == blocks
    return tiny


def steps(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in trace if e["event"] == "step"]


def in_flight(trace: list[dict[str, Any]]) -> int:
    return len(steps(trace)) - sum(1 for e in trace if e["event"] == "step_done")


def drain(engine: EngineCore) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    while (due := engine.next_done_s()) is not None:
        events += engine.on_batch_done(due)
    return events


# -- the pipeline ----------------------------------------------------------------------------------


def test_async_scheduling_keeps_two_batches_in_flight() -> None:
    trace: list[dict[str, Any]] = []
    engine = EngineCore(profile(async_scheduling=True), trace=trace)
    assert engine.idle
    engine.submit(0, prompt_len=20_000, max_tokens=5, prompt_key="a", now=0.0)
    issued = steps(trace)
    assert len(issued) == 2
    assert [s["prompt_tokens"] for s in issued] == [{"0": 8192}, {"0": 8192}]
    # The second batch starts when the first one ends.
    assert issued[0]["start_s"] == 0.0
    assert issued[1]["start_s"] == issued[0]["end_s"]
    assert engine.next_done_s() == issued[0]["end_s"]
    engine.on_batch_done(issued[0]["end_s"])
    assert in_flight(trace) == 2  # refilled at once
    third = steps(trace)[2]
    assert third["prompt_tokens"] == {"0": 20_000 - 2 * 8192}
    assert third["t"] == issued[0]["end_s"]
    assert third["start_s"] == issued[1]["end_s"]


def test_sync_scheduling_keeps_one_batch_in_flight() -> None:
    trace: list[dict[str, Any]] = []
    engine = EngineCore(profile(async_scheduling=False), trace=trace)
    engine.submit(0, prompt_len=20_000, max_tokens=5, prompt_key="a", now=0.0)
    assert in_flight(trace) == 1
    while (due := engine.next_done_s()) is not None:
        engine.on_batch_done(due)
        assert in_flight(trace) <= 1
    assert engine.stats[0].finished_s is not None


def test_submit_to_a_busy_engine_waits_for_the_next_batch_boundary() -> None:
    trace: list[dict[str, Any]] = []
    engine = EngineCore(profile(), trace=trace)
    engine.submit(0, prompt_len=100, max_tokens=3, prompt_key="a", now=0.0)
    n = len(steps(trace))
    engine.submit(1, prompt_len=100, max_tokens=3, prompt_key="b", now=0.0001)
    assert len(steps(trace)) == n  # queued; scheduled when a batch completes
    assert engine.num_waiting == 1
    drain(engine)
    assert engine.stats[1].finished_s is not None


# -- aborts ----------------------------------------------------------------------------------------


def test_abort_is_applied_at_batch_completion_and_the_issued_batch_is_in_flight() -> None:
    trace: list[dict[str, Any]] = []
    engine = EngineCore(profile(async_scheduling=True), trace=trace)
    engine.submit(0, prompt_len=20_000, max_tokens=5, prompt_key="a", now=0.0)
    end1 = steps(trace)[0]["end_s"]
    end2 = steps(trace)[1]["end_s"]
    engine.abort(0, end1 / 2)
    stats = engine.stats[0]
    assert stats.abort_requested_s == end1 / 2
    assert stats.aborted_s is None  # not yet: the core applies aborts between steps
    assert engine.num_running == 1
    events = engine.on_batch_done(end1)
    assert events == []
    assert stats.aborted_s == end1
    # Batch k+1 was issued before the abort was applied: its 8,192 prompt tokens still run.
    assert stats.in_flight_prompt_tokens == 8192
    assert stats.computed_prompt_tokens == 2 * 8192
    assert engine.num_running == 0 and engine.num_waiting == 0
    assert engine.next_done_s() == end2  # batch k+1 still runs to completion
    assert engine.on_batch_done(end2) == []
    assert engine.idle
    assert engine.scheduler.counters.prompt_tokens_total == 0  # never produced an output
    assert engine.scheduler.pool.used == 0
    aborted = [e for e in trace if e["event"] == "aborted"]
    assert aborted == [{"t": end1, "event": "aborted", "execution": 0, "computed_prompt_tokens": 16384,
                        "in_flight_prompt_tokens": 8192, "unscheduled": False}]


def test_abort_without_async_scheduling_has_nothing_in_flight() -> None:
    trace: list[dict[str, Any]] = []
    engine = EngineCore(profile(async_scheduling=False), trace=trace)
    engine.submit(0, prompt_len=20_000, max_tokens=5, prompt_key="a", now=0.0)
    end1 = steps(trace)[0]["end_s"]
    engine.abort(0, end1 / 2)
    engine.on_batch_done(end1)
    stats = engine.stats[0]
    assert stats.aborted_s == end1
    assert stats.in_flight_prompt_tokens == 0
    assert stats.computed_prompt_tokens == 8192
    assert engine.idle


def test_abort_of_a_waiting_request_counts_no_work() -> None:
    engine = EngineCore(profile(max_num_seqs=1))
    engine.submit(0, prompt_len=500, max_tokens=5, prompt_key="a", now=0.0)
    engine.submit(1, prompt_len=500, max_tokens=5, prompt_key="b", now=0.0)
    assert engine.num_waiting == 1
    engine.abort(1, 0.001)
    due = engine.next_done_s()
    assert due is not None
    engine.on_batch_done(due)
    stats = engine.stats[1]
    assert stats.aborted_s == due
    assert stats.first_scheduled_s is None
    assert stats.computed_prompt_tokens == 0
    assert stats.in_flight_prompt_tokens == 0
    drain(engine)
    assert engine.stats[0].finished_s is not None
    assert engine.scheduler.counters.prefix_cache_queries_total == 500


def test_abort_on_an_idle_engine_is_applied_at_once() -> None:
    engine = EngineCore(profile())
    engine.submit(0, prompt_len=100, max_tokens=2, prompt_key="a", now=0.0)
    drain(engine)
    engine.abort(0, 5.0)  # already finished: ignored
    assert engine.stats[0].abort_requested_s is None
    engine.abort(42, 5.0)  # unknown: ignored
    assert engine.live_requests() == 0


def test_second_abort_is_ignored() -> None:
    engine = EngineCore(profile(max_num_queued_reqs=2))
    engine.submit(0, prompt_len=20_000, max_tokens=5, prompt_key="a", now=0.0)
    engine.abort(0, 0.01)
    engine.abort(0, 0.02)
    assert engine.stats[0].abort_requested_s == 0.01
    # The slot was freed once, not twice.
    assert engine.submit(1, prompt_len=100, max_tokens=1, prompt_key="b", now=0.03)
    assert engine.submit(2, prompt_len=100, max_tokens=1, prompt_key="c", now=0.03)
    assert not engine.submit(3, prompt_len=100, max_tokens=1, prompt_key="d", now=0.03)


# -- the queue cap ---------------------------------------------------------------------------------


def test_queue_cap_refuses_when_unfinished_plus_one_exceeds_it() -> None:
    engine = EngineCore(profile(max_num_queued_reqs=3))
    for rid in range(3):
        assert engine.submit(rid, prompt_len=5000, max_tokens=10, prompt_key=rid, now=0.0)
    assert engine.num_waiting + engine.num_running == 3
    assert not engine.submit(3, prompt_len=100, max_tokens=1, prompt_key=3, now=0.0)
    assert 3 not in engine.stats  # never queued
    assert engine.live_requests() == 3


def test_an_abort_frees_a_queue_slot_at_once() -> None:
    engine = EngineCore(profile(max_num_queued_reqs=2))
    assert engine.submit(0, prompt_len=20_000, max_tokens=10, prompt_key=0, now=0.0)
    assert engine.submit(1, prompt_len=20_000, max_tokens=10, prompt_key=1, now=0.0)
    assert not engine.submit(2, prompt_len=100, max_tokens=1, prompt_key=2, now=0.01)
    engine.abort(0, 0.02)
    assert engine.stats[0].aborted_s is None  # the core has not applied it yet ...
    assert engine.submit(2, prompt_len=100, max_tokens=1, prompt_key=2, now=0.02)  # ... but the slot is free


def test_finishing_frees_a_queue_slot() -> None:
    engine = EngineCore(profile(max_num_queued_reqs=1))
    assert engine.submit(0, prompt_len=100, max_tokens=2, prompt_key=0, now=0.0)
    assert not engine.submit(1, prompt_len=100, max_tokens=2, prompt_key=1, now=0.0)
    drain(engine)
    assert engine.submit(1, prompt_len=100, max_tokens=2, prompt_key=1, now=1.0)


def test_no_cap_accepts_everything() -> None:
    engine = EngineCore(profile())
    assert all(engine.submit(rid, prompt_len=100, max_tokens=1, prompt_key=rid, now=0.0) for rid in range(300))


# -- events and step times -------------------------------------------------------------------------


def play(engine: EngineCore, arrivals: list[tuple[float, int, int, int]],
         aborts: list[tuple[float, int]]) -> list[EngineEvent]:
    """A tiny driver: arrivals (t, rid, prompt, max_tokens) and aborts (t, rid) at their times,
    batch completions at next_done_s(); engine output first at equal times."""
    heap: list[tuple[float, int, int, tuple[int, ...]]] = []
    for i, (t, rid, prompt, max_tokens) in enumerate(arrivals):
        heapq.heappush(heap, (t, 1, i, (rid, prompt, max_tokens)))
    for i, (t, rid) in enumerate(aborts):
        heapq.heappush(heap, (t, 2, i, (rid,)))
    events: list[EngineEvent] = []
    while True:
        due = engine.next_done_s()
        if heap and (due is None or heap[0][0] < due):
            t, kind, _i, payload = heapq.heappop(heap)
            if kind == 1:
                rid, prompt, max_tokens = payload
                engine.submit(rid, prompt_len=prompt, max_tokens=max_tokens, prompt_key=rid, now=t)
            else:
                engine.abort(payload[0], t)
        elif due is not None:
            events += engine.on_batch_done(due)
        else:
            return events


@settings(max_examples=40, deadline=None, database=None)
@given(
    arrivals=st.lists(st.tuples(st.floats(0, 2), st.integers(20, 12_000), st.integers(1, 60)),
                      min_size=1, max_size=8),
    aborts=st.lists(st.tuples(st.floats(0, 3), st.integers(0, 7)), max_size=4),
    async_scheduling=st.booleans(),
    slack=st.one_of(st.none(), st.integers(0, 8)),
)
def test_events_come_in_time_order_and_every_request_ends(
    arrivals: list[tuple[float, int, int]], aborts: list[tuple[float, int]], async_scheduling: bool,
    slack: int | None,
) -> None:
    if slack is None:
        prof = profile(async_scheduling=async_scheduling)
    else:  # a KV cache that just fits the largest request: preemptions
        need = max(-(-(prompt + max_tokens) // 16) for _t, prompt, max_tokens in arrivals)
        prof = tiny_profile(need + slack, async_scheduling=async_scheduling)
    trace: list[dict[str, Any]] = []
    engine = EngineCore(prof, trace=trace)
    plan = [(t, rid, prompt, max_tokens) for rid, (t, prompt, max_tokens) in enumerate(arrivals)]
    events = play(engine, plan, [(t, rid) for t, rid in aborts if rid < len(plan)])
    times = [e.at_s for e in events]
    assert times == sorted(times)
    firsts = [e.rid for e in events if e.kind == "first_token"]
    finished = [e.rid for e in events if e.kind == "finished"]
    assert len(firsts) == len(set(firsts))
    assert len(finished) == len(set(finished))
    assert set(finished) <= set(firsts)
    for rid, stats in engine.stats.items():
        request_aborted = stats.aborted_s is not None
        assert request_aborted != (stats.finished_s is not None), rid  # exactly one end
        assert stats.first_scheduled_s is None or stats.first_scheduled_s >= stats.queued_s
        if stats.first_token_s is not None:
            assert stats.first_scheduled_s is not None
            assert stats.first_token_s > stats.first_scheduled_s
        if stats.finished_s is not None:
            assert rid in finished
            assert stats.first_token_s is not None and stats.finished_s >= stats.first_token_s
        if request_aborted:
            assert stats.abort_requested_s is not None
            assert stats.aborted_s is not None and stats.aborted_s >= stats.abort_requested_s
            assert stats.in_flight_prompt_tokens <= stats.computed_prompt_tokens
            assert rid not in finished
    assert engine.idle and engine.live_requests() == 0
    assert engine.scheduler.pool.used == 0
    # Every preemption is in the trace (steps that only preempted included); the counter misses
    # only those of requests aborted before their next output.
    preemptions = sum(stats.preemptions for stats in engine.stats.values())
    assert sum(1 for e in trace if e["event"] == "preempted") == preemptions
    counted = engine.scheduler.counters.num_preemptions_total
    assert sum(st.preemptions for st in engine.stats.values() if st.finished_s is not None) <= counted
    assert counted <= preemptions
    if not aborts:
        assert counted == preemptions
    issued = steps(trace)
    for step in issued:
        assert step["end_s"] > step["start_s"] >= step["t"]
    # Pipelined: each step starts when the previous one ends, or later when the engine was idle.
    for before, after in itertools.pairwise(issued):
        assert after["start_s"] >= before["end_s"]
    if not async_scheduling:
        for step, done in zip(issued, [e for e in trace if e["event"] == "step_done"], strict=True):
            assert done["step"] == step["step"]


def test_step_time_grows_with_tokens() -> None:
    trace: list[dict[str, Any]] = []
    engine = EngineCore(profile(async_scheduling=False), trace=trace)
    engine.submit(0, prompt_len=8192 + 100, max_tokens=3, prompt_key=0, now=0.0)
    drain(engine)
    durations = [s["end_s"] - s["start_s"] for s in steps(trace)]
    sizes = [sum(s["prompt_tokens"].values()) + len(s["decode"]) for s in steps(trace)]
    assert sizes == [8192, 100, 1, 1]
    assert all(d > 0 for d in durations)
    assert durations[0] > durations[1] > 0  # (a decode step reads one more context token than
    # the last chunk, so memory-bound steps of 100 and 1 tokens cost about the same)


def test_first_token_and_finished_events() -> None:
    engine = EngineCore(profile())
    engine.submit(0, prompt_len=300, max_tokens=3, prompt_key=0, now=0.0)
    events = drain(engine)
    assert [(e.kind, e.rid) for e in events] == [("first_token", 0), ("finished", 0)]
    stats = engine.stats[0]
    assert stats.first_token_s == events[0].at_s
    assert stats.finished_s == events[1].at_s
    assert stats.computed_prompt_tokens == 300
    assert stats.prompt_tokens == 300
    assert engine.scheduler.counters.prompt_tokens_total == 300
    assert engine.scheduler.counters.generation_tokens_total == 3


def test_max_tokens_one_finishes_with_its_first_token() -> None:
    engine = EngineCore(profile())
    engine.submit(0, prompt_len=300, max_tokens=1, prompt_key=0, now=0.0)
    events = drain(engine)
    assert [(e.kind, e.rid, e.at_s) for e in events] == [
        ("first_token", 0, events[0].at_s), ("finished", 0, events[0].at_s)]


def test_tiny_profile_fixture_works() -> None:
    prof = tiny_profile(10)
    engine = EngineCore(prof, prefix_tokens=0)
    assert engine.scheduler.pool.num_blocks == 10
    engine.submit(0, prompt_len=100, max_tokens=2, prompt_key=0, now=0.0)
    drain(engine)
    assert engine.stats[0].finished_s is not None


def test_preemptions_are_traced_and_counted() -> None:
    trace: list[dict[str, Any]] = []
    engine = EngineCore(tiny_profile(10), prefix_tokens=0, trace=trace)
    engine.submit(0, prompt_len=64, max_tokens=50, prompt_key=0, now=0.0)
    engine.submit(1, prompt_len=64, max_tokens=50, prompt_key=1, now=0.0)
    events = drain(engine)
    assert sorted(e.rid for e in events if e.kind == "finished") == [0, 1]
    preempted = [e["execution"] for e in trace if e["event"] == "preempted"]
    assert preempted  # two 64-token requests whose 50 outputs need 14 blocks of 10
    assert set(preempted) == {1}  # always the last running request
    assert engine.stats[1].preemptions == len(preempted)
    assert engine.stats[0].preemptions == 0
    assert engine.scheduler.counters.num_preemptions_total == len(preempted)
    assert engine.stats[1].recomputed_tokens > 0
    assert engine.scheduler.counters.prompt_tokens_total == 128  # once per request
