"""Time from drain to full service (analysis/breaker.py), on hand-made samples."""

from __future__ import annotations

import pytest

from retrybench.analysis.breaker import drain_s, drain_to_full_service_s, full_service_s, open_s_after
from retrybench.records.runlog import QueueSamples, RunLog

pytestmark = pytest.mark.beyond


def log(engine_waiting: list[int], breaker: list[int], pulse_end_s: float = 2.0) -> RunLog:
    n = len(engine_waiting)
    samples = QueueSamples(engine_waiting=engine_waiting, engine_running=[5] * n, proxy_waiting=[0] * n,
                           breaker_state=breaker)
    return RunLog(meta={"pulse_end_s": pulse_end_s}, calls=[], attempts=[], executions=[], samples=samples,
                  end_s=float(n))


def test_drain_is_the_first_sample_at_or_after_the_pulse_with_nothing_waiting() -> None:
    assert drain_s([0, 3, 2, 0, 0], [0, 0, 0, 0, 0], 1.5) == 3
    assert drain_s([0, 3, 2, 1, 0], [0, 0, 0, 4, 0], 1.0) == 4  # the proxy's queue counts too
    assert drain_s([0, 3, 3], [0, 0, 0], 1.0) is None


def test_full_service_is_the_start_of_the_last_closed_stretch() -> None:
    assert full_service_s([0, 1, 1, 2, 0, 1, 2, 0, 0]) == 7
    assert full_service_s([0, 0]) == 0
    assert full_service_s([0, 1]) is None
    assert full_service_s([]) is None


def test_drain_to_full_service_counts_from_the_drain_and_is_zero_when_closed_before() -> None:
    # drained at 4, the breaker reopened at 5 and closed for good at 8
    assert drain_to_full_service_s(log([9, 9, 9, 5, 0, 0, 0, 0, 0, 0], [0, 1, 1, 0, 0, 1, 2, 2, 0, 0])) == 4
    assert drain_to_full_service_s(log([9, 9, 9, 5, 0, 0], [0, 1, 0, 0, 0, 0])) == 0
    assert drain_to_full_service_s(log([9, 9, 9, 5, 0, 0], [0, 1, 0, 0, 0, 1])) is None  # never back
    assert drain_to_full_service_s(log([9, 9, 9, 5, 5, 5], [0, 1, 0, 0, 0, 0])) is None  # never drained


def test_open_seconds_count_every_sample_not_closed() -> None:
    assert open_s_after([0, 1, 2, 0, 1], 0) == 3
    assert open_s_after([0, 1, 2, 0, 1], 3) == 1
