"""Where the engine's prompt work goes (the paper's Section 5.1 and 5.3), from the engine trace only.

Computed prompt tokens are those a step computed rather than took from the prefix cache; each is
attributed to the execution that computed it. For an execution that the engine later aborted, its
*body* is what steps finished by the time the abort was applied computed, and the rest was *in
flight*: in steps already issued, which run to completion after the abort. vLLM applies aborts
right after a batch's output is ready and before it processes that output
(`_process_aborts_queue()` before `update_from_output`), so the batch whose completion carries the
abort (its end equals the abort's time) finishes after it: with two batches issued, both are in
flight, as the paper's traces, which log a step's end in `update_from_output`, see them. Executions aborted
before their first output token are what vLLM's prompt-token counter misses.

Only the trace's JSONL schema (tracefile.py) is read, so a real vLLM's trace is analysed alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["PromptWork", "prompt_work"]


@dataclass(frozen=True, kw_only=True)
class PromptWork:
    computed_tokens: int
    never_aborted_tokens: int
    aborted_body_tokens: int
    aborted_in_flight_tokens: int
    aborted_unscheduled: int  # executions aborted before the engine first scheduled them
    aborted_executions: int
    missed_tokens: int  # computed by executions aborted before their first output token
    preempted_execution_tokens: int  # computed by executions that were ever preempted (reported apart)
    last_window_tokens: int
    last_window_missed_tokens: int

    @staticmethod
    def _pct(part: int, whole: int) -> float:
        return 100.0 * part / whole if whole else float("nan")

    @property
    def aborted_share_pct(self) -> float:
        return self._pct(self.aborted_body_tokens + self.aborted_in_flight_tokens, self.computed_tokens)

    @property
    def in_flight_share_pct(self) -> float:
        """Of the aborted executions' computed prompt tokens, the share in flight at the abort."""
        return self._pct(self.aborted_in_flight_tokens, self.aborted_body_tokens + self.aborted_in_flight_tokens)

    @property
    def missed_share_pct(self) -> float:
        return self._pct(self.missed_tokens, self.computed_tokens)

    @property
    def missed_share_last_window_pct(self) -> float:
        return self._pct(self.last_window_missed_tokens, self.last_window_tokens)


def prompt_work(events: Iterable[dict[str, Any]], *, last_window: tuple[float, float] | None = None) -> PromptWork:
    """Attribute every computed prompt token of a trace. `last_window` = (start_s, end_s): the
    steps that began in it also give the missed share of that window (the hold's last 240 s)."""
    chunks: dict[int, list[tuple[float, float, int]]] = defaultdict(list)  # id -> (start, end, tokens)
    aborted_at: dict[int, float] = {}
    unscheduled = 0
    first_token_at: dict[int, float] = {}
    preempted: set[int] = set()
    for event in events:
        kind = event["event"]
        if kind == "step":
            start, end = float(event["start_s"]), float(event["end_s"])
            for key, tokens in event["prompt_tokens"].items():
                chunks[int(key)].append((start, end, int(tokens)))
            preempted.update(int(rid) for rid in event.get("preempted", ()))
        elif kind == "aborted":
            aborted_at[int(event["execution"])] = float(event["t"])
            unscheduled += bool(event.get("unscheduled", False))
        elif kind == "first_token":
            first_token_at.setdefault(int(event["execution"]), float(event["t"]))
        elif kind == "preempted":
            preempted.add(int(event["execution"]))
    total = never = body = in_flight = missed = evicted = window_total = window_missed = 0
    for rid, steps in chunks.items():
        abort = aborted_at.get(rid)
        before_output = abort is not None and (rid not in first_token_at or first_token_at[rid] > abort)
        for start, end, tokens in steps:
            total += tokens
            if abort is None:
                never += tokens
            elif end < abort:
                body += tokens
            else:
                in_flight += tokens
            missed += tokens if before_output else 0
            evicted += tokens if rid in preempted else 0
            if last_window is not None and last_window[0] <= start < last_window[1]:
                window_total += tokens
                window_missed += tokens if before_output else 0
    return PromptWork(
        computed_tokens=total, never_aborted_tokens=never, aborted_body_tokens=body,
        aborted_in_flight_tokens=in_flight, aborted_unscheduled=unscheduled, aborted_executions=len(aborted_at),
        missed_tokens=missed, preempted_execution_tokens=evicted, last_window_tokens=window_total,
        last_window_missed_tokens=window_missed,
    )
