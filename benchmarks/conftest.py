"""Shared machinery of the finding tests: paper values, cached runs, recorded figures."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
os.environ.setdefault("RETRYBENCH_CACHE", str(HERE.parent / ".retrybench-cache"))

from retrybench.runner import RunSpec, run_one  # noqa: E402  (after the cache location is set)

PAPER: dict[str, Any] = tomllib.loads((HERE / "paper_values.toml").read_text())

# The one tolerance band of the suite, for claims the paper states as "near" a figure: the
# measured value must lie within this relative margin of the paper's [low, high] range.
NEAR = 0.10


def near(value: float, low: float, high: float, margin: float = NEAR) -> bool:
    """True if value lies in [low, high] widened by `margin` of each end."""
    return low * (1 - margin) <= value <= high * (1 + margin)


def result(model: str, condition: str, seed: int, **overrides: Any) -> dict[str, Any]:
    """One run's summary (simulated engine), computed once and then read from the cache."""
    return run_one(RunSpec(model=model, condition=condition, seed=seed, **overrides))


@pytest.fixture
def record(record_property: Any) -> Any:
    """record(name, measured, paper): keeps both figures in the test report (junit properties)."""

    def _record(name: str, measured: Any, paper: Any = None) -> None:
        record_property(f"measured:{name}", measured)
        if paper is not None:
            record_property(f"paper:{name}", paper)

    return _record
