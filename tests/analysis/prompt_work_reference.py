"""Prompt-work attribution as first written: the oracle for retrybench.analysis.prompt_work."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from retrybench.analysis.prompt_work import PromptWork  # the result type, shared

__all__ = ["PromptWork", "prompt_work"]


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
