"""How long an attempt would wait for its first token, judged from what a proxy can observe.

The proxy sees its own queue, the engine's waiting gauge (vllm:num_requests_waiting) and the first
tokens of its own executions. Executions reach their first token in queue order, so the wait of a
new one is about the executions ahead of it divided by the recent rate of first tokens, plus its
own prefill at the recent prefill rate. Used for the budget's Retry-After and the deadline check.

Deadline admission needs the time to the *last* token: the wait for the first, plus the response's
tokens at the recent decode pace of one stream, observed from completed executions (seconds from
their first token to their end, per token the request allowed).
"""

from __future__ import annotations

from collections import deque

__all__ = ["WaitEstimator"]


class WaitEstimator:
    def __init__(self, window_s: float = 60.0, fallback_rate_per_s: float = 1.0) -> None:
        self.window_s = window_s
        self.fallback_rate_per_s = fallback_rate_per_s
        self._first_tokens: deque[tuple[float, int]] = deque()  # (time, prompt tokens)
        self._since_s: float | None = None
        self._decodes: deque[tuple[float, float]] = deque()  # (time, seconds per token) of completions

    def observe_first_token(self, now: float, prompt_tokens: int) -> None:
        if self._since_s is None:
            self._since_s = now
        self._first_tokens.append((now, prompt_tokens))
        self._expire(now)

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        while self._first_tokens and self._first_tokens[0][0] <= horizon:
            self._first_tokens.popleft()

    def first_token_rate(self, now: float) -> float:
        """First tokens per second over the window (or since the first observation)."""
        self._expire(now)
        if self._since_s is None or not self._first_tokens:
            return self.fallback_rate_per_s
        span = min(self.window_s, max(now - self._since_s, 1.0))
        return max(len(self._first_tokens) / span, 1e-3)

    def wait_s(self, now: float, ahead: int, prompt_tokens: int) -> float:
        """Estimated time to first token for an execution with `ahead` executions before it."""
        rate = self.first_token_rate(now)
        tokens = [t for _, t in self._first_tokens]
        mean_tokens = sum(tokens) / len(tokens) if tokens else float(prompt_tokens)
        own = (prompt_tokens / mean_tokens) / rate if mean_tokens else 0.0
        return ahead / rate + own

    def observe_completion(self, now: float, first_token_s: float, tokens: int) -> None:
        """A completed execution: its first token at `first_token_s`, `tokens` tokens in all."""
        if tokens > 1 and now > first_token_s:
            self._decodes.append((now, (now - first_token_s) / (tokens - 1)))
        horizon = now - self.window_s
        while self._decodes and self._decodes[0][0] <= horizon:
            self._decodes.popleft()

    def decode_s_per_token(self, now: float) -> float:
        """Mean seconds per token of one stream over the window; 0 before any completion (unknown:
        the estimate is then the first token's wait alone, so admission refuses no more than it knows)."""
        horizon = now - self.window_s
        while self._decodes and self._decodes[0][0] <= horizon:
            self._decodes.popleft()
        if not self._decodes:
            return 0.0
        return sum(pace for _, pace in self._decodes) / len(self._decodes)

    def last_token_s(self, now: float, ahead: int, prompt_tokens: int, max_tokens: int) -> float:
        """Estimated time to the last of `max_tokens` tokens for an execution with `ahead` before it."""
        return self.wait_s(now, ahead, prompt_tokens) + max(max_tokens - 1, 0) * self.decode_s_per_token(now)
