"""BlockPool / Owner: vLLM's free-block LRU queue with prefix caching, kept by block counts."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from retrybench.engine.kv import BlockPool, Owner


def queue_total(pool: BlockPool) -> int:
    """Blocks in the free queue, segment by segment (must equal pool.free)."""
    total = 0
    for _owner, count in pool._queue:
        assert isinstance(count, int)
        assert count >= 0
        total += count
    return total


def cache_content(pool: BlockPool, owner: Owner, blocks: int) -> None:
    """What the scheduler does for a freshly computed prompt: allocate anonymous blocks, then
    register them as the owner's content under one holder, which then drops its reference."""
    pool.take(blocks)
    pool.reference(owner, 0)
    pool.extend(owner, 0, blocks)
    pool.release(owner, blocks)


# -- basic accounting ---------------------------------------------------------------------------


def test_new_pool_is_all_free() -> None:
    pool = BlockPool(12)
    assert pool.free == 12
    assert pool.used == 0
    assert pool.free + pool.used == pool.num_blocks
    assert queue_total(pool) == 12


def test_pool_needs_a_block() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0)


def test_take_and_give_anonymous_keep_the_total() -> None:
    pool = BlockPool(10)
    pool.take(4)
    assert (pool.free, pool.used) == (6, 4)
    pool.take(6)
    assert (pool.free, pool.used) == (0, 10)
    pool.give_anonymous(3)
    assert (pool.free, pool.used) == (3, 7)
    pool.give_anonymous(0)  # a no-op
    assert (pool.free, pool.used) == (3, 7)
    assert pool.free + pool.used == pool.num_blocks
    assert queue_total(pool) == pool.free
    assert pool.evicted_blocks == 0


def test_take_more_than_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(5)
    pool.take(3)
    with pytest.raises(RuntimeError, match="allocating 3 blocks with 2 free"):
        pool.take(3)
    assert pool.free == 2
    assert queue_total(pool) == 2


def test_reference_extend_release_keep_the_total() -> None:
    pool = BlockPool(10)
    owner = Owner("p", 6)
    pool.take(6)
    pool.reference(owner, 0)
    assert pool.free == 4  # a zero-block reference takes nothing
    pool.extend(owner, 0, 6)
    assert owner.cached == 6
    assert owner.refs == [6]
    assert pool.free == 4  # the anonymous blocks became the owner's; nothing moved
    pool.release(owner, 6)
    assert owner.refs == []
    assert owner.cached == 6  # released blocks stay cached, in the free queue
    assert pool.free == 10
    assert pool.free + pool.used == pool.num_blocks
    assert queue_total(pool) == 10


# -- eviction ----------------------------------------------------------------------------------


def test_anonymous_blocks_are_taken_before_cached_ones_freed_later() -> None:
    pool = BlockPool(10)
    owner = Owner("a", 4)
    cache_content(pool, owner, 4)
    # Queue (LRU first): the 6 never-used blocks, then the owner's 4 cached blocks.
    pool.take(6)
    assert owner.cached == 4
    assert pool.evicted_blocks == 0


def test_eviction_takes_the_owner_tail_first() -> None:
    pool = BlockPool(10)
    owner = Owner("a", 4)
    cache_content(pool, owner, 4)
    pool.take(6)
    pool.take(1)
    assert owner.cached == 3  # the tail block went; blocks [0, 3) still hit
    assert pool.evicted_blocks == 1
    pool.take(2)
    assert owner.cached == 1
    assert pool.evicted_blocks == 3
    pool.reference(owner, 1)  # the surviving head can still be hit
    assert owner.refs == [1]
    assert pool.free == 0


def test_eviction_is_lru_across_owners() -> None:
    pool = BlockPool(8)
    a, b = Owner("a", 4), Owner("b", 4)
    # Both computed while both are held, then a released before b: a is least recently freed.
    pool.take(8)
    pool.reference(a, 0)
    pool.extend(a, 0, 4)
    pool.reference(b, 0)
    pool.extend(b, 0, 4)
    assert pool.free == 0
    pool.release(a, 4)
    pool.release(b, 4)
    pool.take(3)
    assert (a.cached, b.cached) == (1, 4)
    pool.take(2)
    assert (a.cached, b.cached) == (0, 3)
    assert not a.free_segments
    assert pool.evicted_blocks == 5


def test_reference_to_cached_free_blocks_pulls_them_from_the_free_queue() -> None:
    pool = BlockPool(10)
    owner = Owner("a", 4)
    cache_content(pool, owner, 4)
    assert pool.free == 10
    assert pool.free_blocks_if_referenced(owner, 3) == 3
    pool.reference(owner, 3)
    assert pool.free == 7
    assert owner.cached == 4
    assert queue_total(pool) == 7
    # A second holder of fewer blocks shares them: nothing more leaves the queue.
    assert pool.free_blocks_if_referenced(owner, 2) == 0
    pool.reference(owner, 2)
    assert pool.free == 7
    # A holder of more blocks pulls only the difference.
    assert pool.free_blocks_if_referenced(owner, 4) == 1
    pool.reference(owner, 4)
    assert pool.free == 6
    assert sorted(owner.refs) == [2, 3, 4]


