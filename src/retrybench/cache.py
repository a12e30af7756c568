"""The result cache: where results live, the code version that keys them, and cached JSON files.

A result is cached under the hash of its spec and of the package's own source, so a code change never
reuses a stale result; files are written atomically, so a crash leaves the whole entry or none.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TypeVar

from retrybench import __version__
from retrybench.atomicfile import write_atomic

__all__ = ["cache_dir", "cached_json", "code_version"]

# Modules that only read results (the report, the command line): a change there must not invalidate every
# cached run.
_NOT_RESULTS = ("report", "cli.py")

T = TypeVar("T")


@cache
def code_version() -> str:
    """Hash of every source and data file the results depend on (all but the report and the CLI)."""
    digest = hashlib.sha256(__version__.encode())
    root = Path(str(resources.files("retrybench")))
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if path.suffix in (".py", ".toml") and "__pycache__" not in parts and parts[0] not in _NOT_RESULTS:
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    """$RETRYBENCH_CACHE, or ~/.cache/retrybench."""
    env = os.environ.get("RETRYBENCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "retrybench"


def cached_json(path: Path, compute: Callable[[], T], use_cache: bool) -> T:
    """The JSON at `path` if present and readable, else `compute()`, written there atomically."""
    if use_cache and path.exists():
        try:
            data: T = json.loads(path.read_text())
            return data
        except (OSError, json.JSONDecodeError):
            pass  # a damaged entry is recomputed
    data = compute()
    if use_cache:
        write_atomic(path, json.dumps(data, sort_keys=True, indent=1))
    return data
