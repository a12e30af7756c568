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
from typing import Any

__all__ = ["BlockPool", "Owner"]

# A run of blocks in the free queue: [owner or None (nothing hittable), blocks]. A plain list, as it is
# mutated in place from both the queue and its owner's free_segments.
Segment = list[Any]


class Owner:
    """Cached content that hits only as a prefix: blocks [0, cached) hold valid KV."""

    __slots__ = ("_top", "_top_holders", "cached", "free_segments", "key", "refs", "size")

    def __init__(self, key: object, size: int) -> None:
        self.key = key
        self.size = size  # blocks this content can have
        self.cached = 0  # blocks [0, cached) hold its KV (in use or in the free queue)
        self.refs: list[int] = []  # one k per holder: it references blocks [0, k)
        # Free-queue segments holding blocks of this owner, oldest (upper blocks) first.
        self.free_segments: list[Segment] = []
        # max(refs) and how many holders have it, kept as refs change: the shared prefix has a
        # holder per running request, and the scheduler asks for the maximum at every admission.
        self._top = 0
        self._top_holders = 0

    def max_ref(self) -> int:
        return self._top

    def _add_ref(self, k: int) -> None:
        self.refs.append(k)
        self._note_new_ref(k)

    def _note_new_ref(self, k: int) -> None:
        if k > self._top:
            self._top = k
            self._top_holders = 1
        elif k == self._top:
            self._top_holders += 1

    def _remove_ref(self, k: int) -> None:
        refs = self.refs
        refs.remove(k)
        if k == self._top:
            self._top_holders -= 1
            if not self._top_holders:
                self._top = max(refs, default=0)
                self._top_holders = refs.count(self._top)


class BlockPool:
    """The free-block queue and its counts. Segments are [owner | None, blocks]."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.free = num_blocks
        self._queue: deque[Segment] = deque([[None, num_blocks]])
        self.evicted_blocks = 0

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def take(self, n: int) -> None:
        """Allocate n blocks from the LRU end, evicting the content they held.

        A segment taken whole leaves the queue and its owner's free_segments, where it is the first
        (both lists keep the owner's segments oldest first), so it is left as it was."""
        if n > self.free:
            raise RuntimeError(f"allocating {n} blocks with {self.free} free")
        self.free -= n
        queue = self._queue
        while n:
            owner, count = segment = queue[0]
            if count <= n:  # the whole segment goes (or it was emptied by a reference())
                queue.popleft()
                n -= count
                if owner is not None and count:
                    owner.cached -= count
                    self.evicted_blocks += count
                    owner.free_segments.remove(segment)
            else:
                segment[1] = count - n
                if owner is not None:
                    owner.cached -= n
                    self.evicted_blocks += n
                n = 0

    def give_anonymous(self, n: int) -> None:
        """Return blocks whose content no one can hit (decode tokens, a prompt's partial block)."""
        if n:
            self.free += n
            self._queue.append([None, n])

    def reference(self, owner: Owner, k: int) -> None:
        """A new holder takes blocks [0, k) of cached content (a prefix-cache hit)."""
        assert k <= owner.cached
        in_use = owner._top
        if k > in_use:
            # Blocks [in_use, k) leave the free queue; the lowest blocks sit in the youngest segments.
            need = k - in_use
            self.free -= need
            while need:
                segment = owner.free_segments[-1]
                count = segment[1]
                got = need if need < count else count
                segment[1] = count - got
                need -= got
                if count == got:
                    owner.free_segments.pop()
        owner._add_ref(k)

    def free_blocks_if_referenced(self, owner: Owner, k: int) -> int:
        """How many of blocks [0, k) a new reference would pull out of the free queue."""
        pulled = k - owner._top
        return pulled if pulled > 0 else 0

    def extend(self, owner: Owner, old_k: int, new_k: int) -> None:
        """A holder registers freshly computed blocks [old_k, new_k) as the owner's content."""
        refs = owner.refs
        refs[refs.index(old_k)] = new_k
        owner._note_new_ref(new_k)  # new_k > old_k: the old value needs no bookkeeping of its own
        owner.cached = new_k

    def release(self, owner: Owner, k: int) -> None:
        """A holder drops its reference; blocks no one else references return, still cached."""
        owner._remove_ref(k)
        freed = k - owner._top
        if freed > 0:
            self.free += freed
            segment: Segment = [owner, freed]
            self._queue.append(segment)
            owner.free_segments.append(segment)
