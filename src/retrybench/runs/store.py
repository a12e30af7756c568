"""Where run results are cached: a simulated run by its spec, a live run by its spec, engine, C-hat and
time scale, and a live run's logs (records/cache.py writes each entry whole, with its digest, so an
interrupted batch resumes and never reads a partly written result). Calibrations have their own
entries (calibration/store.py)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from retrybench.plan.engine_choice import EngineChoice
from retrybench.plan.spec import RunSpec
from retrybench.records.cache import DamagedEntry, cache_dir, cached_json, has_entry, read_entry, write_entry
from retrybench.records.results import RunSummary

__all__ = ["live_run_key", "live_run_path", "live_workdir", "read_run", "run_is_cached", "run_path", "store_run",
           "through_cache"]


def run_path(spec: RunSpec) -> Path:
    return cache_dir() / "runs" / f"{spec.key()}.json"


def run_is_cached(spec: RunSpec) -> bool:
    """Whether the simulated run of `spec` is in the cache, whole and sound (it would not be computed)."""
    return has_entry(run_path(spec))


def read_run(spec: RunSpec) -> RunSummary | None:
    """The cached summary of `spec`'s simulated run, or None where there is no sound one (a damaged entry
    is reported where it is recomputed, by through_cache)."""
    try:
        summary: RunSummary = read_entry(run_path(spec))
    except (FileNotFoundError, DamagedEntry):
        return None
    return summary


def store_run(spec: RunSpec, summary: RunSummary) -> None:
    """Cache a summary computed elsewhere (a Ray worker's) where read_run and through_cache look for it."""
    write_entry(run_path(spec), summary)


def through_cache(spec: RunSpec, compute: Callable[[], RunSummary], use_cache: bool = True) -> RunSummary:
    """The cached summary of `spec`'s simulated run, else compute()'s, cached."""
    return cached_json(run_path(spec), compute, use_cache)


def live_run_key(spec: RunSpec, engine: EngineChoice, chat: float, time_scale: float) -> str:
    """The cache key of a live run: the spec (and code), the engine as named, C-hat and the time scale."""
    text = json.dumps({"spec": spec.key(), "engine": str(engine), "chat": chat, "time_scale": time_scale})
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def live_run_path(key: str) -> Path:
    return cache_dir() / "live-runs" / f"{key}.json"


def live_workdir(prefix: str) -> Path:
    """A new directory for a live run's (or a live calibration's) logs, under the cache."""
    parent = cache_dir() / "live"
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
