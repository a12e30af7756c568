"""The result cache: where results live, the code version that keys them, and cached JSON files.

A result is cached under the hash of its spec and of the package's own source, so a code change never
reuses a stale result; files are written atomically, so a crash leaves the whole entry or none. Each entry
carries the SHA-256 of its content, so an entry damaged afterwards (truncated, overwritten, one digit
changed) is noticed on reading, reported and recomputed, never returned.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from retrybench import __version__
from retrybench.records.atomicfile import write_atomic

__all__ = ["ENTRY_FORMAT", "DamagedEntry", "cache_dir", "cached_json", "code_version", "has_entry", "read_entry",
           "write_entry"]

# Modules that only read results or hand specs to the run service (the report, sweeps, assess, the command line, the
# reproduce orchestration and its progress display): a change there must not invalidate every cached run.
_NOT_RESULTS = ("report", "sweep", "assess", "cli", "runs/reproduce.py", "runs/display.py")

T = TypeVar("T")
_RESULT_FILES = (".py", ".toml", ".csv", ".json")  # code, policies, fitted constants, layer and kernel tables

ENTRY_FORMAT = "retrybench-cache/1"
_ENVELOPE = {"format", "sha256", "data"}  # an entry's keys: the digest is of the data's canonical JSON


@cache
def code_version() -> str:
    """Hash of every source and data file the results depend on (all but the report and the CLI)."""
    digest = hashlib.sha256(__version__.encode())
    root = Path(str(resources.files("retrybench")))
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        parts = relative.parts
        if path.suffix in _RESULT_FILES and "__pycache__" not in parts and parts[0] not in _NOT_RESULTS \
                and relative.as_posix() not in _NOT_RESULTS:
            digest.update(str(relative).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    """$RETRYBENCH_CACHE, or ~/.cache/retrybench."""
    env = os.environ.get("RETRYBENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "retrybench"


class DamagedEntry(ValueError):
    """A cache entry that is there but cannot be trusted: unreadable, not JSON (cut short, overwritten),
    without a digest (an older version wrote it) or with content that no longer matches its digest."""


def _canonical(data: object) -> bytes:
    """The one text of `data` its digest is taken of: the same before writing and after reading back."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: object) -> str:
    return hashlib.sha256(_canonical(data)).hexdigest()


def write_entry(path: Path, data: object) -> None:
    """Write `data` to `path` atomically, with its digest, for read_entry to check."""
    stored = json.loads(json.dumps(data))  # as it will read back (tuples as lists, keys as strings)
    envelope = {"format": ENTRY_FORMAT, "sha256": _digest(stored), "data": stored}
    write_atomic(path, json.dumps(envelope, sort_keys=True, indent=1))


def read_entry(path: Path) -> Any:
    """The data of the entry at `path`; FileNotFoundError if there is none, DamagedEntry (saying what is
    wrong) if it cannot be trusted."""
    envelope = _load(path)
    if not isinstance(envelope, dict) or envelope.get("format") != ENTRY_FORMAT or not envelope.keys() >= _ENVELOPE:
        raise DamagedEntry(f"not a {ENTRY_FORMAT} entry (no digest: written by an older version?)")
    if _digest(envelope["data"]) != envelope["sha256"]:
        raise DamagedEntry("content does not match its SHA-256 (altered after it was written)")
    return envelope["data"]



def _load(path: Path) -> Any:
    """The JSON at `path`; FileNotFoundError if there is none, DamagedEntry if it is not JSON."""
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise
    except OSError as error:
        raise DamagedEntry(f"unreadable ({error})") from error
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise DamagedEntry("not valid JSON (cut short or overwritten)") from error


def has_entry(path: Path, report: bool = False) -> bool:
    """Whether `path` holds a sound entry; with `report`, a damaged one is reported (it will be recomputed)."""
    try:
        read_entry(path)
    except FileNotFoundError:
        return False
    except DamagedEntry as error:
        if report:
            _report_damaged(path, error)
        return False
    return True


def _report_damaged(path: Path, error: DamagedEntry) -> None:
    print(f"retrybench: warning: damaged cache entry {path}: {error}; recomputing it", file=sys.stderr, flush=True)


def cached_json(path: Path, compute: Callable[[], T], use_cache: bool) -> T:
    """The data of the entry at `path` if present and sound, else `compute()`, written there atomically.
    A damaged entry is reported on stderr and recomputed."""
    if use_cache:
        try:
            data: T = read_entry(path)
            return data
        except FileNotFoundError:
            pass
        except DamagedEntry as error:
            _report_damaged(path, error)
    data = compute()
    if use_cache:
        write_entry(path, data)
    return data
