"""Boundary search along one axis: where, between its bounds, an outcome (say "not recovered") starts.

The axis is cut into a grid of `resolution` steps and searched by bisection over the grid's indices,
assuming the outcome is monotone along it: probe both ends, then the middle of the bracket whose ends
differ, until the bracket is one step wide. A decimal grid keeps every probe an exact value (2.7, not
2.7000000000000006), so that cells and seeds probe the same runs a plain sweep would, and share the cache.
Each search is a small state machine, so a sweep advances all its cells together, a round of runs at a time.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from decimal import Decimal

__all__ = ["Bisection", "Boundary", "boundary_of", "grid"]


def grid(low: Decimal, high: Decimal, resolution: Decimal) -> list[Decimal]:
    """low, low + resolution, ... up to high, high included (the last step may be shorter)."""
    if resolution <= 0 or high < low:
        raise ValueError(f"need resolution > 0 and high >= low, got {low}, {high}, {resolution}")
    steps = math.ceil((high - low) / resolution)
    return [min(low + k * resolution, high) for k in range(steps + 1)]


@dataclass(frozen=True)
class Boundary:
    """Where the outcome starts along the grid.

    status: "found" (the ends differ: the outcome holds at `critical`, not at the grid point next to it
    in `bracket`), "everywhere" (it holds at both ends), "nowhere" (at neither). `rises` says whether
    it holds above the boundary (True) or below it. Indices are the grid's."""

    status: str
    critical: int | None
    bracket: tuple[int, int] | None
    rises: bool | None
    probes: int


@dataclass
class Bisection:
    """The search on a grid of `points` values (indices 0 .. points - 1): feed it outcomes with record()."""

    points: int
    outcomes: dict[int, bool] = field(default_factory=dict)
    _low: int = 0
    _high: int = -1

    def __post_init__(self) -> None:
        if self.points < 1:
            raise ValueError("a grid needs at least one point")
        self._high = self.points - 1

    def next_probes(self) -> list[int]:
        """The indices to run now (both ends first, then one midpoint at a time); [] when done."""
        ends = [i for i in dict.fromkeys((0, self.points - 1)) if i not in self.outcomes]
        if ends:
            return ends
        if self.outcomes[0] == self.outcomes[self.points - 1] or self._high - self._low <= 1:
            return []
        return [(self._low + self._high) // 2]

    def record(self, index: int, holds: bool) -> None:
        """The outcome at grid index `index`: whether the searched-for outcome held there."""
        self.outcomes[index] = holds
        if 0 in self.outcomes and self._low < index < self._high:
            if holds == self.outcomes[0]:
                self._low = index
            else:
                self._high = index

    @property
    def done(self) -> bool:
        return not self.next_probes()

    def boundary(self) -> Boundary:
        """The result so far (call when done)."""
        first, last = self.outcomes.get(0), self.outcomes.get(self.points - 1)
        probes = len(self.outcomes)
        if first is None or last is None or self.next_probes():
            raise ValueError("the search is not finished")
        if first and last:
            return Boundary("everywhere", 0, None, None, probes)
        if not first and not last:
            return Boundary("nowhere", None, None, None, probes)
        critical = self._high if last else self._low
        return Boundary("found", critical, (self._low, self._high), last, probes)


def boundary_of(outcomes: list[bool]) -> Boundary:
    """The boundary a grid sweep shows: whether the outcome held at each grid point, in order. On a
    monotone row the same as a finished Bisection's; otherwise "non-monotone", with `critical` where
    the outcome holds from there to the end nearer it (None where it holds at both ends or neither)."""
    if not outcomes:
        raise ValueError("no outcomes")
    first, last, probes = outcomes[0], outcomes[-1], len(outcomes)
    changes = sum(a != b for a, b in itertools.pairwise(outcomes))
    if first == last:
        status = "non-monotone" if changes else ("everywhere" if first else "nowhere")
        return Boundary(status, 0 if status == "everywhere" else None, None, None, probes)
    if last:  # rises: the first index from which it holds to the end
        critical = max(i for i, holds in enumerate(outcomes) if not holds) + 1
        bracket = (critical - 1, critical)
    else:  # falls: the last index up to which it holds from the start
        critical = min(i for i, holds in enumerate(outcomes) if not holds) - 1
        bracket = (critical, critical + 1)
    return Boundary("found" if changes == 1 else "non-monotone", critical, bracket, last, probes)
