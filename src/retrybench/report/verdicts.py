"""The report's verdicts: every registered claim checked on the runs of a report, and a verdict per row.

The claims and their predicates are the finding tests' own (retrybench.claims), so a verdict here and a
test outcome there agree. Under pytest the report takes the verdict from the tests' outcomes instead;
the checks then only supply the measured figures. Pure: results in, checks out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from retrybench.claims import CLAIMS, ROWS, Claim, MissingFigure, Row, Subject
from retrybench.report.runs import MissingRun, RunFailed, RunSet

__all__ = ["NOT_REPRODUCED", "NOT_RUN", "REPRODUCED", "UNCERTAIN", "ClaimCheck", "checks_of", "verdict"]

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
UNCERTAIN = "uncertain in the paper"
NOT_RUN = "not run"


@dataclass(frozen=True, kw_only=True)
class ClaimCheck:
    """One claim on one subject: passed, failed, or not evaluated (a run missing or failed)."""

    claim: Claim
    subject: Subject
    passed: bool | None
    measured: Mapping[str, Any] = field(default_factory=dict)
    paper: Mapping[str, Any] = field(default_factory=dict)
    failed_parts: tuple[str, ...] = ()
    note: str = ""  # why not evaluated: the failed run's error, or the missing run


def _check(rs: RunSet, claim: Claim, subject: Subject) -> ClaimCheck:
    try:
        outcome = claim.check(subject, rs.run)
    except MissingRun as missing:
        return ClaimCheck(claim=claim, subject=subject, passed=None, note=f"not run: {missing}")
    except RunFailed as failed:
        return ClaimCheck(claim=claim, subject=subject, passed=None, note=f"run failed: {failed}")
    except MissingFigure as missing:
        return ClaimCheck(claim=claim, subject=subject, passed=None, note=f"not evaluated: {missing}")
    return ClaimCheck(claim=claim, subject=subject, passed=outcome.held, measured=outcome.measured,
                      paper=outcome.paper, failed_parts=tuple(p.text for p in outcome.parts if not p.held))


def checks_of(rs: RunSet) -> dict[str, list[ClaimCheck]]:
    """Every row's checks on this run set: each claim on each of its subjects present here."""
    out: dict[str, list[ClaimCheck]] = {row.key: [] for row in ROWS}
    for claim in CLAIMS:
        out[claim.row.key] += [_check(rs, claim, subject) for subject in claim.subjects(rs.pairs)]
    return out


def verdict(row: Row, checks: Sequence[ClaimCheck]) -> str:
    """reproduced if every evaluated check passed; not reproduced if any failed or its run failed;
    not run if no check could be evaluated; the paper's uncertain cases are never judged."""
    if row.uncertain:
        return UNCERTAIN if any(c.passed is not None for c in checks) else NOT_RUN
    if any(c.passed is False or c.note.startswith("run failed") for c in checks):
        return NOT_REPRODUCED
    if not any(c.passed for c in checks):
        return NOT_RUN
    return REPRODUCED
