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

Decodes in bulk. Most of a run's work is decoding: every step gives each decoding request one
token, and a paper run has about two million of them. Stepping each one in Python was most of the
simulator's time, so a request that decodes steadily is *lazy*: it joins the scheduler's decode
group, and its counters (`num_computed`, `out_scheduled`, `out`, `anon`) are derived from when it
joined and how many decode-group steps were scheduled and processed since (`DecodeClock`, in request.py). A step
then costs the same whatever the number of decoders: their tokens, context and new KV blocks are
sums kept per group, and only the requests whose last token is scheduled are touched. This is an
exact rewriting of the per-request rules, which stay as the fallback (`_schedule_running`): a step
in which a decoder would not get its new block (a preemption), or more decoders than the token
budget, first turns every lazy request back into plain counters. The invariants that make it exact:
running requests that finished their prefill all precede those still in prefill (budget goes in
admission order, a request is admitted at the end, and preemption takes the last one), so the
decoders are the head of `running` and a step that fits schedules every one of them; and a
decoder's output never is its first token or carries a preemption count (both come with the
output of its last prefill chunk, processed before).
"""

from __future__ import annotations

from collections import deque

from retrybench.conditions.config import EngineConfig
from retrybench.engine.batch import Batch, Counters
from retrybench.engine.kv import BlockPool, Owner
from retrybench.engine.request import ABORTED, FINISHED, RUNNING, WAITING, DecodeClock, Request, cdiv

# The scheduler's vocabulary is re-exported: the engine core and the tests import it from here.
__all__ = ["ABORTED", "FINISHED", "RUNNING", "WAITING", "Batch", "Counters", "Request", "Scheduler"]


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
        # The decode group (see the module docstring).
        self._clock = DecodeClock(self.block_size)
        self._decoding: list[Request] = []  # members still to be given tokens, in running order
        self._leaving: dict[int, list[Request]] = {}  # clock step -> members whose last token it schedules
        self._context_base = 0  # sum over members of (num_computed at joining - step joined)
        self._at_boundary = [0] * self.block_size  # members by (num_computed - step) % block_size
        self._pending: dict[int, Batch] = {}  # clock step -> its batch, until its output is applied
        self._joined: dict[int, list[Request]] = {}  # clock step -> members that joined before it

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
        if request._clock is not None:
            self._leave_group(request, dropped=True)
        if request.status == WAITING:
            self.waiting.remove(request)
        elif request.status == RUNNING:
            self.running.remove(request)
            self._free(request)
        request.status = ABORTED

    # -- the decode group --------------------------------------------------------------------

    def _join_group(self, request: Request) -> None:
        """A running request past its prefill with tokens still to schedule becomes lazy."""
        clock = self._clock
        step = clock.scheduled
        request._clock = clock
        request._lazy_from = step
        last = step + request.max_tokens - request._out_scheduled - 1
        request._lazy_to = last
        base = request._num_computed - step
        self._context_base += base
        self._at_boundary[base % self.block_size] += 1
        self._decoding.append(request)
        joined = self._joined.get(step)
        if joined is None:
            self._joined[step] = [request]
        else:
            joined.append(request)
        leaving = self._leaving.get(last)
        if leaving is None:
            self._leaving[last] = [request]
        else:
            leaving.append(request)

    def _forget_member(self, request: Request) -> None:
        """Take a member that still gets tokens out of the group's sums."""
        base = request._num_computed - request._lazy_from
        self._context_base -= base
        self._at_boundary[base % self.block_size] -= 1
        self._decoding.remove(request)

    def _leave_group(self, request: Request, *, dropped: bool) -> None:
        """Make a lazy request's counters plain again. `dropped`: it is aborted or preempted, so the
        pending batches that hold its decodes will discard them."""
        clock = self._clock
        first, last = request._lazy_from, request._lazy_to
        if clock.scheduled <= last:  # still given tokens
            self._forget_member(request)
            self._leaving[last].remove(request)
        if dropped:
            for step in range(max(clock.processed, first), min(clock.scheduled, last + 1)):
                batch = self._pending.get(step)
                if batch is not None:
                    batch.dropped += 1
        scheduled = request._scheduled_lazily()
        processed = request._processed_lazily()
        size = self.block_size
        computed = request._num_computed + scheduled
        request._anon += cdiv(computed, size) - cdiv(request._num_computed, size)
        request._num_computed = computed
        request._out_scheduled += scheduled
        request._out += processed
        request._clock = None

    def _dissolve_group(self) -> None:
        """Every lazy request back to plain counters, every pending batch to (request, epoch) pairs."""
        members = list(self._decoding)
        for batch in self._pending.values():
            assert batch.decoders is not None and batch.finals is not None
            batch.explicit_decode = [(request, request.epoch) for request in batch.decoders]
            members += batch.finals
            batch.decoders = batch.finals = None
        self._pending.clear()
        self._joined.clear()
        for request in members:
            if request._clock is not None:
                self._leave_group(request, dropped=False)
        self._leaving.clear()
        self._context_base = 0
        self._at_boundary = [0] * self.block_size

    def _group_blocks_fit(self) -> bool:
        """Whether every member that needs a new KV block in the next step gets one (no preemption)."""
        return self._at_boundary[-self._clock.scheduled % self.block_size] <= self.pool.free

    def _schedule_group(self, batch: Batch) -> tuple[int, int]:
        """One token for every member: (members, their context tokens + 1 each)."""
        clock = self._clock
        step = clock.scheduled
        decoding = self._decoding
        members = len(decoding)
        needing_block = self._at_boundary[-step % self.block_size]
        if needing_block:
            self.pool.take(needing_block)
        context = self._context_base + members * (step + 1)
        batch.decoders = decoding.copy()
        batch.group_step = step
        clock.scheduled = step + 1
        finals = self._leaving.pop(step, None)
        batch.finals = finals if finals is not None else []
        if finals is not None:
            for request in finals:
                self._forget_member(request)
        self._pending[step] = batch
        return members, context

    # -- blocks -------------------------------------------------------------------------------

    def _free(self, request: Request) -> None:
        # vLLM frees in reverse order, so the tail (private blocks) is evicted before the prompt.
        pool = self.pool
        pool.give_anonymous(request._anon)
        # Every running request holds one reference to each owner (possibly of zero blocks).
        pool.release(request.own, request.own_k)
        pool.release(self.prefix, request.prefix_k)
        request._anon = request.own_k = request.prefix_k = 0

    def _grow(self, request: Request, tokens: int) -> bool:
        """Give `request` KV slots for `tokens` tokens and register its full prompt blocks."""
        size = self.block_size
        need = -(-tokens // size) - (request.prefix_k + request.own_k + request._anon)
        if need > self.pool.free:
            return False
        if need > 0:
            self.pool.take(need)
            request._anon += need
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
                request._anon -= target - request.prefix_k
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
            request._anon -= target - request.own_k
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
        budget = self.config.max_num_batched_tokens
        self._step += 1
        batch = Batch(self._step, [], [])
        decoding = self._decoding
        if decoding and len(decoding) <= budget and self._group_blocks_fit():
            members, context = self._schedule_group(batch)
            budget -= members
            running = self.running
            preempted = False
            if running[-1]._num_computed < running[-1].prefill_len:  # requests in prefill follow
                budget, preempted = self._schedule_prefills(batch, budget)
            batch.seqs += members
            batch.tokens += members
            batch.sampled += members
            batch.attention_pairs += context
            batch.context_tokens += context
            batch.decode_context_tokens += context
        else:
            if self._pending or self._decoding:
                self._dissolve_group()
            budget, preempted = self._schedule_running(batch, budget)
        if not preempted and self.waiting:
            budget = self._admit(batch, budget)
        if batch.decoders is None:
            if not batch.entries and not batch.explicit_decode and not batch.preempted:
                self._step -= 1
                return None
            # Every decoder was stepped one by one: all of them (re)join the group.
            for request in self.running:
                if request._num_computed >= request.prefill_len and request._out_scheduled < request.max_tokens:
                    self._join_group(request)
        elif batch.entries:
            for request, _n, _samples, _epoch in batch.entries:
                if (request._num_computed >= request.prefill_len and request._out_scheduled < request.max_tokens
                        and request.status == RUNNING):
                    self._join_group(request)
        return batch  # possibly with no tokens: a step that only preempted

    def _schedule_prefills(self, batch: Batch, budget: int) -> tuple[int, bool]:
        """The running requests still in prefill (the tail of `running`) after the decode group."""
        running = self.running
        i = len(running) - 1
        while i and running[i - 1]._num_computed < running[i - 1].prefill_len:
            i -= 1
        while i < len(running) and budget > 0:
            request = running[i]
            n = min(request.prefill_len - request._num_computed, budget)
            if not self._grow_or_preempt(batch, request, n):
                break
            budget -= n
            self._add_entry(batch, request, n)
            i += 1
        return budget, bool(batch.preempted)

    def _schedule_running(self, batch: Batch, budget: int) -> tuple[int, bool]:
        """Every running request one by one (no lazy request left): the rules as vLLM states them."""
        running = self.running
        pool = self.pool
        size = self.block_size
        decode = batch.explicit_decode
        decode_context = 0
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            if request._out_scheduled >= request.max_tokens:
                i += 1  # its last token is in flight
                continue
            computed = request._num_computed
            if computed >= request.prefill_len and (computed % size or pool.free):
                # Decode fast path: one token, a new block every block_size tokens. Blocks held
                # always equal ceil(num_computed / block_size).
                if computed % size == 0:
                    pool.take(1)
                    request._anon += 1
                request._num_computed = computed + 1
                request._out_scheduled += 1
                decode.append((request, request.epoch))
                decode_context += computed + 1
                budget -= 1
                i += 1
                continue
            n = min(request.prefill_len - computed, budget) if computed < request.prefill_len else 1
            if not self._grow_or_preempt(batch, request, n):
                break
            budget -= n
            self._add_entry(batch, request, n)
            i += 1
        if decode:
            count = len(decode)
            batch.seqs += count
            batch.tokens += count
            batch.sampled += count
            batch.attention_pairs += decode_context
            batch.context_tokens += decode_context
            batch.decode_context_tokens += decode_context
        return budget, bool(batch.preempted)

    def _grow_or_preempt(self, batch: Batch, request: Request, n: int) -> bool:
        """Room for `n` more tokens of `request`, preempting the last running request until it fits
        (vLLM's rule); False when `request` itself had to go."""
        tokens = request._num_computed + n
        while not self._grow(request, tokens):
            victim = self.running.pop()
            self._preempt(victim, batch)
            if victim is request:
                return False
        return True

    def _admit(self, batch: Batch, budget: int) -> int:
        config = self.config
        waiting = self.waiting
        running = self.running
        pool = self.pool
        size = self.block_size
        while waiting and budget > 0 and len(running) < config.max_num_seqs:
            request = waiting[0]
            prefix_hit = own_hit = 0
            if request._num_computed == 0:
                prefix_hit, own_hit = self._lookup(request)
            # The admission gate: the whole sequence must fit, counting cached blocks that the
            # hit would pull out of the free queue as allocations.
            full_blocks = -(-request.prefill_len // size)
            pulled = pool.free_blocks_if_referenced(self.prefix, prefix_hit) if prefix_hit else 0
            if own_hit:
                pulled += pool.free_blocks_if_referenced(request.own, own_hit)
            if full_blocks - prefix_hit - own_hit + pulled > pool.free:
                break
            pool.reference(self.prefix, prefix_hit)
            pool.reference(request.own, own_hit)
            request.prefix_k = prefix_hit
            request.own_k = own_hit
            request.chain = True
            hit_tokens = (prefix_hit + own_hit) * size
            request._num_computed = hit_tokens
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
        computed = request._num_computed
        prefill = computed < request.prefill_len
        request._num_computed = computed + n
        samples = not prefill or request._num_computed == request.prefill_len
        if samples:
            request._out_scheduled += 1
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
        batch.chunks.append((n, computed))

    def _preempt(self, request: Request, batch: Batch) -> None:
        # Only requests in prefill are preempted while the decode group exists (they are the tail of
        # `running`), so a pending batch's members keep their epoch; a lazy one is made plain first.
        if request._clock is not None:
            self._leave_group(request, dropped=True)
        self._free(request)
        request.status = WAITING
        request._num_computed = 0
        request.prefill_len = request.prompt_len + request._out
        request._out_scheduled = request._out
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
        step = batch.group_step
        if step >= 0:
            clock = self._clock
            if batch.decoders is not None and not self._group_output_in_order(step):
                self._dissolve_group()  # count this batch's decodes one by one
            if step >= clock.processed:
                clock.processed = step + 1
            if batch.decoders is not None:
                self._output_group(batch, done)
        for request, epoch in batch.explicit_decode:
            self._output(request, epoch, first, done)
        return first, done

    def _group_output_in_order(self, step: int) -> bool:
        """Whether the decode group's outputs of `step` can be applied in bulk: the group's earlier
        steps were applied, and so was the last prefill chunk of each member that joined since (a
        caller that skips a batch leaves a first token or a preemption count to its next output)."""
        if step != self._clock.processed:
            return False
        joined = self._joined.pop(step, None)
        return joined is None or all(
            request._clock is None or request._lazy_from != step
            or (request.first_token and not request.uncounted_preemptions) for request in joined)

    def _output_group(self, batch: Batch, done: list[Request]) -> None:
        """The decode group's tokens of one batch, applied in order (the clock already counts them)."""
        assert batch.decoders is not None and batch.finals is not None
        del self._pending[batch.group_step]
        self.counters.generation_tokens_total += len(batch.decoders) - batch.dropped
        for request in batch.finals:
            if request._clock is not None and request._lazy_to == batch.group_step:  # not aborted since
                self._leave_group(request, dropped=False)
                self._finish(request, done)

    def _output(self, request: Request, epoch: int, first: list[Request], done: list[Request]) -> None:
        if request.status != RUNNING or epoch != request.epoch:
            return  # aborted, finished or preempted since: its output is dropped
        # A lazy request (one that joined the decode group after this batch was built) has applied
        # none of its group's outputs yet, so its plain counter is its count.
        request._out += 1
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
        if request._out >= request.max_tokens:
            self._finish(request, done)

    def _finish(self, request: Request, done: list[Request]) -> None:
        request.status = FINISHED
        self.running.remove(request)
        self._free(request)
        done.append(request)
