"""The live processes' one clock: the monotonic clock, read in the seconds of a scaled run.

A live run at time scale s spends s wall seconds per second of the run (policy, engine or trace
seconds), so that a paper run fits a shorter wall time while every component keeps the simulator's
timings. The proxy, the engine server and the load generator all read time through this class, so
they agree on what a scaled second is.
"""

from __future__ import annotations

import time

__all__ = ["ScaledClock"]


class ScaledClock:
    """Run seconds since `t0` (a `time.monotonic()` value), at `scale` wall seconds per run second."""

    __slots__ = ("scale", "t0")

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.t0 = time.monotonic()

    def restart(self) -> None:
        """Make now run time 0."""
        self.t0 = time.monotonic()

    def now(self) -> float:
        """Run seconds since t0."""
        return (time.monotonic() - self.t0) / self.scale

    def run_s(self, wall: float) -> float:
        """The run time of `wall`, a `time.monotonic()` value."""
        return (wall - self.t0) / self.scale

    def wall(self, run_s: float) -> float:
        """The `time.monotonic()` value at run time `run_s`."""
        return self.t0 + run_s * self.scale

    def wall_until(self, run_s: float) -> float:
        """Wall seconds from now until run time `run_s`; 0 once it has passed."""
        return max(self.t0 + run_s * self.scale - time.monotonic(), 0.0)
