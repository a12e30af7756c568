"""Recorded workloads: the project's own CSV/JSONL, Azure's LLM inference trace and BurstGPT's CSV, read
into rows of (arrival, prompt length, output length).

Parsing is pure (text in, rows out); `read_workload` is the only function that touches the disk. Every
bad row is refused with its file, line and field, before any run starts: a trace that was silently
dropped, clipped or reordered would not be the traffic the user meant to replay.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["FORMATS", "REQUIRED", "RecordedWorkload", "Row", "WorkloadFileError", "detect_format",
           "file_digest", "parse_workload", "read_workload"]

FORMATS = ("own", "azure", "burstgpt")
# Each format's columns: arrival, prompt tokens, output tokens (the order Row takes them in).
REQUIRED: dict[str, tuple[str, str, str]] = {
    "own": ("arrival_s", "prompt_tokens", "output_tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}
OPTIONAL_OWN = ("prefix_tokens", "call_id")


class WorkloadFileError(ValueError):
    """A workload file that cannot be replayed as written; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class Row:
    """One recorded call: its arrival in seconds from the trace's start, and its token counts."""

    line: int  # where it is in the file, for messages about it later (e.g. the engine's length limit)
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_tokens: int | None = None
    call_id: str | None = None


@dataclass(frozen=True)
class RecordedWorkload:
    """A file's rows in arrival order, with the name messages use and the format it was read as."""

    name: str
    format: str
    rows: tuple[Row, ...]

    @property
    def prefix_tokens(self) -> int:
        """The shared prefix every prompt starts with (0 when the file gives none)."""
        given = [r.prefix_tokens for r in self.rows if r.prefix_tokens is not None]
        return given[0] if given else 0

    @property
    def duration_s(self) -> float:
        """The last arrival: the span the file's mean rate is measured over."""
        return self.rows[-1].arrival_s

    def rate_calls_per_s(self) -> float:
        """Calls per second over the file's span (inf for a file whose calls all arrive at 0)."""
        return len(self.rows) / self.duration_s if self.duration_s > 0 else math.inf


def file_digest(data: bytes) -> str:
    """The content digest a run's identity carries, so a changed file is a different run."""
    return hashlib.sha256(data).hexdigest()


def detect_format(columns: Sequence[str]) -> str:
    """The format whose required columns the header has; otherwise a message naming what is missing
    from the nearest format (or every format's columns, when the header shares none)."""
    present = {c.strip() for c in columns}
    complete = [f for f in FORMATS if set(REQUIRED[f]) <= present]
    if complete:
        return complete[0]
    nearest = max(FORMATS, key=lambda f: len(set(REQUIRED[f]) & present))
    if set(REQUIRED[nearest]) & present:
        missing = next(c for c in REQUIRED[nearest] if c not in present)
        raise ValueError(f"missing required column {missing!r} ({nearest} format)")
    known = "; ".join(f"{f}: {', '.join(REQUIRED[f])}" for f in FORMATS)
    raise ValueError(f"the header names no known format ({known})")


def _fail(name: str, line: int, field: str | None, problem: str) -> WorkloadFileError:
    where = f"{name}: line {line}" + (f": {field}" if field else "")
    return WorkloadFileError(f"{where}: {problem}")


