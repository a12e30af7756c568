"""The engine event trace as JSONL: one schema for the simulated engine and a traced vLLM.

The first line is a header {"format": "retrybench-engine-trace/1", ...meta}. Every further line is
one event with its time `t` (seconds since the run's start) and `event`:
- queued, abort_requested, first_token, finished, preempted: {"execution": id}
- aborted: {"execution", "computed_prompt_tokens", "in_flight_prompt_tokens", "unscheduled"}
- step (when a batch is scheduled): {"step", "start_s", "end_s", "prompt_tokens": {id: n},
  "decode": [id, ...], "cached_tokens": {id: prefix-cache hit of a newly admitted execution},
  "preempted": [id, ...]}
- step_done: {"step", "start_s"} when the batch's output is processed
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from retrybench.records.atomicfile import write_atomic

__all__ = ["FORMAT", "ExecutionEvent", "read_trace", "write_trace"]

FORMAT = "retrybench-engine-trace/1"

# The events of one execution in the trace (a step is logged on its own, with its batch).
ExecutionEvent = Literal["queued", "abort_requested", "first_token", "finished", "step_done", "preempted", "aborted"]


def write_trace(path: Path, events: Iterable[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Write atomically: a crash leaves the old file or the whole new one."""
    lines = [json.dumps({"format": FORMAT, **meta}, sort_keys=True)]
    lines += [json.dumps(event, separators=(",", ":")) for event in events]
    write_atomic(Path(path), "\n".join(lines) + "\n")


def read_trace(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with path.open() as handle:
        header = json.loads(handle.readline() or "{}")
        if header.get("format") != FORMAT:
            raise ValueError(f"{path}: not a {FORMAT} file (format {header.get('format')!r})")
        return header, [json.loads(line) for line in handle if line.strip()]
