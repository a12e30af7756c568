"""Shared machinery of the finding tests: where cached runs live, and recorded figures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# Finding tests share runs through the result cache; keep it inside the checkout.
os.environ.setdefault("RETRYBENCH_CACHE", str(Path(__file__).resolve().parents[1] / ".retrybench-cache"))


@pytest.fixture
def record(record_property: Any) -> Any:
    """record(name, measured, paper): keeps both figures in the test report (junit properties)."""

    def _record(name: str, measured: Any, paper: Any = None) -> None:
        record_property(f"measured:{name}", measured)
        if paper is not None:
            record_property(f"paper:{name}", paper)

    return _record

