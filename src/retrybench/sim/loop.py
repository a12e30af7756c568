"""A deterministic event heap: events are ordered by (time, kind priority, per-run sequence).

The sequence number belongs to the loop, not to a class, so two runs never share it and the
same inputs always pop in the same order.
"""

from __future__ import annotations

import heapq
from typing import Any

__all__ = ["EventLoop"]


class EventLoop:
    def __init__(self) -> None:
        # (time, priority, sequence, payload); a driver's hot loop may read and pop it directly.
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0

    def push(self, at_s: float, priority: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (at_s, priority, self._seq, payload))

    def pop(self) -> tuple[float, int, Any]:
        at_s, priority, _seq, payload = heapq.heappop(self.heap)
        return at_s, priority, payload

    def __len__(self) -> int:
        return len(self.heap)

    def peek_time(self) -> float:
        return self.heap[0][0]
