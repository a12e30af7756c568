"""A step-level model of vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py), clock-free.

Each call to `schedule()` builds one batch the way vLLM's `schedule()` does:
- running requests first, in admission order, each given min(tokens it still needs, budget);
  when one cannot get KV blocks, the LAST running request is preempted (recompute: its blocks
  are freed, its progress reset, and it goes to the FRONT of the waiting queue);
- then, unless something was preempted this step, waiting requests in FCFS order while fewer
  than max_num_seqs run and budget remains. The prefix cache is looked up only for a request
  with no computed tokens; the whole prompt must fit in free blocks (the admission gate), and a
  request that does not fit stops the loop (strict head-of-line blocking);
- num_computed_tokens advances when a request is scheduled, so with asynchronous scheduling the
  next batch can be built while this one runs (chunked prefill is only the budget's clipping).
`update_from_output()` applies one finished batch: first tokens, finished requests, counters.
Aborts (`finish_aborted`) remove a request at once and free its blocks; batches already built
still hold its tokens, which the caller accounts as in flight.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from retrybench.config import EngineConfig
from retrybench.engine.kv import BlockPool, Owner

__all__ = ["Batch", "Counters", "Request", "Scheduler"]

WAITING, RUNNING, FINISHED, ABORTED = "waiting", "running", "finished", "aborted"


class Request:
    """One execution inside the engine."""

    __slots__ = (
        "aborted_in_flight_tokens",
        "admitted",
        "anon",
        "arrival_s",
        "chain",
        "computed_prompt_tokens",
        "epoch",
        "first_scheduled_step",
        "first_token",
        "max_tokens",
        "num_computed",
        "out",
        "out_scheduled",
        "own",
        "own_k",
        "preemptions",
        "prefill_len",
        "prefix_k",
        "prompt_len",
        "recomputed_tokens",
        "rid",
        "status",
        "uncounted_preemptions",
    )

    def __init__(self, rid: int, prompt_len: int, max_tokens: int, own: Owner, arrival_s: float) -> None:
        self.rid = rid
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.own = own  # this prompt's own cacheable blocks (shared by every attempt of a call)
        self.arrival_s = arrival_s
        self.status = WAITING
        self.num_computed = 0  # tokens whose KV is computed or scheduled to be
        self.prefill_len = prompt_len  # after a preemption: prompt + outputs so far
        self.out = 0  # output tokens produced (batches processed)
        self.out_scheduled = 0  # output tokens that scheduled batches will produce
        self.epoch = 0  # bumped by preemption: outputs of older batches are discarded
        self.prefix_k = 0  # references to the shared-prefix owner's blocks [0, k)
        self.own_k = 0  # references to the own owner's blocks [0, k)
        self.anon = 0  # private blocks holding no hittable content
        self.chain = True  # False once a block could not be registered (duplicate content)
        self.admitted = False
        self.first_token = False
        self.first_scheduled_step: int | None = None
        self.computed_prompt_tokens = 0  # computed, not from cache; recomputation included
        self.recomputed_tokens = 0  # of which computed again after a preemption
        self.aborted_in_flight_tokens = 0
        self.preemptions = 0
        self.uncounted_preemptions = 0  # vLLM reports a preemption with the request's next output

    @property
    def blocks(self) -> int:
        return self.prefix_k + self.own_k + self.anon


@dataclass(slots=True)
class Batch:
    """One engine step. `entries` are prefill chunks (and the rare decode scheduled on the slow
    path): (request, tokens, samples a token, epoch at scheduling); `decode` holds the decodes."""

    step_id: int
    entries: list[tuple[Request, int, bool, int]]
    prompt_tokens: list[int]  # per entry, prompt tokens computed (0 for decode)
    seqs: int = 0
    tokens: int = 0
    sampled: int = 0
    attention_pairs: float = 0.0
    context_tokens: int = 0
    decode: list[tuple[Request, int]] = field(default_factory=list)  # (request, epoch): one token each
    preempted: list[int] = field(default_factory=list)
    admitted: list[tuple[int, int]] = field(default_factory=list)  # (rid, prefix-cache hit tokens)


@dataclass(slots=True)
class Counters:
    """vLLM's Prometheus counters, kept with vLLM's rules (see notes/vllm-v1-semantics.md)."""

    prompt_tokens_total: int = 0  # full prompt length, at the first output token, first admission only
    prefix_cache_queries_total: int = 0  # full prompt length, at first admission
    prefix_cache_hits_total: int = 0
    num_preemptions_total: int = 0  # counted with the preempted request's next output
    generation_tokens_total: int = 0


class Scheduler:
    def __init__(self, config: EngineConfig, num_blocks: int, prefix_tokens: int) -> None:
        self.config = config
        self.block_size = config.block_size
        self.pool = BlockPool(num_blocks)
        self.prefix_blocks = prefix_tokens // config.block_size
        self.prefix = Owner("shared-prefix", self.prefix_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.counters = Counters()
        self._owners: dict[object, Owner] = {}
        self._step = 0

    # -- requests ----------------------------------------------------------------------------

    def owner_for(self, prompt_key: object, prompt_len: int) -> Owner:
        """The cache content of one prompt's own blocks (every attempt of a call shares it)."""
        owner = self._owners.get(prompt_key)
        if owner is None:
            size = max(0, prompt_len // self.block_size - self.prefix_blocks)
            owner = self._owners[prompt_key] = Owner(prompt_key, size)
        return owner

    def forget_owner(self, prompt_key: object) -> None:
        """Drop bookkeeping for a prompt no one will send again, once nothing of it is cached."""
        owner = self._owners.get(prompt_key)
        if owner is not None and owner.cached == 0 and not owner.refs:
            del self._owners[prompt_key]

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def finish_aborted(self, request: Request) -> None:
        """Remove an aborted request from wherever it is and free its blocks at once."""
        if request.status == WAITING:
            self.waiting.remove(request)
        elif request.status == RUNNING:
            self.running.remove(request)
            self._free(request)
        request.status = ABORTED

    # -- blocks -------------------------------------------------------------------------------

    def _free(self, request: Request) -> None:
        # vLLM frees in reverse order, so the tail (private blocks) is evicted before the prompt.
        pool = self.pool
        pool.give_anonymous(request.anon)
        # Every running request holds one reference to each owner (possibly of zero blocks).
        pool.release(request.own, request.own_k)
        pool.release(self.prefix, request.prefix_k)
        request.anon = request.own_k = request.prefix_k = 0

    def _grow(self, request: Request, tokens: int) -> bool:
        """Give `request` KV slots for `tokens` tokens and register its full prompt blocks."""
        size = self.block_size
        need = -(-tokens // size) - request.blocks
        if need > self.pool.free:
            return False
        if need > 0:
            self.pool.take(need)
            request.anon += need
        if request.chain and self.config.enable_prefix_caching:
            self._register(request, min(tokens, request.prompt_len) // size)
        return True

    def _register(self, request: Request, full_blocks: int) -> None:
        """Turn freshly computed full prompt blocks into cache content (vLLM hashes them when
        scheduled). Content that someone else registered meanwhile stays private (a duplicate)."""
        pool = self.pool
        prefix = self.prefix
        if request.prefix_k < self.prefix_blocks:
            target = min(full_blocks, self.prefix_blocks)
            if target > request.prefix_k:
                if prefix.cached != request.prefix_k:
                    request.chain = False
                    return
                pool.extend(prefix, request.prefix_k, target)
                request.anon -= target - request.prefix_k
                request.prefix_k = target
            if request.prefix_k < self.prefix_blocks:
                return
        own = request.own
        target = min(full_blocks - self.prefix_blocks, own.size)
        if target > request.own_k:
            if own.cached != request.own_k:
                request.chain = False
                return
            pool.extend(own, request.own_k, target)
            request.anon -= target - request.own_k
            request.own_k = target

    def _lookup(self, request: Request) -> tuple[int, int]:
        """Prefix-cache hit in blocks (shared prefix, own): full blocks, at most prompt_len - 1."""
        if not self.config.enable_prefix_caching:
            return 0, 0
        cap = (request.prefill_len - 1) // self.block_size
        prefix_hit = min(self.prefix.cached, self.prefix_blocks, cap)
        own_hit = 0
        if prefix_hit == self.prefix_blocks:
            own_hit = min(request.own.cached, cap - prefix_hit)
        return prefix_hit, own_hit

    # -- one step ----------------------------------------------------------------------------

    def schedule(self) -> Batch | None:
        config = self.config
        budget = config.max_num_batched_tokens
        self._step += 1
        batch = Batch(step_id=self._step, entries=[], prompt_tokens=[])
        running = self.running
        pool = self.pool
        size = self.block_size
        decode = batch.decode
        decode_context = 0
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            if request.out_scheduled >= request.max_tokens:
                i += 1  # its last token is in flight
                continue
            computed = request.num_computed
            if computed >= request.prefill_len and (computed % size or pool.free):
                # Decode fast path (most entries of most steps): one token, a new block every
                # block_size tokens. Blocks held always equal ceil(num_computed / block_size).
                if computed % size == 0:
                    pool.take(1)
                    request.anon += 1
                request.num_computed = computed + 1
                request.out_scheduled += 1
                decode.append((request, request.epoch))
                decode_context += computed + 1
                budget -= 1
                i += 1
                continue
            n = min(request.prefill_len - computed, budget) if computed < request.prefill_len else 1
            while not self._grow(request, computed + n):
                victim = running.pop()
                self._preempt(victim, batch)
                preempted = True
                if victim is request:
                    break
            else:
                budget -= n
                self._add_entry(batch, request, n)
                i += 1
                continue
            break
        if decode:
            count = len(decode)
            batch.seqs += count
            batch.tokens += count
            batch.sampled += count
            batch.attention_pairs += decode_context
            batch.context_tokens += decode_context
        if not preempted:
            budget = self._admit(batch, budget)
        if not batch.entries and not decode and not batch.preempted:
            self._step -= 1
            return None
        return batch  # possibly with no tokens: a step that only preempted

    def _admit(self, batch: Batch, budget: int) -> int:
        config = self.config
        waiting = self.waiting
        running = self.running
        pool = self.pool
        size = self.block_size
        while waiting and budget > 0 and len(running) < config.max_num_seqs:
            request = waiting[0]
            prefix_hit = own_hit = 0
            if request.num_computed == 0:
                prefix_hit, own_hit = self._lookup(request)
            # The admission gate: the whole sequence must fit, counting cached blocks that the
            # hit would pull out of the free queue as allocations.
            full_blocks = -(-request.prefill_len // size)
            pulled = (pool.free_blocks_if_referenced(self.prefix, prefix_hit)
                      + pool.free_blocks_if_referenced(request.own, own_hit))
            if full_blocks - prefix_hit - own_hit + pulled > pool.free:
                break
            pool.reference(self.prefix, prefix_hit)
            pool.reference(request.own, own_hit)
            request.prefix_k = prefix_hit
            request.own_k = own_hit
            request.chain = True
            hit_tokens = (prefix_hit + own_hit) * size
            request.num_computed = hit_tokens
            n = min(request.prefill_len - hit_tokens, budget)
            if not self._grow(request, hit_tokens + n):  # cannot happen after the gate
                raise AssertionError("admission gate passed but allocation failed")
            waiting.popleft()
            request.status = RUNNING
            running.append(request)
            if not request.admitted:
                request.admitted = True
                self.counters.prefix_cache_queries_total += request.prompt_len
                self.counters.prefix_cache_hits_total += hit_tokens
            batch.admitted.append((request.rid, hit_tokens))
            budget -= n
            self._add_entry(batch, request, n)
        return budget

    def _add_entry(self, batch: Batch, request: Request, n: int) -> None:
        computed = request.num_computed
        prefill = computed < request.prefill_len
        request.num_computed = computed + n
        samples = not prefill or request.num_computed == request.prefill_len
        if samples:
            request.out_scheduled += 1
        prompt = n if prefill else 0
        if prompt:
            request.computed_prompt_tokens += prompt
            if request.preemptions:
                request.recomputed_tokens += prompt
        if request.first_scheduled_step is None:
            request.first_scheduled_step = batch.step_id
        batch.entries.append((request, n, samples, request.epoch))
        batch.prompt_tokens.append(prompt)
        batch.seqs += 1
        batch.tokens += n
        batch.sampled += samples
        batch.attention_pairs += n * computed + n * (n + 1) / 2
        batch.context_tokens += computed + n

    def _preempt(self, request: Request, batch: Batch) -> None:
        self._free(request)
        request.status = WAITING
        request.num_computed = 0
        request.prefill_len = request.prompt_len + request.out
        request.out_scheduled = request.out
        request.epoch += 1
        request.preemptions += 1
        request.uncounted_preemptions += 1
        self.waiting.appendleft(request)
        batch.preempted.append(request.rid)

    # -- outputs ------------------------------------------------------------------------------

    def update_from_output(self, batch: Batch) -> tuple[list[Request], list[Request]]:
        """Apply a finished batch: returns (requests whose first token this was, finished ones)."""
        first: list[Request] = []
        done: list[Request] = []
        for request, _n, samples, epoch in batch.entries:
            if samples:
                self._output(request, epoch, first, done)
        for request, epoch in batch.decode:
            self._output(request, epoch, first, done)
        return first, done

    def _output(self, request: Request, epoch: int, first: list[Request], done: list[Request]) -> None:
        if request.status != RUNNING or epoch != request.epoch:
            return  # aborted, finished or preempted since: its output is dropped
        request.out += 1
        counters = self.counters
        counters.generation_tokens_total += 1
        if request.uncounted_preemptions:
            # vLLM's PREEMPTED event travels with the request's next output, so the counter misses
            # a preempted request that is aborted before it produces one.
            counters.num_preemptions_total += request.uncounted_preemptions
            request.uncounted_preemptions = 0
        if not request.first_token:
            request.first_token = True
            counters.prompt_tokens_total += request.prompt_len
            first.append(request)
        if request.out >= request.max_tokens:
            request.status = FINISHED
            self.running.remove(request)
            self._free(request)
            done.append(request)