def test_referenced_blocks_cannot_be_evicted() -> None:
    pool = BlockPool(10)
    owner = Owner("a", 4)
    cache_content(pool, owner, 4)
    pool.reference(owner, 2)  # blocks [0, 2) in use, [2, 4) cached and free
    pool.take(pool.free)  # everything free goes, the owner's free tail included
    assert owner.cached == 2
    assert owner.max_ref() == 2
    assert pool.free == 0
    assert pool.evicted_blocks == 2


def test_releasing_the_last_reference_returns_blocks_still_cached() -> None:
    pool = BlockPool(10)
    owner = Owner("a", 5)
    cache_content(pool, owner, 5)
    pool.reference(owner, 5)
    pool.reference(owner, 3)
    free_before = pool.free
    pool.release(owner, 5)  # blocks [3, 5) return to the queue; [0, 3) still held
    assert pool.free == free_before + 2
    assert owner.cached == 5
    pool.release(owner, 3)  # the last reference: the rest returns, still cached
    assert pool.free == 10
    assert owner.cached == 5
    assert owner.refs == []
    # It can be hit again in full.
    pool.reference(owner, 5)
    assert pool.free == 5


def test_released_blocks_are_evicted_tail_first_after_a_partial_rehit() -> None:
    pool = BlockPool(6)
    owner = Owner("a", 5)
    cache_content(pool, owner, 5)
    pool.reference(owner, 4)
    pool.release(owner, 4)
    # The anonymous block is oldest, then block 4 (released first), then blocks [0, 4).
    pool.take(1)
    assert owner.cached == 5
    pool.take(1)
    assert owner.cached == 4
    pool.take(2)
    assert owner.cached == 2


# -- random operation sequences ------------------------------------------------------------------


class PoolMachine(RuleBasedStateMachine):
    """Random take/give/reference/extend/release against a shadow of who holds what."""

    def __init__(self) -> None:
        super().__init__()
        self.pool: BlockPool | None = None
        self.owners: list[Owner] = []
        self.anon_held = 0  # anonymous blocks held by someone (not in the free queue)

    @precondition(lambda self: self.pool is None)
    @rule(num_blocks=st.integers(1, 40), sizes=st.lists(st.integers(0, 12), min_size=1, max_size=4))
    def setup(self, num_blocks: int, sizes: list[int]) -> None:
        self.pool = BlockPool(num_blocks)
        self.owners = [Owner(i, size) for i, size in enumerate(sizes)]

    @precondition(lambda self: self.pool is not None and self.pool.free > 0)
    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        assert self.pool is not None
        n = data.draw(st.integers(1, self.pool.free))
        self.pool.take(n)
        self.anon_held += n

    @precondition(lambda self: self.pool is not None and self.anon_held > 0)
    @rule(data=st.data())
    def give(self, data: st.DataObject) -> None:
        assert self.pool is not None
        n = data.draw(st.integers(1, self.anon_held))
        self.pool.give_anonymous(n)
        self.anon_held -= n

    @precondition(lambda self: self.pool is not None)
    @rule(data=st.data())
    def reference(self, data: st.DataObject) -> None:
        assert self.pool is not None
        owner = data.draw(st.sampled_from(self.owners))
        k = data.draw(st.integers(0, owner.cached))
        pulled = self.pool.free_blocks_if_referenced(owner, k)
        free = self.pool.free
        self.pool.reference(owner, k)
        assert self.pool.free == free - pulled

    @precondition(lambda self: self.pool is not None)
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        # Only the holder at the top of the cached content may extend it, with blocks it
        # computed itself (anonymous blocks it holds), up to the owner's size.
        assert self.pool is not None
        candidates = [o for o in self.owners if o.refs and o.max_ref() == o.cached < o.size]
        if not candidates or self.anon_held == 0:
            return
        owner = data.draw(st.sampled_from(candidates))
        old_k = owner.cached
        new_k = data.draw(st.integers(old_k + 1, min(owner.size, old_k + self.anon_held)))
        free = self.pool.free
        self.pool.extend(owner, old_k, new_k)
        self.anon_held -= new_k - old_k
        assert self.pool.free == free
        assert owner.cached == new_k

    @precondition(lambda self: self.pool is not None and any(o.refs for o in self.owners))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        assert self.pool is not None
        owner = data.draw(st.sampled_from([o for o in self.owners if o.refs]))
        k = data.draw(st.sampled_from(owner.refs))
        cached = owner.cached
        free = self.pool.free
        rest = list(owner.refs)
        rest.remove(k)
        self.pool.release(owner, k)
        assert owner.cached == cached  # released content stays cached
        assert self.pool.free == free + max(0, k - max(rest, default=0))

    @invariant()
    def counts_are_consistent(self) -> None:
        pool = self.pool
        if pool is None:
            return
        assert 0 <= pool.free <= pool.num_blocks
        assert pool.free + pool.used == pool.num_blocks
        assert queue_total(pool) == pool.free
        held = self.anon_held + sum(o.max_ref() for o in self.owners)
        assert pool.used == held
        for owner in self.owners:
            assert 0 <= owner.cached <= owner.size
            assert owner.max_ref() <= owner.cached
            assert all(r >= 0 for r in owner.refs)
            in_queue = 0
            for segment in owner.free_segments:
                assert segment[0] is owner
                assert isinstance(segment[1], int)
                assert segment[1] > 0
                in_queue += segment[1]
            # Cached blocks above every reference sit in the free queue, in this owner's segments.
            assert in_queue == owner.cached - owner.max_ref()


PoolMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, database=None,
                                         deadline=None)
TestPoolMachine = PoolMachine.TestCase
