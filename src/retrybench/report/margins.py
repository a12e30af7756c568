"""The report's margins: every claim on every model, and every finding, judged on the same runs at each
engine speed of the band (plan/speeds.py), with the margin of its verdict (margin.py).

The claims look a run up by its spec at the calibrated engine, so the runs at another speed are read as
a run set of their own, each as if it were the calibrated run. Pure: results in, rows out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict, cast

from retrybench.claims import CLAIMS, ROWS
from retrybench.plan.speeds import CALIBRATED, SPEEDS, speed_label
from retrybench.records.results import Result
from retrybench.report.margin import KNIFE_EDGE, ROBUST, margin_of
from retrybench.report.runs import RunSet, spec_of
from retrybench.report.verdicts import NOT_REPRODUCED, REPRODUCED, ClaimCheck, checks_of, verdict

__all__ = ["FindingMargin", "MarginRow", "MarginsSection", "margins_section", "runs_at"]


class MarginRow(TypedDict):
    """One claim on one model: its verdict at each speed and the margin of the calibrated one."""

    claim: str
    finding: str
    wording: str
    model: str
    verdict: str
    verdicts: dict[str, str]  # speed_label(speed) -> verdict
    margin: str | None  # robust, knife-edge, or None: no verdict to hold
    flips_at: list[float]


class FindingMargin(TypedDict):
    """One finding's verdict at each speed and the margin of the calibrated one."""

    verdicts: dict[str, str]
    margin: str | None
    flips_at: list[float]


class MarginsSection(TypedDict):
    """The speeds, the claim-model rows, the findings' margins (by row key) and the tallies of the score
    line: claim-model verdicts judged, reproduced, reproduced and robust, knife-edge."""

    speeds: list[float]
    rows: list[MarginRow]
    findings: dict[str, FindingMargin]
    judged: int
    reproduced: int
    reproduced_robust: int
    knife_edge: int


def runs_at(results: Iterable[Result], speed: float) -> list[Result]:
    """The runs made at engine speed `speed`, each with its speed dropped, as if made at the calibrated
    speed: the run set the claims then read at that speed."""
    out = []
    for result in results:
        if spec_of(result).engine_speed != speed:
            continue
        record: dict[str, Any] = {k: v for k, v in result.items() if k != "engine_speed"}
        if isinstance(record.get("spec"), Mapping):
            record["spec"] = {k: v for k, v in record["spec"].items() if k != "engine_speed"}
        out.append(cast(Result, record))
    return out


def _by_claim_model(checks: Mapping[str, list[ClaimCheck]]) -> dict[tuple[str, str], list[ClaimCheck]]:
    grouped: dict[tuple[str, str], list[ClaimCheck]] = defaultdict(list)
    for row in ROWS:
        for check in checks[row.key]:
            grouped[check.claim.id, check.subject.model].append(check)
    return grouped


def margins_section(results: Iterable[Result], runs: int | None = None,
                    speeds: tuple[float, ...] = SPEEDS) -> MarginsSection:
    """Every claim-model pair and finding of these runs (at any of `speeds`) judged at each speed, with
    its margin; `runs`: the run count per block, as for the report (None: the paper's)."""
    every = list(results)
    checks = {speed: checks_of(RunSet(runs_at(every, speed), runs)) for speed in speeds}
    pairs = {speed: _by_claim_model(c) for speed, c in checks.items()}
    rows: list[MarginRow] = []
    for claim in CLAIMS:
        models = dict.fromkeys(m for (claim_id, m) in pairs[CALIBRATED] if claim_id == claim.id)
        for model in models:
            verdicts = {speed: verdict(claim.row, pairs[speed].get((claim.id, model), [])) for speed in speeds}
            shown = _shown(verdicts, speeds)
            rows.append({"claim": claim.id, "finding": claim.row.title, "wording": claim.wording, "model": model,
                         "verdict": verdicts[CALIBRATED], "verdicts": shown["verdicts"], "margin": shown["margin"],
                         "flips_at": shown["flips_at"]})
    findings = {row.key: _shown({speed: verdict(row, checks[speed][row.key]) for speed in speeds}, speeds)
                for row in ROWS}
    reproduced = [r for r in rows if r["verdict"] == REPRODUCED]
    return {"speeds": list(speeds), "rows": rows, "findings": findings,
            "judged": sum(1 for r in rows if r["verdict"] in (REPRODUCED, NOT_REPRODUCED)),
            "reproduced": len(reproduced), "reproduced_robust": sum(1 for r in reproduced if r["margin"] == ROBUST),
            "knife_edge": sum(1 for r in rows if r["margin"] == KNIFE_EDGE)}


def _shown(verdicts: Mapping[float, str], speeds: tuple[float, ...]) -> FindingMargin:
    """The verdicts by speed label, and their margin."""
    margin = margin_of(verdicts, speeds)
    return {"verdicts": {speed_label(s): v for s, v in verdicts.items()}, "margin": margin.kind,
            "flips_at": list(margin.flips_at)}
