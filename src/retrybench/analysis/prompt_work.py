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

Only the trace's JSONL schema (records/tracefile.py) is read, so a real vLLM's trace is analysed alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import Any

import numpy as np

from retrybench.records.tracefile import TraceEvent

__all__ = ["PromptWork", "TraceEvents", "prompt_work"]


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


_STEP_FIELDS = ("start_s", "end_s", "decode", "prompt_tokens", "cached_tokens", "preempted")
_STEP_DEFAULTS: tuple[Any, ...] = (None, None, [], {}, {}, [])


@dataclass(frozen=True)
class TraceEvents:
    """A trace read once, for analyses that share the reading (Section 5 runs two): its events, their kinds,
    and those of the kinds they read. `prompt_work` and `step_time` accept one in place of the events."""

    events: list[TraceEvent]
    kinds: list[Any]
    steps: list[TraceEvent]
    aborted: list[TraceEvent]

    @classmethod
    def read(cls, events: Iterable[TraceEvent] | TraceEvents) -> TraceEvents:
        if isinstance(events, TraceEvents):
            return events
        events = events if isinstance(events, list) else list(events)
        kinds = [e.get("event") for e in events]
        return cls(events=events, kinds=kinds, steps=cls._of_kind(events, kinds, "step"),
                   aborted=cls._of_kind(events, kinds, "aborted"))

    @staticmethod
    def _of_kind(events: list[TraceEvent], kinds: list[Any], kind: str) -> list[TraceEvent]:
        return [e for e, k in zip(events, kinds, strict=True) if k == kind]

    def of_kind(self, kind: str) -> list[TraceEvent]:
        return self._of_kind(self.events, self.kinds, kind) if kind in self.kinds else []

    @cached_property
    def step_fields(self) -> list[tuple[Any, ...]]:
        """Per field of _STEP_FIELDS, its value in every step: one C-level pass (a traced step has them all)."""
        if not self.steps:
            return [() for _ in _STEP_FIELDS]
        try:
            return list(zip(*map(itemgetter(*_STEP_FIELDS), self.steps), strict=True))
        except KeyError:
            return list(zip(*[tuple(e.get(k, d) for k, d in zip(_STEP_FIELDS, _STEP_DEFAULTS, strict=True))
                              for e in self.steps], strict=True))

    def step_field(self, name: str) -> tuple[Any, ...]:
        return self.step_fields[_STEP_FIELDS.index(name)]

    @cached_property
    def chunks(self) -> tuple[list[int], list[int], list[int]]:
        """Step index, execution and tokens of every prompt chunk, in trace order."""
        return self.mapping_items("prompt_tokens")

    def mapping_items(self, name: str) -> tuple[list[int], list[int], list[int]]:
        """Step index, key and value (as ints) of every item of each step's mapping `name`, in trace order."""
        held = [(s, m) for s, m in enumerate(self.step_field(name)) if m]
        return ([s for s, m in held for _ in m], [int(k) for _, m in held for k in m],
                [int(v) for _, m in held for v in m.values()])

    @cached_property
    def aborted_ids(self) -> set[int]:
        return {int(e["execution"]) for e in self.aborted}


def _total(tokens: np.ndarray, where: np.ndarray | list[bool]) -> int:
    """Tokens summed where marked: integers, exact in any order."""
    return int(tokens[np.asarray(where, dtype=bool)].sum())


def prompt_work(events: Iterable[TraceEvent] | TraceEvents, *,
                last_window: tuple[float, float] | None = None) -> PromptWork:
    """Attribute every computed prompt token of a trace. `last_window` = (start_s, end_s): the
    steps that began in it also give the missed share of that window (the hold's last 240 s).

    The trace is read by comprehensions and the chunks summed as numpy columns: integer sums, in any order."""
    trace = TraceEvents.read(events)
    aborted_at = {int(e["execution"]): float(e["t"]) for e in trace.aborted}  # the last abort of each
    first_token_at = {int(e["execution"]): float(e["t"])
                      for e in reversed(trace.of_kind("first_token"))}  # the first of each
    preempted = {int(rid) for held in trace.step_field("preempted") if held for rid in held}
    preempted.update(int(e["execution"]) for e in trace.of_kind("preempted"))
    chunk_step, chunk_rid, chunk_tokens = trace.chunks
    tokens = np.array(chunk_tokens, dtype=np.int64)
    start_s = np.array(trace.step_field("start_s"), dtype=np.float64)[chunk_step]
    end_s = np.array(trace.step_field("end_s"), dtype=np.float64)[chunk_step]
    abort = np.array([aborted_at.get(rid, np.inf) for rid in chunk_rid], dtype=np.float64)
    is_aborted = np.array([rid in aborted_at for rid in chunk_rid], dtype=bool)
    before_output = np.array([rid in aborted_at and (rid not in first_token_at or first_token_at[rid] > aborted_at[rid])
                              for rid in chunk_rid], dtype=bool)
    body = is_aborted & (end_s < abort)
    window = (np.zeros(len(tokens), dtype=bool) if last_window is None
              else (last_window[0] <= start_s) & (start_s < last_window[1]))
    return PromptWork(
        computed_tokens=int(tokens.sum()), never_aborted_tokens=_total(tokens, ~is_aborted),
        aborted_body_tokens=_total(tokens, body), aborted_in_flight_tokens=_total(tokens, is_aborted & ~body),
        aborted_unscheduled=sum(bool(e.get("unscheduled", False)) for e in trace.aborted),
        aborted_executions=len(aborted_at), missed_tokens=_total(tokens, before_output),
        preempted_execution_tokens=_total(tokens, [rid in preempted for rid in chunk_rid]),
        last_window_tokens=_total(tokens, window), last_window_missed_tokens=_total(tokens, window & before_output),
    )
