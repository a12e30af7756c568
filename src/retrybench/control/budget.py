"""The retry budget, after Google's SRE guidance: retries may be at most `ratio` of first attempts
over a sliding window. A retry over budget is answered 429 with a Retry-After."""

from __future__ import annotations

from collections import deque

__all__ = ["RetryBudget"]


class RetryBudget:
    """Counts first attempts and admitted retries in a sliding window of `window_s` seconds.

    A retry is admitted when, with it, admitted retries stay within `ratio` x first attempts
    seen in the window. Refused retries are not counted (they put no load on the engine).
    """

    def __init__(self, ratio: float = 0.1, window_s: float = 60.0) -> None:
        if not 0 <= ratio <= 10:
            raise ValueError(f"budget ratio must be in [0, 10], got {ratio}")
        if not window_s > 0:  # also refuses NaN
            raise ValueError(f"budget window must be > 0 s, got {window_s}")
        self.ratio = ratio
        self.window_s = window_s
        self._firsts: deque[float] = deque()
        self._retries: deque[float] = deque()

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        for times in (self._firsts, self._retries):
            while times and times[0] <= horizon:
                times.popleft()

    def first_attempt(self, now: float) -> None:
        self._expire(now)
        self._firsts.append(now)

    def try_retry(self, now: float) -> bool:
        """Admit (and count) the retry if the budget allows it."""
        self._expire(now)
        if len(self._retries) + 1 <= self.ratio * len(self._firsts):
            self._retries.append(now)
            return True
        return False

    def state(self, now: float) -> tuple[int, int]:
        """(first attempts, admitted retries) in the window ending at `now`."""
        self._expire(now)
        return len(self._firsts), len(self._retries)
