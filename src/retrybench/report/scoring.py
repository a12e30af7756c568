"""Every numeric paper figure a claim check records, scored against the paper's band: within it, near
it, or off. A verdict says whether a claim held; the score says how close the numbers came, so that a
finding "reproduced" on numbers far from the paper's is visible as such. Pure: checks in, marks out.

A figure is scored when both the measured value and the paper's are numbers, the paper's a single
value or a [low, high] range. Near means within 3 points of the band for a percentage (a figure whose
name ends in `_pct`) and within 10% of the band's scale (its larger end in magnitude) otherwise.
Outcomes (recovered or not), counts of things the paper words ("more than half") and per-rule tables
are not figures: the verdicts cover them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from retrybench.report.verdicts import ClaimCheck

__all__ = ["MARKS", "NEAR_FRACTION", "NEAR_POINTS", "SYMBOLS", "Mark", "ScoredFigure", "band", "mark", "score", "tally"]

Mark = Literal["within", "near", "off"]
MARKS: tuple[Mark, ...] = ("within", "near", "off")
SYMBOLS: dict[Mark, str] = {"within": "✓", "near": "≈", "off": "✗"}
NEAR_POINTS = 3.0  # percentage points, for figures in percent
NEAR_FRACTION = 0.10  # of the band's scale, for every other figure


@dataclass(frozen=True)
class ScoredFigure:
    """One measured figure of one check, beside the paper's band, with its mark."""

    row: str
    claim_id: str
    subject: str
    name: str
    measured: float
    low: float
    high: float
    mark: Mark


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def band(paper: Any) -> tuple[float, float] | None:
    """The paper's figure as a (low, high) band, or None when it is not a number or a numeric range."""
    single = _number(paper)
    if single is not None:
        return single, single
    if isinstance(paper, list | tuple) and len(paper) == 2:
        low, high = _number(paper[0]), _number(paper[1])
        if low is not None and high is not None and low <= high:
            return low, high
    return None


def mark(name: str, measured: float, low: float, high: float) -> Mark:
    """Within the band, near it, or off it (see the module's docstring for near)."""
    if low <= measured <= high:
        return "within"
    tolerance = NEAR_POINTS if name.endswith(("_pct", "_points")) else NEAR_FRACTION * max(abs(low), abs(high))
    distance = low - measured if measured < low else measured - high
    return "near" if distance <= tolerance else "off"


def score(checks: Iterable[ClaimCheck]) -> list[ScoredFigure]:
    """Every scorable figure of every evaluated check, in the checks' order."""
    out = []
    for check in checks:
        if check.passed is None:
            continue
        for name, paper in check.paper.items():
            measured, limits = _number(check.measured.get(name)), band(paper)
            if measured is None or limits is None:
                continue
            out.append(ScoredFigure(row=check.claim.row.key, claim_id=check.claim.id, subject=check.subject.label(),
                                    name=name, measured=measured, low=limits[0], high=limits[1],
                                    mark=mark(name, measured, *limits)))
    return out


def tally(figures: Sequence[ScoredFigure]) -> dict[str, int]:
    """How many figures got each mark, and how many were scored."""
    counts = Counter(f.mark for f in figures)
    return {**{m: counts[m] for m in MARKS}, "scored": len(figures)}
