"""vLLM's KV block pool with prefix caching, modelled by block counts rather than block objects.

vLLM keeps every free block in one LRU queue, cached or not; allocation takes the least recently
freed block and evicts whatever content it held. A request frees its blocks in reverse order, so
a prompt's tail is evicted before its head and what stays cached is always a prefix of it.

Here content is grouped by *owner*: a run of blocks that only ever hit as a prefix (the shared
2,000-token prefix is one owner, each call's own prompt blocks another, since every attempt of a
call resends the same prompt). A holder references blocks [0, k) of an owner, so an owner's
reference counts are non-increasing along its blocks, and the list of the holders' k values is all
that is needed: blocks above the largest k that are still cached sit in the free queue.
"""

from __future__ import annotations

from collections import deque

__all__ = ["BlockPool", "Owner"]


class Owner:
    """Cached content that hits only as a prefix: blocks [0, cached) hold valid KV."""

    __slots__ = ("cached", "free_segments", "key", "refs", "size")

    def __init__(self, key: object, size: int) -> None:
        self.key = key
        self.size = size  # blocks this content can have
        self.cached = 0  # blocks [0, cached) hold its KV (in use or in the free queue)
        self.refs: list[int] = []  # one k per holder: it references blocks [0, k)
        # Free-queue segments holding blocks of this owner, oldest (upper blocks) first.
        self.free_segments: list[list[object]] = []

    def max_ref(self) -> int:
        return max(self.refs, default=0)


class BlockPool:
    """The free-block queue and its counts. Segments are [owner | None, blocks]."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.free = num_blocks
        self._queue: deque[list[object]] = deque([[None, num_blocks]])
        self.evicted_blocks = 0

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def take(self, n: int) -> None:
        """Allocate n blocks from the LRU end, evicting the content they held."""
        if n > self.free:
            raise RuntimeError(f"allocating {n} blocks with {self.free} free")
        self.free -= n
        queue = self._queue
        while n:
            segment = queue[0]
            count = segment[1]
            assert isinstance(count, int)
            if count == 0:
                queue.popleft()
                continue
            got = min(n, count)
            segment[1] = count - got
            n -= got
            owner = segment[0]
            if owner is not None:
                assert isinstance(owner, Owner)
                owner.cached -= got
                self.evicted_blocks += got
                if count == got:
                    owner.free_segments.remove(segment)
            if count == got:
                queue.popleft()

    def give_anonymous(self, n: int) -> None:
        """Return blocks whose content no one can hit (decode tokens, a prompt's partial block)."""
        if n:
            self.free += n
            self._queue.append([None, n])

    def reference(self, owner: Owner, k: int) -> None:
        """A new holder takes blocks [0, k) of cached content (a prefix-cache hit)."""
        assert k <= owner.cached
        in_use = owner.max_ref()
        if k > in_use:
            # Blocks [in_use, k) leave the free queue; the lowest blocks sit in the youngest segments.
            need = k - in_use
            self.free -= need
            while need:
                segment = owner.free_segments[-1]
                count = segment[1]
                assert isinstance(count, int)
                got = min(need, count)
                segment[1] = count - got
                need -= got
                if count == got:
                    owner.free_segments.pop()
        owner.refs.append(k)

    def free_blocks_if_referenced(self, owner: Owner, k: int) -> int:
        """How many of blocks [0, k) a new reference would pull out of the free queue."""
        return max(0, k - owner.max_ref())

    def extend(self, owner: Owner, old_k: int, new_k: int) -> None:
        """A holder registers freshly computed blocks [old_k, new_k) as the owner's content."""
        refs = owner.refs
        refs[refs.index(old_k)] = new_k
        owner.cached = new_k

    def release(self, owner: Owner, k: int) -> None:
        """A holder drops its reference; blocks no one else references return, still cached."""
        refs = owner.refs
        refs.remove(k)
        freed = k - max(refs, default=0)
        if freed > 0:
            self.free += freed
            segment: list[object] = [owner, freed]
            self._queue.append(segment)
            owner.free_segments.append(segment)
