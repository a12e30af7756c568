"""A verdict's margin over the engine-speed band, from the verdicts at speeds 0.95, 1 and 1.05: robust when
all agree, knife-edge naming the speeds that flip it, none where there is no verdict to hold."""

from __future__ import annotations

import pytest

from retrybench.plan.speeds import CALIBRATED, SPEEDS, side_speeds, speed_label
from retrybench.report.margin import KNIFE_EDGE, ROBUST, Margin, margin_of
from retrybench.report.verdicts import NOT_REPRODUCED, NOT_RUN, REPRODUCED, UNCERTAIN

YES, NO = REPRODUCED, NOT_REPRODUCED


def at(slow: str, calibrated: str, fast: str) -> dict[float, str]:
    return dict(zip(SPEEDS, (slow, calibrated, fast), strict=True))


def test_the_band_is_five_percent_either_side_of_the_calibrated_engine() -> None:
    assert SPEEDS == (0.95, 1.0, 1.05) and CALIBRATED == 1.0
    assert side_speeds() == (0.95, 1.05)
    assert [speed_label(s) for s in SPEEDS] == ["0.95", "1", "1.05"]


@pytest.mark.parametrize("verdict", [YES, NO])
def test_the_same_verdict_at_every_speed_is_robust(verdict: str) -> None:
    assert margin_of(at(verdict, verdict, verdict)) == Margin(ROBUST)


@pytest.mark.parametrize(("verdicts", "flips_at"), [
    (at(NO, YES, YES), (0.95,)),  # the slower engine flips it
    (at(YES, YES, NO), (1.05,)),  # the faster engine flips it
    (at(YES, NO, YES), (0.95, 1.05)),  # both sides flip it
    (at(NO, YES, NO), (0.95, 1.05)),
])
def test_a_verdict_another_speed_flips_is_knife_edge_naming_the_speeds(verdicts: dict[float, str],
                                                                       flips_at: tuple[float, ...]) -> None:
    assert margin_of(verdicts) == Margin(KNIFE_EDGE, flips_at)


@pytest.mark.parametrize("calibrated", [NOT_RUN, UNCERTAIN])
def test_a_claim_with_no_verdict_has_no_margin(calibrated: str) -> None:
    assert margin_of(at(YES, calibrated, NO)) == Margin(None)
    assert margin_of({}) == Margin(None)


def test_a_side_not_judged_leaves_no_margin_unless_the_other_side_flips() -> None:
    assert margin_of(at(NOT_RUN, YES, YES)) == Margin(None)
    assert margin_of({CALIBRATED: YES, 1.05: YES}) == Margin(None)  # 0.95 not run at all
    assert margin_of(at(NOT_RUN, YES, NO)) == Margin(KNIFE_EDGE, (1.05,))
