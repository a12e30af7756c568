"""A verdict's margin: whether it holds over the engine-speed band around the calibrated engine.

A run's rates are set by the C-hat calibration measured; the engine it meets may be a little faster or
slower. The same runs with every engine step 5% faster and 5% slower (the trace unchanged) give a verdict
at each speed (plan/speeds.py). The verdict is robust when it is the same at all three, knife-edge when
another speed flips it (the speeds that do are named), and has no margin when there is no verdict to
hold (not run, or a case the paper leaves uncertain) or a side could not be judged. Pure: verdicts in,
a margin out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from retrybench.plan.speeds import CALIBRATED, SPEEDS, side_speeds
from retrybench.report.verdicts import NOT_REPRODUCED, REPRODUCED

__all__ = ["KNIFE_EDGE", "ROBUST", "Margin", "MarginKind", "margin_of"]

MarginKind = Literal["robust", "knife-edge"]
ROBUST: MarginKind = "robust"
KNIFE_EDGE: MarginKind = "knife-edge"
_JUDGED = (REPRODUCED, NOT_REPRODUCED)


@dataclass(frozen=True)
class Margin:
    """The margin of one verdict: robust, knife-edge (flipped at `flips_at`) or None (nothing to hold)."""

    kind: MarginKind | None
    flips_at: tuple[float, ...] = ()


def margin_of(verdicts: Mapping[float, str], speeds: tuple[float, ...] = SPEEDS) -> Margin:
    """The margin of the verdict at the calibrated speed, given the verdict at each of `speeds` (a speed
    left out counts as not judged). A side that gives the other judgement flips it; a side with no
    judgement (its runs missing) leaves a verdict that no side flipped without a margin."""
    base = verdicts.get(CALIBRATED)
    if base not in _JUDGED:
        return Margin(None)
    sides = side_speeds(speeds)
    flips = tuple(s for s in sides if verdicts.get(s) in _JUDGED and verdicts[s] != base)
    if flips:
        return Margin(KNIFE_EDGE, flips)
    if all(verdicts.get(s) in _JUDGED for s in sides):
        return Margin(ROBUST)
    return Margin(None)
