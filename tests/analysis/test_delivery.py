"""Delivery, cohorts and recovery as Section 3.2 defines them, on hand-made logs."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import pytest

from retrybench.analysis import cohort_delivery, cohorts, delivered_per_window, recovery, summarize

if TYPE_CHECKING:
    from fixtures.runlogs import LogBuilder

PULSE_END = 227
WINDOW = 60


def window_start(i: int) -> int:
    """Start of the hold's i-th 60-s window, counted from 1 as the paper's prose does."""
    return PULSE_END + WINDOW * (i - 1)


def bad_queue_in(b: LogBuilder, *windows: int) -> LogBuilder:
    """Put a queue of 5 (above the limit of 2) into the given windows, leaving the others empty."""
    for i in windows:
        b.engine_queue(window_start(i), [5] * WINDOW)
    return b


# --- cohorts ------------------------------------------------------------------------------------


def test_cohort_boundaries_follow_planned_arrival(builder: LogBuilder) -> None:
    builder.calls_at([119.9, 120.0, 226.9, 227.0, 346.9, 347.0, 946.9, 947.0], took_s=10.0)
    got = cohorts(builder.build())
    assert got["pulse"].calls == 2  # 120.0 and 226.9
    assert got["hold"].calls == 4  # 227.0, 346.9, 347.0, 946.9
    assert got["primary"].calls == 2  # 347.0 and 946.9


def test_delivered_by_the_horizon_inclusive(builder: LogBuilder) -> None:
    builder.call(130.0, 840.0).call(226.9, 840.0).call(140.0, 840.1).call(150.0, None)
    pulse = cohorts(builder.build())["pulse"]
    assert (pulse.calls, pulse.delivered) == (4, 2)
    assert pulse.delivered_pct == pytest.approx(50.0)


def test_timely_within_the_first_deadline_inclusive(builder: LogBuilder) -> None:
    builder.call(300.0, 120.0).call(301.1, 120.0).call(302.0, 120.1).call(303.0, 500.0)
    hold = cohorts(builder.build())["hold"]
    assert (hold.calls, hold.delivered, hold.timely) == (4, 4, 2)
    assert hold.timely_pct == pytest.approx(50.0)
    assert hold.delivered_pct == pytest.approx(100.0)


def test_cohort_bounds_come_from_meta() -> None:
    from fixtures.runlogs import LogBuilder

    b = LogBuilder(pulse_start_s=100.0, pulse_end_s=200.0, hold_end_s=500.0)
    b.calls_at([100.0, 199.9, 200.0, 319.9, 320.0, 499.9, 500.0], took_s=1.0)
    got = cohorts(b.build())
    assert (got["pulse"].calls, got["hold"].calls, got["primary"].calls) == (2, 4, 2)


def test_empty_cohort_has_nan_percentages(builder: LogBuilder) -> None:
    got = cohort_delivery(builder.call(10.0, 1.0).build(), 120.0, 227.0)
    assert (got.calls, got.delivered, got.timely) == (0, 0, 0)
    assert math.isnan(got.delivered_pct) and math.isnan(got.timely_pct)


# --- recovery -----------------------------------------------------------------------------------


def test_hold_is_cut_into_twelve_windows_from_the_pulse_end(builder: LogBuilder) -> None:
    windows = recovery(builder.build()).windows
    assert [(w.start_s, w.end_s) for w in windows] == [(227.0 + 60 * i, 287.0 + 60 * i) for i in range(12)]


def test_windows_that_would_cross_the_hold_end_are_left_out() -> None:
    from fixtures.runlogs import LogBuilder

    windows = recovery(LogBuilder(hold_end_s=980.0).build()).windows
    assert len(windows) == 12 and windows[-1].end_s == 947.0


def test_first_good_pair_is_windows_3_and_4(builder: LogBuilder) -> None:
    bad_queue_in(builder, 1, 2)
    got = recovery(builder.build())
    assert [w.good for w in got.windows[:4]] == [False, False, True, True]
    assert (got.recovered, got.recovery_s) == (True, 240.0)


def test_recovery_is_the_first_pair_not_the_first_good_window(builder: LogBuilder) -> None:
    bad_queue_in(builder, 1, 2, 4)  # window 3 good alone, then 5 and 6
    got = recovery(builder.build())
    assert (got.recovered, got.recovery_s) == (True, 360.0)


def test_single_good_window_followed_by_a_bad_one_does_not_recover(builder: LogBuilder) -> None:
    bad_queue_in(builder, *[i for i in range(1, 13) if i != 5])
    got = recovery(builder.build())
    assert [w.good for w in got.windows].count(True) == 1
    assert (got.recovered, got.recovery_s) == (False, None)


def test_late_calls_make_a_window_bad(builder: LogBuilder) -> None:
    # Windows 1-2: 3 of 50 calls late (94%). Window 3: 1 of 50 late (98%, the limit). Window 4: all timely.
    for i, late in ((1, 3), (2, 3), (3, 1), (4, 0)):
        start = window_start(i)
        for k in range(50):
            builder.call(start + k, 200.0 if k < late else 5.0)
    got = recovery(builder.build())
    assert [w.timely_pct for w in got.windows[:4]] == pytest.approx([94.0, 94.0, 98.0, 100.0])
    assert [w.calls for w in got.windows[:4]] == [50, 50, 50, 50]
    assert (got.recovered, got.recovery_s) == (True, 240.0)


def test_undelivered_calls_count_against_the_window(builder: LogBuilder) -> None:
    builder.call(window_start(1) + 1.0, None).call(window_start(1) + 2.0, 1.0)
    got = recovery(builder.build())
    assert got.windows[0].timely_pct == pytest.approx(50.0)
    assert not got.windows[0].good
    assert got.recovery_s == 180.0


def test_queue_average_above_two_blocks_recovery(builder: LogBuilder) -> None:
    builder.engine_queue(0, [2, 3] * 900)  # mean 2.5, flat
    got = recovery(builder.build())
    assert all(w.mean_waiting == pytest.approx(2.5) for w in got.windows)
    assert all(abs(w.growth_per_s) < 0.01 for w in got.windows)
    assert (got.recovered, got.recovery_s) == (False, None)


def test_queue_average_of_exactly_two_is_allowed(builder: LogBuilder) -> None:
    builder.engine_queue(0, [1, 3] * 900)
    assert recovery(builder.build()).recovery_s == 120.0


def test_proxy_queue_counts_with_the_engine_queue(builder: LogBuilder) -> None:
    builder.engine_queue(0, [1] * 1800).proxy_queue(0, [2] * 1800)
    got = recovery(builder.build())
    assert got.windows[0].mean_waiting == pytest.approx(3.0)
    assert not got.recovered


def step_queue(b: LogBuilder, last_k: int) -> LogBuilder:
    """In every window, a queue of 1 that rises to 2 for the window's last last_k seconds."""
    for i in range(1, 13):
        b.engine_queue(window_start(i), [1] * (WINDOW - last_k) + [2] * last_k)
    return b


