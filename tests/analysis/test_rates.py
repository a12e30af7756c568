"""Execution rates over [pulse_end + 120, hold_end) in multiples of C-hat, and Little's law."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest

from retrybench.analysis import rate_window, rates
from retrybench.records.runlog import FATE_CANCELLED, FATE_COMPLETED, FATE_ORPHANED, FATE_REFUSED

if TYPE_CHECKING:
    from fixtures.runlogs import LogBuilder

SPAN = 600.0  # [347, 947)


def test_rate_window_is_the_primary_span(builder: LogBuilder) -> None:
    assert rate_window(builder.build()) == (347.0, 947.0)


def test_created_accepted_completed_and_retry_share(builder: LogBuilder) -> None:
    builder.meta["chat"] = 2.0
    # Created in the window: 12, of which 9 by retries. Outside: 346.9 and 947.0.
    for k in range(12):
        builder.execution(347.0 + 50 * k, attempt_no=0 if k < 3 else 1 + k % 3)
    builder.execution(346.9, attempt_no=1).execution(947.0, attempt_no=2)
    # Accepted in the window: 6 (all created before it).
    for t in (347.0, 400.0, 500.0, 600.0, 700.0, 946.9):
        builder.execution(100.0, accepted_s=t, fate=FATE_COMPLETED)
    builder.execution(200.0, accepted_s=346.9).execution(100.0, accepted_s=947.0)
    builder.execution(100.0, refused_s=100.1, fate=FATE_REFUSED)
    # Finished in the window: 3 completed + 2 orphaned count; cancelled and out-of-window do not.
    for t in (350.0, 450.0, 946.5):
        builder.execution(100.0, accepted_s=100.0, finished_s=t, fate=FATE_COMPLETED)
    for t in (360.0, 800.0):
        builder.execution(100.0, accepted_s=100.0, finished_s=t, fate=FATE_ORPHANED)
    builder.execution(100.0, accepted_s=100.0, finished_s=600.0, fate=FATE_CANCELLED)
    builder.execution(100.0, accepted_s=100.0, finished_s=947.0, fate=FATE_COMPLETED)
    builder.execution(100.0, accepted_s=100.0, finished_s=346.0, fate=FATE_ORPHANED)

    got = rates(builder.build())
    assert got.created_x == pytest.approx(12 / SPAN / 2.0)
    assert got.accepted_x == pytest.approx(6 / SPAN / 2.0)
    assert got.completed_x == pytest.approx(5 / SPAN / 2.0)
    assert got.retry_share_pct == pytest.approx(75.0)


def test_littles_law_waiting(builder: LogBuilder) -> None:
    # 720 attempts over 600 s: 1.2 attempts/s, so each waiting out 120 s gives a queue of 144.
    for k in range(720):
        builder.attempt(347.0 + k * SPAN / 720, attempt_no=k % 4)
    builder.attempt(346.9).attempt(947.0)
    builder.engine_queue(347, [144] * 300 + [140] * 300)
    builder.engine_queue(0, [999] * 347).engine_queue(947, [999] * 10)  # outside the window
    builder.proxy_queue(0, [50] * 1800)  # the proxy's queue is not the engine's
    got = rates(builder.build())
    assert got.attempt_rate == pytest.approx(1.2)
    assert got.littles_law_waiting == pytest.approx(144.0)
    assert got.mean_waiting == pytest.approx(142.0)
    assert got.mean_waiting_pct_of_littles_law == pytest.approx(100 * 142 / 144)


def test_empty_window_gives_zero_rates_and_nan_shares(builder: LogBuilder) -> None:
    got = rates(builder.build())
    assert (got.created_x, got.accepted_x, got.completed_x, got.attempt_rate) == (0.0, 0.0, 0.0, 0.0)
    assert math.isnan(got.retry_share_pct)
    assert got.littles_law_waiting == 0.0
    assert math.isnan(got.mean_waiting_pct_of_littles_law)


def test_window_follows_meta(builder: LogBuilder) -> None:
    builder.meta.update(pulse_end_s=200.0, hold_end_s=500.0, attempt_timeout_s=100.0, chat=1.0)
    builder.execution(299.9).execution(300.0).execution(499.9).execution(500.0)
    got = rates(builder.build())
    assert rate_window(builder.build()) == (300.0, 500.0)
    assert got.created_x == pytest.approx(2 / 200.0)
