"""The step-level scheduler model against vLLM V1's rules (docs/vllm-v1-semantics.md).

Random workloads drive `schedule()` / `update_from_output()` directly, sometimes with one batch of
lag (asynchronous scheduling) and random aborts; every batch and every pool state is checked.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from retrybench.conditions.config import EngineConfig
from retrybench.engine.scheduler import ABORTED, FINISHED, RUNNING, WAITING, Batch, Request, Scheduler

BS = 16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def make_scheduler(*, budget: int = 8192, seqs: int = 256, blocks: int = 10_000, prefix: int = 0,
                   caching: bool = True) -> Scheduler:
    config = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=seqs, block_size=BS,
                          enable_prefix_caching=caching)
    return Scheduler(config, blocks, prefix)


def new_request(s: Scheduler, rid: int, prompt: int, max_tokens: int, key: object = None) -> Request:
    key = rid if key is None else key
    return Request(rid, prompt, max_tokens, s.owner_for(key, prompt), float(rid))


# -- invariants checked after every schedule() and update_from_output() -----------------------------


def check_pool(s: Scheduler, live: list[Request]) -> None:
    """Pool accounting: used blocks = private blocks + the top reference of each owner."""
    pool = s.pool
    assert 0 <= pool.free <= pool.num_blocks
    assert pool.free + pool.used == pool.num_blocks
    owners = {id(s.prefix): s.prefix}
    for r in live:
        owners[id(r.own)] = r.own
    held = sum(r.anon for r in s.running) + sum(o.max_ref() for o in owners.values())
    assert pool.used == held
    assert pool.used <= pool.num_blocks
    for o in owners.values():
        assert 0 <= o.cached <= o.size
        assert o.max_ref() <= o.cached
    for r in s.running:
        assert r.status == RUNNING
        assert r.anon >= 0
        # Blocks held always cover exactly the tokens computed or scheduled.
        assert r.blocks == cdiv(r.num_computed, BS), (r.rid, r.blocks, r.num_computed)
    for r in s.waiting:
        assert r.status == WAITING
        assert r.blocks == 0
        assert r.num_computed == 0
    # Every live holder has one reference (possibly of 0 blocks) on each of its owners.
    assert len(s.prefix.refs) == len(s.running)
    assert len(s.running) <= s.config.max_num_seqs
    assert len({r.rid for r in s.running}) == len(s.running)


def check_batch(s: Scheduler, batch: Batch, waiting_before: list[int]) -> None:
    config = s.config
    rids = [r.rid for r, *_ in batch.entries] + [r.rid for r, _e in batch.decode]
    assert len(rids) == len(set(rids)), "a request scheduled twice in one step"
    tokens = sum(n for _r, n, _s, _e in batch.entries) + len(batch.decode)
    assert batch.tokens == tokens
    assert batch.tokens <= config.max_num_batched_tokens
    # A step with no tokens is only returned to report a preemption.
    assert batch.tokens > 0 or batch.preempted
    assert batch.seqs == len(rids) <= config.max_num_seqs
    assert batch.sampled == sum(sm for _r, _n, sm, _e in batch.entries) + len(batch.decode)
    assert len(batch.prompt_tokens) == len(batch.entries)
    for (r, n, _sm, _e), prompt in zip(batch.entries, batch.prompt_tokens, strict=True):
        assert n > 0
        assert 0 <= prompt <= n
        assert r.status == RUNNING  # a request given tokens this step is not preempted in it
        if prompt:
            assert r.num_computed <= r.prefill_len  # never more prompt than the prompt needs
    if batch.preempted:
        # No waiting request is admitted in a step that preempted something, and the preempted
        # requests are at the FRONT of the waiting queue (the last one preempted first).
        assert batch.admitted == []
        front = [r.rid for r in list(s.waiting)[: len(batch.preempted)]]
        assert front == list(reversed(batch.preempted))
    else:
        # FCFS: admitted requests are the head of the waiting queue, in its order.
        admitted = [rid for rid, _hit in batch.admitted]
        assert admitted == waiting_before[: len(admitted)]
    by_rid = {r.rid: r for r in s.running}
    for rid, hit in batch.admitted:
        r = by_rid[rid]
        assert hit % BS == 0
        assert 0 <= hit <= r.prefill_len - 1  # full blocks only, at most prefill_len - 1 tokens
        if r.preemptions == 0:
            assert hit <= r.prompt_len - 1


def check_request(r: Request) -> None:
    # Prompt tokens computed beyond the prompt only by recomputation after a preemption.
    assert r.computed_prompt_tokens - r.recomputed_tokens <= r.prompt_len
    assert 0 <= r.out <= r.out_scheduled <= r.max_tokens or r.status != RUNNING
    assert r.out <= r.max_tokens
    if r.preemptions == 0:
        assert r.recomputed_tokens == 0


# -- a driver ---------------------------------------------------------------------------------------


@dataclass
class Spec:
    prompt: int
    max_tokens: int
    arrive_step: int
    key: int | None  # share the prompt owner of an earlier request (a retry of the same call)
    abort_step: int | None


@dataclass
class Outcome:
    scheduler: Scheduler
    requests: list[Request]
    batches: list[Batch]
    steps: int
    preemptions_seen: int
    first_token_step: dict[int, int]


def drive(s: Scheduler, specs: list[Spec], *, lag: bool, max_steps: int = 20_000) -> Outcome:
    requests: list[Request] = []
    for i, spec in enumerate(specs):
        key = i if spec.key is None else spec.key
        prompt = specs[key].prompt if spec.key is not None else spec.prompt
        requests.append(new_request(s, i, prompt, spec.max_tokens, key))
    added: set[int] = set()
    pending: deque[Batch] = deque()
    batches: list[Batch] = []
    first_token_step: dict[int, int] = {}
    preemptions = 0
    step = 0

    def process(batch: Batch) -> None:
        before = {r.rid: r.first_token for r in requests}
        first, done = s.update_from_output(batch)
        for r in first:
            assert not before[r.rid]
            first_token_step[r.rid] = step
        for r in done:
            assert r.status == FINISHED
            assert r.out == r.max_tokens
            assert r.blocks == 0
        check_pool(s, requests)

    while step < max_steps:
        for i, spec in enumerate(specs):
            if spec.arrive_step == step:
                s.add(requests[i])
                added.add(i)
            if spec.abort_step == step and i in added and requests[i].status in (WAITING, RUNNING):
                s.finish_aborted(requests[i])
                assert requests[i].status == ABORTED
                assert requests[i].blocks == 0
                check_pool(s, requests)
        waiting_before = [r.rid for r in s.waiting]
        batch = s.schedule()
        check_pool(s, requests)
        if batch is not None:
            check_batch(s, batch, waiting_before)
            preemptions += len(batch.preempted)
            batches.append(batch)
            pending.append(batch)
        keep = 1 if lag and batch is not None else 0
        while len(pending) > keep:
            process(pending.popleft())
        for r in requests:
            check_request(r)
        step += 1
        all_arrived = len(added) == len(specs)
        if all_arrived and not pending and not s.running and not s.waiting:
            break
    return Outcome(s, requests, batches, step, preemptions, first_token_step)


# Prompt lengths 20..3000, biased towards short prompts and whole blocks so that decodes often
# need a new block with the pool full (preemption).
prompt_lengths = st.one_of(st.integers(20, 3000), st.integers(20, 400), st.integers(2, 187).map(lambda b: b * BS))
request_specs = st.lists(
    st.tuples(prompt_lengths, st.integers(1, 50), st.integers(0, 8),
              st.integers(0, 10**6), st.booleans(), st.one_of(st.none(), st.integers(0, 60))),
    min_size=1, max_size=8,
)


def build_specs(raw: list[tuple[int, int, int, int, bool, int | None]], *, aborts: bool) -> list[Spec]:
    specs: list[Spec] = []
    for i, (prompt, max_tokens, arrive, pick, share, abort) in enumerate(raw):
        key = pick % i if share and i > 0 else None
        specs.append(Spec(prompt, max_tokens, arrive, key, abort if aborts else None))
    return specs


def needed_blocks(specs: list[Spec]) -> int:
    """Blocks the largest single request needs for its whole sequence."""
    need = 0
    for spec in specs:
        prompt = specs[spec.key].prompt if spec.key is not None else spec.prompt
        need = max(need, cdiv(prompt + spec.max_tokens, BS))
    return need


SETTINGS = settings(max_examples=120, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(raw=request_specs, budget=st.integers(64, 512), seqs=st.integers(1, 6), extra=st.integers(0, 8),
       prefix=st.sampled_from([0, 160, 2000]), lag=st.booleans(), caching=st.booleans())
def test_random_workloads_finish_and_keep_invariants(
    raw: list[tuple[int, int, int, int, bool, int | None]], budget: int, seqs: int, extra: int,
    prefix: int, lag: bool, caching: bool,
) -> None:
    specs = build_specs(raw, aborts=False)
    s = make_scheduler(budget=budget, seqs=seqs, blocks=needed_blocks(specs) + extra, prefix=prefix,
                       caching=caching)
    out = drive(s, specs, lag=lag)
    target(float(out.preemptions_seen), label="preemptions")
    admitted = [rid for batch in out.batches for rid, _hit in batch.admitted]
    if out.preemptions_seen == 0:
        # FCFS: without preemptions every request is admitted once, in arrival order.
        assert admitted == sorted(range(len(specs)), key=lambda i: (specs[i].arrive_step, i))
    # Liveness: with a pool that fits the largest request, every request finishes in full.
    for r in out.requests:
        assert r.status == FINISHED, (r.rid, r.status)
        assert r.out == r.max_tokens
        assert r.first_token
    assert not s.running and not s.waiting
    assert s.pool.used == 0  # everything returned (maybe still cached)
    counters = s.counters
    assert counters.prompt_tokens_total == sum(r.prompt_len for r in out.requests)
    assert counters.prefix_cache_queries_total == sum(r.prompt_len for r in out.requests)
    assert counters.generation_tokens_total == sum(r.max_tokens for r in out.requests)
    # Every preempted request produced an output later, so every preemption is counted, and every
    # one was reported in a batch.
    assert counters.num_preemptions_total == out.preemptions_seen == sum(r.preemptions for r in out.requests)
    assert 0 <= counters.prefix_cache_hits_total <= counters.prefix_cache_queries_total
    for r in out.requests:
        if r.preemptions == 0:
            assert r.recomputed_tokens == 0
    if not caching:
        assert counters.prefix_cache_hits_total == 0
        for r in out.requests:
            # Without a cache hit the first admission computes the whole prompt, unless a
            # preemption cut its prefill short (then the rest counts as recomputed).
            if r.preemptions == 0:
                assert r.computed_prompt_tokens == r.prompt_len
            assert r.computed_prompt_tokens - r.recomputed_tokens <= r.prompt_len


@SETTINGS
@given(raw=request_specs, budget=st.integers(64, 512), seqs=st.integers(1, 6), extra=st.integers(0, 8),
       prefix=st.sampled_from([0, 160, 2000]), lag=st.booleans())
def test_random_workloads_with_aborts_keep_invariants(
    raw: list[tuple[int, int, int, int, bool, int | None]], budget: int, seqs: int, extra: int,
    prefix: int, lag: bool,
) -> None:
    specs = build_specs(raw, aborts=True)
    s = make_scheduler(budget=budget, seqs=seqs, blocks=needed_blocks(specs) + extra, prefix=prefix)
    out = drive(s, specs, lag=lag)
    target(float(out.preemptions_seen), label="preemptions")
    for r in out.requests:
        assert r.status in (FINISHED, ABORTED)
        if r.status == FINISHED:
            assert r.out == r.max_tokens
    assert s.pool.used == 0
    # Preemptions of a request aborted before its next output may go uncounted (vLLM reports a
    # preemption with the request's next output); those of finished requests are all counted.
    assert out.preemptions_seen == sum(r.preemptions for r in out.requests)
    assert (sum(r.preemptions for r in out.requests if r.status == FINISHED)
            <= s.counters.num_preemptions_total <= out.preemptions_seen)
    counted = [r for r in out.requests if r.first_token]
    # Only requests that produced a first output count, each once, by their full prompt.
    assert s.counters.prompt_tokens_total == sum(r.prompt_len for r in counted)
    assert s.counters.prefix_cache_queries_total == sum(r.prompt_len for r in out.requests if r.admitted)


def test_random_workloads_do_preempt() -> None:
    """The small pools above really exercise preemption (a guard on the generator's reach)."""
    specs = [Spec(1008, 50, 0, None, None), Spec(1008, 50, 0, None, None), Spec(1008, 50, 0, None, None)]
    s = make_scheduler(budget=256, seqs=4, blocks=needed_blocks(specs) + 60)
    out = drive(s, specs, lag=True)
    assert out.preemptions_seen > 0
    assert all(r.status == FINISHED for r in out.requests)


# -- budget, chunking, FCFS ---------------------------------------------------------------------------


def test_long_prompt_is_chunked_by_the_budget() -> None:
    s = make_scheduler(budget=256)
    r = new_request(s, 0, 1000, 3)
    s.add(r)
    sizes = []
    while (batch := s.schedule()) is not None:
        sizes.append(batch.tokens)
        s.update_from_output(batch)
    assert sizes == [256, 256, 256, 232, 1, 1]
    assert r.status == FINISHED


def test_num_computed_advances_at_scheduling_so_the_next_chunk_needs_no_output() -> None:
    s = make_scheduler(budget=256)
    r = new_request(s, 0, 600, 2)
    s.add(r)
    b1 = s.schedule()
    b2 = s.schedule()  # async: built before b1's output
    b3 = s.schedule()
    assert b1 is not None and b2 is not None and b3 is not None
    assert [b.tokens for b in (b1, b2, b3)] == [256, 256, 88]
    assert r.num_computed == 600
    assert s.schedule() is not None  # the decode of the 2nd token, scheduled ahead of outputs
    assert s.schedule() is None  # the last token is in flight


def test_one_step_admits_several_requests_in_fcfs_order() -> None:
    s = make_scheduler(budget=512)
    reqs = [new_request(s, i, 100, 5) for i in range(4)]
    for r in reqs:
        s.add(r)
    batch = s.schedule()
    assert batch is not None
    assert [rid for rid, _ in batch.admitted] == [0, 1, 2, 3]
    assert [n for _r, n, _s, _e in batch.entries] == [100, 100, 100, 100]
    assert [r.rid for r in s.running] == [0, 1, 2, 3]


def test_budget_clips_the_last_admitted_request() -> None:
    s = make_scheduler(budget=250)
    for i in range(3):
        s.add(new_request(s, i, 100, 5))
    batch = s.schedule()
    assert batch is not None
    assert [n for _r, n, _s, _e in batch.entries] == [100, 100, 50]
    assert [sm for _r, _n, sm, _e in batch.entries] == [True, True, False]


def test_max_num_seqs_limits_admission() -> None:
    s = make_scheduler(seqs=2)
    for i in range(3):
        s.add(new_request(s, i, 100, 5))
    batch = s.schedule()
    assert batch is not None
    assert batch.seqs == 2
    assert [r.rid for r in s.waiting] == [2]


def test_head_of_line_blocking_when_the_whole_prompt_does_not_fit() -> None:
    # 20 blocks; request 0 takes 10, request 1 needs 13 > 10 free, request 2 (2 blocks) would fit
    # but must wait behind 1 (strict head-of-line blocking).
    s = make_scheduler(blocks=20, budget=64)
    r0 = new_request(s, 0, 160, 200)
    r1 = new_request(s, 1, 200, 5)
    r2 = new_request(s, 2, 20, 5)
    for r in (r0, r1, r2):
        s.add(r)
    batch = s.schedule()
    assert batch is not None
    # The admission gate counts the whole prompt, not just the first 64-token chunk.
    assert [rid for rid, _ in batch.admitted] == [0]
    assert [r.rid for r in s.waiting] == [1, 2]


def test_preemption_takes_the_last_running_request_and_puts_it_at_the_front() -> None:
    # 10 blocks: two 64-token prompts take 4 blocks each; their decodes grow until one must go.
    s = make_scheduler(blocks=10, budget=512, seqs=4)
    a = new_request(s, 0, 64, 50)
    b = new_request(s, 1, 64, 50)
    c = new_request(s, 2, 64, 50)
    for r in (a, b, c):
        s.add(r)
    preempting: Batch | None = None
    for _ in range(200):
        waiting_before = [r.rid for r in s.waiting]
        batch = s.schedule()
        assert batch is not None
        check_batch(s, batch, waiting_before)
        s.update_from_output(batch)
        if batch.preempted:
            preempting = batch
            break
    assert preempting is not None
    assert preempting.preempted == [1]
    assert preempting.admitted == []
    assert [r.rid for r in s.waiting] == [1, 2]  # in FRONT of the request that never ran
    assert b.status == WAITING and b.num_computed == 0 and b.blocks == 0
    assert b.prefill_len == b.prompt_len + b.out  # recompute the outputs too
    while (batch := s.schedule()) is not None:
        s.update_from_output(batch)
    assert all(r.status == FINISHED and r.out == 50 for r in (a, b, c))
    assert b.preemptions >= 1
    assert s.counters.num_preemptions_total == a.preemptions + b.preemptions + c.preemptions
    assert b.recomputed_tokens > 0


def self_preempting_setup() -> tuple[Scheduler, Request, Request, Batch]:
    """a's last token is in flight (async lag), b needs a new block with the pool full: b, the last
    running request, preempts itself and nothing else can be scheduled in that step."""
    s = make_scheduler(blocks=10, budget=512, seqs=4)
    a = new_request(s, 0, 64, 1)
    b = new_request(s, 1, 96, 5)
    s.add(a)
    s.add(b)
    first = s.schedule()
    assert first is not None and first.admitted == [(0, 0), (1, 0)]
    assert s.pool.free == 0
    return s, a, b, first


def test_a_request_can_preempt_itself() -> None:
    s, _a, b, first = self_preempting_setup()
    s.schedule()
    assert b.status == WAITING
    assert b.preemptions == 1
    assert [r.rid for r in s.waiting] == [1]
    s.update_from_output(first)  # a finishes; b's first token (older epoch) is dropped
    assert b.out == 0 and not b.first_token
    batch = s.schedule()
    assert batch is not None and [rid for rid, _ in batch.admitted] == [1]
    s.update_from_output(batch)
    run_all(s)
    assert b.status == FINISHED and b.out == 5
    assert s.counters.prompt_tokens_total == 160
    assert s.counters.num_preemptions_total == 1  # counted once b produced an output again


def test_a_step_that_only_preempts_still_reports_the_preemption() -> None:
    s, _a, _b, _first = self_preempting_setup()
    batch = s.schedule()
    assert batch is not None
    assert batch.preempted == [1]
    assert batch.tokens == 0 and batch.seqs == 0 and batch.admitted == []


def test_a_preempted_request_aborted_before_its_next_output_is_not_counted() -> None:
    s = make_scheduler(blocks=10, budget=512, seqs=4)
    a = new_request(s, 0, 64, 50)
    b = new_request(s, 1, 64, 50)
    s.add(a)
    s.add(b)
    while b.preemptions == 0:
        batch = s.schedule()
        assert batch is not None
        s.update_from_output(batch)
    assert b.status == WAITING
    s.finish_aborted(b)
    run_all(s)
    assert a.status == FINISHED
    assert s.counters.num_preemptions_total == 0


def test_outputs_of_a_batch_built_before_a_preemption_are_dropped() -> None:
    s = make_scheduler(blocks=10, budget=512, seqs=4)
    a = new_request(s, 0, 64, 50)
    b = new_request(s, 1, 64, 50)
    s.add(a)
    s.add(b)
    pending: deque[Batch] = deque()
    for _ in range(200):
        batch = s.schedule()
        assert batch is not None
        pending.append(batch)
        if batch.preempted:
            break
        if len(pending) > 1:
            s.update_from_output(pending.popleft())
    assert b.status == WAITING
    out_at_preemption = b.out
    # The batch still in flight holds a decode of b from before the preemption: dropped.
    older = pending.popleft()
    assert any(r is b for r, _e in older.decode)
    s.update_from_output(older)
    assert b.out == out_at_preemption


# -- prefix caching ----------------------------------------------------------------------------------


def run_all(s: Scheduler) -> list[Batch]:
    batches = []
    while (batch := s.schedule()) is not None:
        batches.append(batch)
        s.update_from_output(batch)
    return batches


def admitted_hit(batches: list[Batch], rid: int) -> int:
    hits = [hit for b in batches for r, hit in b.admitted if r == rid]
    assert hits, f"request {rid} was never admitted"
    return hits[0]


def test_second_request_hits_the_shared_prefix() -> None:
    s = make_scheduler(prefix=2000, blocks=2000)
    a = new_request(s, 0, 2500, 2)
    s.add(a)
    first = run_all(s)
    assert admitted_hit(first, 0) == 0
    assert s.prefix.cached == 125
    b = new_request(s, 1, 2600, 2)
    s.add(b)
    second = run_all(s)
    assert admitted_hit(second, 1) == 2000
    assert b.computed_prompt_tokens == 600
    assert s.counters.prefix_cache_hits_total == 2000
    assert s.counters.prefix_cache_queries_total == 5100


def test_a_running_request_shares_its_prefix_at_once() -> None:
    # Blocks are registered when scheduled: a request admitted in a later step hits them while
    # the first one still runs.
    s = make_scheduler(prefix=2000, blocks=2000)
    a = new_request(s, 0, 2500, 20)
    s.add(a)
    s.schedule()
    b = new_request(s, 1, 2600, 2)
    s.add(b)
    batch = s.schedule()
    assert batch is not None
    assert batch.admitted == [(1, 2000)]


def test_prompt_shorter_than_the_prefix_hits_at_most_prompt_len_minus_one() -> None:
    s = make_scheduler(prefix=2000, blocks=2000)
    s.add(new_request(s, 0, 2500, 2))
    run_all(s)
    short = new_request(s, 1, 1000, 3)
    s.add(short)
    batches = run_all(s)
    hit = admitted_hit(batches, 1)
    assert hit == 992  # 62 full blocks <= 999 tokens
    assert short.status == FINISHED and short.out == 3
    assert short.computed_prompt_tokens == 8
    assert s.pool.used == 0


def test_prompt_shorter_than_the_prefix_as_first_request() -> None:
    s = make_scheduler(prefix=2000, blocks=2000)
    short = new_request(s, 0, 1000, 3)
    s.add(short)
    run_all(s)
    assert short.status == FINISHED
    cached = s.prefix.cached
    assert cached == 62  # its full blocks are the prefix's first 62 blocks
    again = new_request(s, 1, 2400, 1)
    s.add(again)
    batches = run_all(s)
    assert admitted_hit(batches, 1) == cached * BS
    assert again.status == FINISHED
    assert s.prefix.cached == 125  # the longer prompt completed the shared prefix


@pytest.mark.parametrize(("prompt", "expected_hit"), [
    (2016, 2000),  # one own full block, but the hit must leave the last token to compute
    (2017, 2016),
    (2500, 2496),
    (2512, 2496),
])
def test_a_retry_of_the_same_prompt_hits_full_blocks_below_its_last_token(prompt: int,
                                                                           expected_hit: int) -> None:
    s = make_scheduler(prefix=2000, blocks=2000)
    s.add(new_request(s, 0, prompt, 2, key="call"))
    run_all(s)
    retry = new_request(s, 1, prompt, 2, key="call")
    s.add(retry)
    hit = admitted_hit(run_all(s), 1)
    assert hit == expected_hit
    assert hit <= prompt - 1
    assert hit % BS == 0


def test_no_hit_without_prefix_caching() -> None:
    s = make_scheduler(prefix=2000, blocks=2000, caching=False)
    s.add(new_request(s, 0, 2500, 2))
    run_all(s)
    s.add(new_request(s, 1, 2500, 2))
    assert admitted_hit(run_all(s), 1) == 0


# -- counters -----------------------------------------------------------------------------------------


def test_prompt_tokens_total_counts_the_full_prompt_at_the_first_output() -> None:
    s = make_scheduler(budget=256, prefix=160, blocks=500)
    s.add(new_request(s, 0, 300, 2))
    run_all(s)
    assert s.counters.prompt_tokens_total == 300
    r = new_request(s, 1, 1000, 3)  # hits the 160-token prefix
    s.add(r)
    seen = []
    while (batch := s.schedule()) is not None:
        assert s.counters.prompt_tokens_total == 300 + (1000 if r.first_token else 0)
        first, _done = s.update_from_output(batch)
        seen.append((len(first), s.counters.prompt_tokens_total))
    # Not at scheduling, not per chunk: once, the full prompt (cached prefix included).
    assert seen[0] == (0, 300)
    assert (1, 1300) in seen
    assert s.counters.prompt_tokens_total == 1300
    assert s.counters.prefix_cache_hits_total == 160


def test_prompt_tokens_total_counts_once_despite_preemption() -> None:
    s = make_scheduler(blocks=10, budget=512, seqs=4)
    a = new_request(s, 0, 64, 50)
    b = new_request(s, 1, 64, 50)
    s.add(a)
    s.add(b)
    run_all(s)
    assert b.preemptions >= 1
    assert s.counters.prompt_tokens_total == 128
    assert s.counters.prefix_cache_queries_total == 128  # re-admissions are not counted
    assert s.counters.generation_tokens_total == 100


def test_preempted_before_its_first_output_counts_once_later() -> None:
    # b is preempted while its prefill is still chunked; its first output comes after re-admission.
    s = make_scheduler(blocks=14, budget=96, seqs=4)
    a = new_request(s, 0, 80, 80)
    b = new_request(s, 1, 120, 2)
    s.add(a)
    s.add(b)
    first_at_preemption = None
    while (batch := s.schedule()) is not None:
        if batch.preempted and first_at_preemption is None:
            first_at_preemption = b.first_token
        s.update_from_output(batch)
    assert b.status == FINISHED
    assert s.counters.prompt_tokens_total == 200
    assert s.counters.prefix_cache_queries_total == 200


def test_aborted_before_first_output_never_counts() -> None:
    s = make_scheduler(budget=256)
    r = new_request(s, 0, 600, 5)
    s.add(r)
    b1 = s.schedule()
    b2 = s.schedule()
    b3 = s.schedule()  # the last chunk, which samples the first token
    assert b1 and b2 and b3
    assert b3.sampled == 1
    assert s.counters.prefix_cache_queries_total == 600  # counted at admission
    s.update_from_output(b1)
    s.update_from_output(b2)
    s.finish_aborted(r)  # the abort arrives before b3's output
    assert r.status == ABORTED and r.blocks == 0
    first, done = s.update_from_output(b3)
    assert first == [] and done == []
    assert s.counters.prompt_tokens_total == 0
    assert s.counters.generation_tokens_total == 0
    assert s.pool.used == 0


def test_aborting_a_waiting_request_removes_it() -> None:
    s = make_scheduler(seqs=1)
    a = new_request(s, 0, 100, 5)
    b = new_request(s, 1, 100, 5)
    s.add(a)
    s.add(b)
    s.schedule()
    s.finish_aborted(b)
    assert b.status == ABORTED
    assert list(s.waiting) == []
    run_all(s)
    assert s.counters.prompt_tokens_total == 100
    assert s.counters.prefix_cache_queries_total == 100


def test_prefix_cache_queries_grow_at_admission_not_at_first_output() -> None:
    s = make_scheduler(budget=128)
    s.add(new_request(s, 0, 500, 2))
    batch = s.schedule()
    assert batch is not None and batch.admitted == [(0, 0)]
    assert s.counters.prefix_cache_queries_total == 500
    assert s.counters.prompt_tokens_total == 0
