"""The paper's claims, defined once: the finding tests assert them and the report's verdicts and
headlines read them, by id.

Each claim names its finding (a report row), section, wording, the block whose runs it reads, the models
it is made for, its named thresholds, and one predicate (model.py). The claims themselves live by
section: section4.py (Finding 1), section5.py (Findings 2-4), section6.py (Findings 5-7, 6.4, 6.5).
"""

from __future__ import annotations

from retrybench.claims import section4, section5, section6
from retrybench.claims.model import (
    Case,
    Check,
    Claim,
    Fetch,
    MissingFigure,
    Outcome,
    Pairs,
    Part,
    Row,
    Subject,
    Variant,
    all_subjects,
)
from retrybench.claims.rows import ROWS

__all__ = ["CLAIMS", "ROWS", "Case", "Check", "Claim", "Fetch", "MissingFigure", "Outcome", "Pairs", "Part", "Row",
           "Subject", "Variant", "all_subjects", "claim", "claims_of"]

CLAIMS: tuple[Claim, ...] = section4.CLAIMS + section5.CLAIMS + section6.CLAIMS
_BY_ID = {c.id: c for c in CLAIMS}
if len(_BY_ID) != len(CLAIMS):
    raise RuntimeError("two claims share an id")


def claim(claim_id: str) -> Claim:
    """The claim with this id; KeyError names the known ids."""
    try:
        return _BY_ID[claim_id]
    except KeyError:
        raise KeyError(f"no claim {claim_id!r}; known: {', '.join(sorted(_BY_ID))}") from None


def claims_of(row: Row) -> list[Claim]:
    """The claims a report row is made of, in registry order."""
    return [c for c in CLAIMS if c.row.key == row.key]
