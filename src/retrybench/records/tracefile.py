"""The engine event trace as JSONL: one schema for the simulated engine and a traced vLLM.

The first line is a header {"format": "retrybench-engine-trace/1", ...meta}. Every further line is
one event with its time `t` (seconds since the run's start) and `event`:
- queued, abort_requested, first_token, finished, preempted: {"execution": id}
- aborted: {"execution", "computed_prompt_tokens", "in_flight_prompt_tokens", "unscheduled"}
- step (when a batch is scheduled): {"step", "start_s", "end_s", "prompt_tokens": {id: n},
  "decode": [id, ...], "cached_tokens": {id: prefix-cache hit of a newly admitted execution},
  "preempted": [id, ...]}
- step_done: {"step", "start_s"} when the batch's output is processed
- trace_stats and trace_end (a traced vLLM only, execution -1): {"self_time_s", "wall_s"}, the
  recorder's own time so far and at shutdown

An event is a `TraceEvent`: a union of the kinds above, named here and kept a JSON object because the
simulator's callers hand the engine a plain list to append to. The header is a `TraceHeader`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, TypedDict

from retrybench.records.atomicfile import write_atomic
from retrybench.records.runlog import RunMeta

__all__ = ["FORMAT", "ExecutionEvent", "TraceEvent", "TraceHeader", "read_trace", "write_trace"]

FORMAT = "retrybench-engine-trace/1"

# The events of one execution in the trace (a step is logged on its own, with its batch).
ExecutionEvent = Literal["queued", "abort_requested", "first_token", "finished", "step_done", "preempted", "aborted"]

TraceEvent = dict[str, Any]  # one event line, of any kind listed above


class TraceHeader(TypedDict, total=False):
    """The first line: the format, then what wrote the trace (each writer sets its own keys)."""

    format: str
    spec: RunMeta  # a simulated run: its run log's meta
    source: str  # the engine server: "engine-server", with its settings below
    model: str
    gpu: str
    time_scale: float
    max_num_queued_reqs: int | None
    prefix_tokens: int
    engine: str  # a traced vLLM: "vllm", with its scheduler's settings below
    started_unix: float
    max_num_batched_tokens: int
    max_num_seqs: int
    async_scheduling: bool
    vllm_version: str
    scheduler: str


def write_trace(path: Path, events: Iterable[TraceEvent], meta: TraceHeader) -> None:
    """Write atomically: a crash leaves the old file or the whole new one."""
    header: TraceHeader = {"format": FORMAT, **meta}
    lines = [json.dumps(header, sort_keys=True)]
    lines += [json.dumps(event, separators=(",", ":")) for event in events]
    write_atomic(Path(path), "\n".join(lines) + "\n")


def read_trace(path: Path) -> tuple[TraceHeader, list[TraceEvent]]:
    with path.open() as handle:
        header: TraceHeader = json.loads(handle.readline() or "{}")
        if header.get("format") != FORMAT:
            raise ValueError(f"{path}: not a {FORMAT} file (format {header.get('format')!r})")
        return header, [json.loads(line) for line in handle if line.strip()]
