"""Robustness on unseen seeds: each claim of the paper checked on every model it is made for, on seeds
the finding tests never use (blocks.UNSEEN_SEEDS), with the share of seeds on which it held.

A claim holds on a seed when every check of it on that seed held (all its variants: conditions, pulses,
step sizes, blocks). It is robust when it held on at least 9 of every 10 seeds evaluated; the seeds on
which it failed are listed. The paper's uncertain cases are recorded, never judged, so they are left
out. Pure: results in, rows out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from retrybench.claims import CLAIMS, Claim, MissingFigure
from retrybench.plan.blocks import BLOCKS
from retrybench.records.results import Result
from retrybench.report.runs import MissingRun, RunFailed, RunSet

__all__ = ["ROBUST_SHARE", "Robustness", "robustness"]

ROBUST_SHARE = 0.9  # held on at least 9 of 10 seeds


@dataclass(frozen=True)
class Robustness:
    """One claim on one model across the unseen seeds."""

    claim: Claim
    model: str
    held: tuple[int, ...]  # seeds on which every check of the claim held
    failed: tuple[int, ...]  # seeds on which a check failed
    not_evaluated: tuple[int, ...]  # seeds with a run missing or failed

    @property
    def evaluated(self) -> int:
        return len(self.held) + len(self.failed)

    @property
    def robust(self) -> bool | None:
        """Held on at least ROBUST_SHARE of the seeds evaluated; None when none was."""
        if not self.evaluated:
            return None
        return len(self.held) >= ROBUST_SHARE * self.evaluated


def robustness(results: Iterable[Result], seeds: Sequence[int]) -> list[Robustness]:
    """Every judged claim on every model it is made for, across `seeds`, from these runs."""
    rs = RunSet(results)

    def pairs(block: str, models: tuple[str, ...]) -> list[tuple[str, int]]:
        return [(model, seed) for model in models if model in BLOCKS[block].models for seed in seeds]

    rows = []
    for claim in CLAIMS:
        if claim.recorded_only:
            continue
        outcome: dict[tuple[str, int], set[str]] = defaultdict(set)  # (model, seed) -> {held, failed, missing}
        for subject in claim.subjects(pairs):
            try:
                held = claim.check(subject, rs.run).held
            except (MissingRun, RunFailed, MissingFigure):
                outcome[subject.model, subject.seed].add("missing")
                continue
            outcome[subject.model, subject.seed].add("held" if held else "failed")
        for model in dict.fromkeys(m for m, _ in outcome):  # the claim's models, in order
            marks = {seed: found for (m, seed), found in outcome.items() if m == model}
            rows.append(Robustness(
                claim=claim, model=model,
                held=tuple(s for s in seeds if marks.get(s) == {"held"}),
                failed=tuple(s for s in seeds if "failed" in marks.get(s, set())),
                not_evaluated=tuple(s for s in seeds if "missing" in marks.get(s, set())
                                    and "failed" not in marks.get(s, set()))))
    return rows
