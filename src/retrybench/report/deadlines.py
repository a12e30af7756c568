"""The report's section on the `deadlines` block: the proxy acting on the deadline each client sends,
beside no control, abort-on-disconnect and deferred cancellation, at the paper's pulse. Pure: it reads
run results (a RunSet) and returns the section's data, with the answer to "does a deadline the server
hears do better than abort-on-disconnect?" written from the runs' numbers."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median
from typing import TypedDict

from retrybench.plan.blocks import BLOCKS, PRIMARY_MODEL
from retrybench.records.results import RunSummary
from retrybench.report import fmt
from retrybench.report.runs import RunSet

__all__ = ["DeadlinePoint", "DeadlineRow", "DeadlinesSection", "deadlines_section"]

BLOCK = "deadlines"
DISCONNECT = "retries-on-cancel-on"  # abort-on-disconnect: the paper's cancellation
HEARD = ("deadline-propagation", "deadline-admission", "deadline-deferred")
CONTROLS = {"no-control": "no control (cancellation off)", DISCONNECT: "abort on disconnect",
            "deferred-cancellation": "deferred cancellation (10 s)", "deadline-propagation": "deadline propagation",
            "deadline-admission": "deadline propagation + admission",
            "deadline-deferred": "deadline propagation + deferral (10 s)"}


class DeadlineRow(TypedDict):
    condition: str
    control: str
    runs: int
    recovered: str  # "k of n"
    hold_delivered_pct: str  # range over runs
    executions_per_delivered: str
    prompt_aborted_pct: str  # share of computed prompt tokens spent on executions later aborted
    refused_503: int  # attempts refused at once (admission), summed over runs


class DeadlinePoint(TypedDict):
    condition: str
    seed: int
    hold_pct: float
    recovered: bool


class DeadlinesSection(TypedDict):
    model: str
    rows: list[DeadlineRow]
    points: list[DeadlinePoint]
    answer: str


def _runs(rs: RunSet) -> dict[str, list[tuple[int, RunSummary]]]:
    """(seed, summary) per condition of the block on the primary model, in the block's order."""
    grouped: dict[str, list[tuple[int, RunSummary]]] = {c: [] for c in BLOCKS[BLOCK].conditions}
    for entry in rs.block_entries(BLOCK):
        if entry.summary is not None and entry.spec.model == PRIMARY_MODEL and entry.spec.condition in grouped:
            grouped[entry.spec.condition].append((entry.spec.seed, entry.summary))
    return {c: sorted(runs, key=lambda r: r[0]) for c, runs in grouped.items() if runs}


def _per_delivered(runs: Sequence[RunSummary]) -> float | None:
    delivered = sum(r["calls_delivered"] for r in runs)
    return sum(r["executions_created"] for r in runs) / delivered if delivered else None


def _row(condition: str, runs: Sequence[RunSummary]) -> DeadlineRow:
    per = _per_delivered(runs)
    return {"condition": condition, "control": CONTROLS.get(condition, condition), "runs": len(runs),
            "recovered": f"{sum(1 for r in runs if r['recovered'])} of {len(runs)}",
            "hold_delivered_pct": fmt.span([r["hold_delivered_pct"] for r in runs]),
            "executions_per_delivered": fmt.DASH if per is None else f"{per:.2f}",
            "prompt_aborted_pct": fmt.span([r.get("aborted_prompt_share_pct") for r in runs]),
            "refused_503": sum(r["attempts_refused_deadline"] for r in runs)}


def _figures(runs: Sequence[RunSummary]) -> tuple[int, float, float | None]:
    """Runs recovered, the median hold delivered % (0 where a run has no hold figure), executions per
    delivered call."""
    return (sum(1 for r in runs if r["recovered"]), median(r["hold_delivered_pct"] or 0.0 for r in runs),
            _per_delivered(runs))


def _said(condition: str, runs: Sequence[RunSummary]) -> str:
    ok, hold, per = _figures(runs)
    cost = "" if per is None else f", {per:.2f} executions per delivered call"
    return f"{ok} of {len(runs)} runs recovered (median {hold:.1f}% of the hold cohort delivered{cost})"


def _verdict(runs: Sequence[RunSummary], base: Sequence[RunSummary], name: str) -> str:
    """How `runs` compare with `base` on recovery, then the median hold delivered."""
    ok, hold, per = _figures(runs)
    base_ok, base_hold, base_per = _figures(base)
    if (ok, hold, per) == (base_ok, base_hold, base_per):
        return f"the same as {name}"
    if (ok, hold) > (base_ok, base_hold):
        return f"better than {name}"
    if (ok, hold) < (base_ok, base_hold):
        return f"worse than {name}"
    return f"as good as {name} on delivery"


def _compare(condition: str, runs: dict[str, list[tuple[int, RunSummary]]]) -> str:
    mine = [s for _, s in runs[condition]]
    refused = sum(r["attempts_refused_deadline"] for r in mine)
    extra = f", {refused} attempts refused at admission" if refused else ""
    verdicts = [_verdict(mine, [s for _, s in runs[DISCONNECT]], "abort-on-disconnect")]
    if condition == "deadline-deferred" and "deferred-cancellation" in runs:  # its own control without deadlines
        verdicts.append(_verdict(mine, [s for _, s in runs["deferred-cancellation"]],
                                 "deferred cancellation without deadlines"))
    text = f"{CONTROLS[condition]} ({condition}): {_said(condition, mine)}{extra}: {' and '.join(verdicts)}"
    return text[0].upper() + text[1:]


def _answer(model: str, runs: dict[str, list[tuple[int, RunSummary]]]) -> str:
    """The paragraph answering the section's question, every number from the runs."""
    heard = [c for c in HEARD if c in runs]
    if DISCONNECT not in runs or not heard:
        return "The block's runs of abort-on-disconnect and of a deadline control are not all here: no answer."
    base = [s for _, s in runs[DISCONNECT]]
    parts = [_compare(c, runs) for c in heard]
    same = [c for c in heard if _figures([s for _, s in runs[c]]) == _figures(base)]
    why = (" Where the numbers are the same, the client hangs up exactly at the deadline it sent, so the proxy "
           "hears the deadline and the disconnect at the same moment and cancels the same executions."
           if same else "")
    return (f"Does a deadline the server hears do better than abort-on-disconnect at the paper's pulse? On {model}, "
            f"abort-on-disconnect ({DISCONNECT}): {_said(DISCONNECT, base)}. " + ". ".join(parts) + "." + why)


def deadlines_section(rs: RunSet) -> DeadlinesSection | None:
    """The section's data, or None when the report holds no run of the block's deadline controls (its
    abort-on-disconnect run is also the tracing block's: that alone makes no section)."""
    runs = _runs(rs)
    if not any(c in runs for c in HEARD):
        return None
    rows = [_row(c, [s for _, s in rr]) for c, rr in runs.items()]
    points: list[DeadlinePoint] = [{"condition": c, "seed": seed, "hold_pct": hold, "recovered": bool(s["recovered"])}
                                   for c, rr in runs.items() for seed, s in rr
                                   if (hold := s["hold_delivered_pct"]) is not None]
    return {"model": PRIMARY_MODEL, "rows": rows, "points": points, "answer": _answer(PRIMARY_MODEL, runs)}