def _records(text: str) -> Iterator[tuple[int, Mapping[str, object]]]:
    """(line number, record) of a CSV (header first) or a JSONL file; blank lines carry no record.
    The header, or the first JSON object's keys, is yielded as record 0's line with an empty mapping."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return
    if lines[first].lstrip().startswith("{"):
        yield from _json_records(lines)
        return
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    for values in reader:
        if not any(v.strip() for v in values):
            continue
        if header is None:
            header = [v.strip() for v in values]
            yield reader.line_num, {name: None for name in header}
            continue
        if len(values) != len(header):
            raise ValueError(f"line {reader.line_num}: {len(values)} fields, the header has {len(header)}")
        yield reader.line_num, dict(zip(header, values, strict=True))


def _json_records(lines: Sequence[str]) -> Iterator[tuple[int, Mapping[str, object]]]:
    header_done = False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise ValueError(f"line {number}: not a JSON object: {error}") from error
        if not isinstance(record, dict):
            raise ValueError(f"line {number}: not a JSON object")
        if not header_done:
            yield number, {name: None for name in record}
            header_done = True
        yield number, record


def _number(value: object) -> float:
    if isinstance(value, bool) or value is None:
        raise ValueError(f"not a number: {value!r}")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        number = float(value.strip())
    else:
        raise ValueError(f"not a number: {value!r}")
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number


def _tokens(value: object, *, least: int) -> int:
    try:
        number = _number(value)
    except ValueError:
        raise ValueError(f"not a whole number: {value!r}") from None
    if not number.is_integer():
        raise ValueError(f"not a whole number: {value!r}")
    if number < 0:
        raise ValueError(f"negative: {value!r}")
    if number < least:
        raise ValueError(f"{int(number)} tokens: a call needs at least {least}")
    return int(number)


def _seconds(value: object, fmt: str) -> float:
    if fmt == "azure":
        if not isinstance(value, str):
            raise ValueError(f"not a date and time: {value!r}")
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"not a date and time (2023-11-16 18:15:46.6805900): {value!r}") from None
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()  # no local DST shifts
    number = _number(value)
    if number < 0:
        raise ValueError(f"negative: {value!r}")
    return number


def _row(name: str, fmt: str, line: int, record: Mapping[str, object]) -> Row:
    """One record as a Row (arrival as recorded, not yet from the trace's start)."""
    arrival, prompt, output = REQUIRED[fmt]
    fields: dict[str, object] = {}
    for field, key, parse in ((arrival, "arrival_s", lambda v: _seconds(v, fmt)),
                              (prompt, "prompt_tokens", lambda v: _tokens(v, least=1)),
                              (output, "output_tokens", lambda v: _tokens(v, least=1))):
        if record.get(field) is None or record.get(field) == "":
            raise _fail(name, line, field, "missing")
        try:
            fields[key] = parse(record[field])
        except ValueError as error:
            raise _fail(name, line, field, str(error)) from None
    if fmt == "own":
        prefix = record.get("prefix_tokens")
        if prefix is not None and prefix != "":
            try:
                fields["prefix_tokens"] = _tokens(prefix, least=0)
            except ValueError as error:
                raise _fail(name, line, "prefix_tokens", str(error)) from None
        call_id = record.get("call_id")
        if call_id is not None and call_id != "":
            fields["call_id"] = str(call_id)
    return Row(line=line, **fields)  # type: ignore[arg-type]


def parse_workload(text: str, name: str, fmt: str | None = None) -> RecordedWorkload:
    """The rows of a workload file's `text` (`name` is what messages call it), in `fmt` or the format its
    header names; arrivals made relative to the first row, in arrival order. The own format must already
    be in order and start at its own zero; Azure's and BurstGPT's are absolute times, sorted here (stably)."""
    if fmt is not None and fmt not in FORMATS:
        raise WorkloadFileError(f"{name}: unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    try:
        records = list(_records(text))
    except ValueError as error:
        raise WorkloadFileError(f"{name}: {error}") from None
    if not records:
        raise WorkloadFileError(f"{name}: empty file: no header and no calls")
    header_line, header = records[0]
    try:
        chosen = fmt or detect_format(list(header))
        missing = [c for c in REQUIRED[chosen] if c not in header]
        if missing:
            raise ValueError(f"missing required column {missing[0]!r} ({chosen} format)")
    except ValueError as error:
        raise WorkloadFileError(f"{name}: line {header_line}: {error}") from None
    body = records[1:]  # a JSONL file's first record is both its header and its first call
    if not body:
        raise WorkloadFileError(f"{name}: no calls: the file has a header and no rows")
    rows = [_row(name, chosen, line, record) for line, record in body]
    return RecordedWorkload(name=name, format=chosen, rows=_ordered(name, chosen, rows))


def _ordered(name: str, fmt: str, rows: list[Row]) -> tuple[Row, ...]:
    """Rows from the trace's start, in arrival order, with one shared prefix and unique call ids."""
    if fmt == "own":
        for before, after in itertools.pairwise(rows):
            if after.arrival_s < before.arrival_s:
                raise _fail(name, after.line, "arrival_s",
                            f"goes backwards ({after.arrival_s:g} s, after {before.arrival_s:g} s on line "
                            f"{before.line})")
        start = 0.0
    else:
        rows = sorted(rows, key=lambda r: r.arrival_s)
        start = rows[0].arrival_s
    prefixes = [r for r in rows if r.prefix_tokens is not None]
    seen: dict[str, int] = {}
    for row in rows:
        if prefixes and row.prefix_tokens is None:
            raise _fail(name, row.line, "prefix_tokens", f"missing, where line {prefixes[0].line} gives one")
        if prefixes and row.prefix_tokens != prefixes[0].prefix_tokens:
            raise _fail(name, row.line, "prefix_tokens",
                        f"{row.prefix_tokens} differs from line {prefixes[0].line}'s {prefixes[0].prefix_tokens}: "
                        "the engine caches one shared prefix, so every row gives the same one")
        if row.prefix_tokens is not None and row.prompt_tokens <= row.prefix_tokens:
            raise _fail(name, row.line, "prompt_tokens",
                        f"{row.prompt_tokens} tokens, not longer than the {row.prefix_tokens}-token shared prefix")
        if row.call_id is not None:
            if row.call_id in seen:
                raise _fail(name, row.line, "call_id", f"{row.call_id!r} repeats line {seen[row.call_id]}'s")
            seen[row.call_id] = row.line
    return tuple(Row(line=r.line, arrival_s=r.arrival_s - start, prompt_tokens=r.prompt_tokens,
                     output_tokens=r.output_tokens, prefix_tokens=r.prefix_tokens, call_id=r.call_id) for r in rows)


def read_workload(path: Path, fmt: str | None = None) -> tuple[RecordedWorkload, str]:
    """The workload in the file at `path` and its content digest; WorkloadFileError names the file."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise WorkloadFileError(f"{path}: cannot read: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise WorkloadFileError(f"{path}: not UTF-8 text: {error}") from None
    return parse_workload(text, str(path), fmt), file_digest(data)