def test_growing_queue_blocks_recovery(builder: LogBuilder) -> None:
    # Rising for the last 17 s: least-squares slope 365.5 / 17995 = 0.0203 per s, mean 1.28 (below 2).
    got = recovery(step_queue(builder, 17).build())
    for w in got.windows:
        assert w.mean_waiting == pytest.approx(1 + 17 / 60)
        assert w.growth_per_s == pytest.approx(365.5 / 17995)
        assert not w.good
    assert (got.recovered, got.recovery_s) == (False, None)


def test_slow_growth_is_allowed(builder: LogBuilder) -> None:
    # Rising for the last 6 s: slope 162 / 17995 = 0.0090 per s, under the limit of 0.01.
    got = recovery(step_queue(builder, 6).build())
    assert got.windows[0].growth_per_s == pytest.approx(162 / 17995)
    assert (got.recovered, got.recovery_s) == (True, 120.0)


def test_growth_is_a_least_squares_slope(builder: LogBuilder) -> None:
    builder.engine_queue(window_start(1), list(range(WINDOW)))
    got = recovery(builder.build(), max_mean_queue=100.0)
    assert got.windows[0].growth_per_s == pytest.approx(1.0)
    assert got.windows[1].growth_per_s == pytest.approx(0.0)


def test_empty_windows_are_good_on_delivery(builder: LogBuilder) -> None:
    got = recovery(builder.build())
    first = got.windows[0]
    assert first.calls == 0 and math.isnan(first.timely_pct) and first.good
    assert (got.recovered, got.recovery_s) == (True, 120.0)


