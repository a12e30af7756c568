"""The `builder` fixture: a fresh hand-made RunLog builder (fixtures/runlogs.py) for each test."""

from __future__ import annotations

import pytest
from fixtures.runlogs import PAPER_META, LogBuilder

__all__ = ["PAPER_META", "LogBuilder", "builder"]


@pytest.fixture
def builder() -> LogBuilder:
    """A fresh builder on the paper's protocol, with empty queues over a 1,800-s run."""
    return LogBuilder()
