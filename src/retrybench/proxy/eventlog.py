"""The live proxy's decision log: one JSON object per line, the first line a header.

It holds every input the proxy core saw (attempts, subscribers leaving, engine events, timers)
with its time, and every decision and action it took, so that a live run can be replayed through
the simulator's `ProxyCore` (analysis/conformance.py) and joined with the load generator's log.
Its schema (the header and each kind of event) is records/decisionlog.py's.
Lines are buffered and flushed at least every `flush_s`, so a crash loses at most that much.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO

from retrybench.records.decisionlog import SCHEMA, DecisionEvent, DecisionLogHeader

__all__ = ["PROXY_LOG", "SCHEMA", "EventLog", "read_event_log"]

PROXY_LOG = "proxy-decisions.jsonl"  # the decision log's name in a live run's workdir


class EventLog:
    """Appends events to a JSONL file (when `path` is given) and keeps them in memory if `keep`."""

    def __init__(self, path: Path | None, header: DecisionLogHeader, flush_s: float = 0.25, keep: bool = False) -> None:
        self.path = path
        self.flush_s = flush_s
        self.keep = keep
        self.events: list[DecisionEvent] = []  # only when keep
        self._pending: list[str] = []
        self._last_flush = time.monotonic()
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", encoding="utf-8")
            first: DecisionLogHeader = {"schema": SCHEMA, **header}
            self._file.write(json.dumps(first) + "\n")
            self._file.flush()

    @property
    def active(self) -> bool:
        """Whether events go anywhere (callers skip building them when not)."""
        return self.keep or self._file is not None

    def write(self, event: DecisionEvent) -> None:
        if self.keep:
            self.events.append(event)
        if self._file is None:
            return
        self._pending.append(json.dumps(event, separators=(",", ":")))
        if time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if self._file is None or not self._pending:
            return
        self._file.write("\n".join(self._pending) + "\n")
        self._file.flush()
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


def read_event_log(path: Path) -> tuple[DecisionLogHeader, list[DecisionEvent]]:
    """(header, events); a torn last line (a crash mid-write) is skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines:
        raise ValueError(f"{path}: empty proxy log")
    header: DecisionLogHeader = json.loads(lines[0])
    if header.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} file (schema {header.get('schema')!r})")
    events = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if number != len(lines):
                raise ValueError(f"{path}:{number}: malformed line") from None
    return header, events