def test_no_recovery_within_the_hold_is_censored(builder: LogBuilder) -> None:
    builder.engine_queue(0, [40] * 1800)
    got = recovery(builder.build())
    assert (got.recovered, got.recovery_s) == (False, None)
    assert len(got.windows) == 12 and not any(w.good for w in got.windows)


def test_window_without_queue_samples_is_not_good(builder: LogBuilder) -> None:
    bad_queue_in(builder, 1, 2)
    builder.engine_waiting = builder.engine_waiting[:400]
    builder.proxy_waiting = builder.proxy_waiting[:400]
    got = recovery(builder.build())
    assert got.windows[2].good  # [347, 407) has 53 of its 60 samples
    assert math.isnan(got.windows[3].mean_waiting) and not got.windows[3].good
    assert (got.recovered, got.recovery_s) == (False, None)


# --- Figure 1(a) and summarize ------------------------------------------------------------------


def test_delivered_per_window_counts_wall_time_windows(builder: LogBuilder) -> None:
    builder.call(5.0, 5.0).call(50.0, 9.9).call(0.0, 60.0).call(100.0, 100.0).call(20.0, 900.0)
    builder.call(30.0, None)
    builder.end_s = 300.0
    got = delivered_per_window(builder.build())
    assert got == [(0.0, 2), (60.0, 1), (120.0, 0), (180.0, 1), (240.0, 0)]


def test_summarize_is_flat_json_with_none_for_nan(builder: LogBuilder) -> None:
    builder.calls_at([300.0, 400.0, 500.0], took_s=10.0).call(600.0, None, failed=True)
    builder.attempt(400.0).attempt(520.0, attempt_no=1)
    builder.execution(400.0, accepted_s=400.5, finished_s=410.0)
    builder.execution(520.0, attempt_no=1, refused_s=520.1, fate="refused")
    builder.execution(530.0, attempt_no=2, accepted_s=530.1, fate="cancelled")
    row = summarize(builder.build())
    json.dumps(row, allow_nan=False)
    assert row["pulse_delivered_pct"] is None and row["pulse_timely_pct"] is None
    assert row["hold_delivered_pct"] == 75.0
    assert row["primary_timely_pct"] == pytest.approx(66.6667)
    assert (row["recovered"], row["recovery_s"]) == (True, 120.0)
    assert row["created_x"] == round(3 / 600 / 2.78, 4)
    assert row["retry_share_pct"] == pytest.approx(66.6667)
    expected = {
        "attempts": 2,
        "retries": 1,
        "executions_created": 3,
        "executions_accepted": 2,
        "executions_refused": 1,
        "executions_cancelled": 1,
        "calls": 4,
        "calls_delivered": 3,
        "calls_failed": 1,
    }
    assert {k: v for k, v in row.items() if k in expected} == expected
    assert set(row) >= {
        "completed_x",
        "accepted_x",
        "mean_waiting",
        "littles_law_waiting",
        "mean_waiting_pct_of_littles_law",
    }
