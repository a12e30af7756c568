"""The report's section on the `rejection` block (beyond the paper): which refusal status and headers shed
load without turning it into retries, per client profile, and a circuit breaker counting busy answers as
faults or not. Pure: it reads run results (a RunSet) and returns the section's data, with a paragraph
computed from the runs' numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import mean, median

from retrybench.plan.blocks import BLOCKS, PRIMARY_MODEL
from retrybench.records.results import RunSummary
from retrybench.report import fmt
from retrybench.report.runs import RunSet
from retrybench.report.sections import RejectionBar, RejectionRow, RejectionSection

__all__ = ["ANSWERS", "rejection_section"]

BLOCK = "rejection"
PAPER_CLIENT = "paper"  # a spec's client None: the condition's own, the paper's
BUDGET, CAP, BREAKER = "retry budget", "engine cap", "circuit breaker"
# Each condition of the block: which refusal it configures and how that refusal answers.
ANSWERS: dict[str, tuple[str, str]] = {
    "retry-budget": (BUDGET, "429 + Retry-After (the paper's)"),
    "reject-budget-429-bare": (BUDGET, "429, no Retry-After"),
    "reject-budget-503": (BUDGET, "503, no Retry-After"),
    "reject-budget-529": (BUDGET, "529, no Retry-After"),
    "reject-budget-no-retry": (BUDGET, "429 + Retry-After + x-should-retry: false"),
    "engine-cap-338": (CAP, "503 (vLLM's, relayed)"),
    "reject-cap-429": (CAP, "429 + Retry-After"),
    "reject-cap-529": (CAP, "529"),
    "reject-cap-no-retry": (CAP, "503 + x-should-retry: false"),
    "breaker-busy-faults": (BREAKER, "busy answers count as faults (sglang's)"),
    "breaker-errors-only": (BREAKER, "only timeouts and errors count"),
}
BASELINES = {BUDGET: "retry-budget", CAP: "engine-cap-338"}


@dataclass(frozen=True)
class _Cell:
    condition: str
    client: str
    runs: tuple[RunSummary, ...]

    def per_1000(self, values: Sequence[float]) -> float:
        return mean(1000.0 * v / r["calls"] for v, r in zip(values, self.runs, strict=True) if r["calls"])

    @property
    def retries(self) -> float:
        return self.per_1000([r["retries"] for r in self.runs])

    @property
    def refused(self) -> float:
        return self.per_1000([_refused(r) for r in self.runs])

    @property
    def drain(self) -> list[int | None]:
        return [r.get("drain_to_full_service_s") for r in self.runs]


def _refused(r: RunSummary) -> int:
    """Every attempt refused: by the budget (retries), the deadline check, the engine, the breaker."""
    return (r["retries_refused"] + r["attempts_refused_deadline"] + r["engine_refused"]
            + r.get("attempts_refused_breaker", 0))


def _cells(rs: RunSet) -> list[_Cell]:
    grouped: dict[tuple[str, str], list[RunSummary]] = {}
    for entry in rs.block_entries(BLOCK):
        s = entry.spec
        if entry.summary is not None and s.model == PRIMARY_MODEL:
            grouped.setdefault((s.condition, s.client or PAPER_CLIENT), []).append(entry.summary)
    block = BLOCKS[BLOCK]
    clients = [c or PAPER_CLIENT for c in block.clients]
    return [_Cell(condition, client, tuple(grouped[(condition, client)]))
            for condition in block.conditions for client in clients if (condition, client) in grouped]


def _drain_text(values: Sequence[int | None]) -> str:
    if not values or all(v is None for v in values):
        return fmt.DASH
    return ", ".join(fmt.DASH if v is None else f"{v} s" for v in values)


def _row(cell: _Cell) -> RejectionRow:
    group, answer = ANSWERS.get(cell.condition, ("", cell.condition))
    runs = cell.runs
    failed = [100.0 * r["calls_failed"] / r["calls"] for r in runs if r["calls"]]
    return {"group": group, "condition": cell.condition, "answer": answer, "client": cell.client,
            "runs": len(runs), "refused": f"{cell.refused:.0f}", "retries": f"{cell.retries:.0f}",
            "failed_pct": fmt.span(failed), "timely_pct": fmt.span([r["primary_timely_pct"] for r in runs]),
            "recovered": f"{sum(1 for r in runs if r['recovered'])} of {len(runs)}",
            "drain_to_full_service_s": _drain_text(cell.drain) if group == BREAKER else ""}


def _fewest(cells: Sequence[_Cell], group: str, client: str) -> str | None:
    """Which answer of `group` left `client` sending the fewest retries, against the paper's answer."""
    mine = [c for c in cells if c.client == client and ANSWERS.get(c.condition, ("",))[0] == group]
    base = next((c for c in mine if c.condition == BASELINES[group]), None)
    if len(mine) < 2 or base is None:
        return None
    best = min(mine, key=lambda c: (c.retries, c.condition != BASELINES[group]))
    if best.condition == base.condition or best.retries >= base.retries:
        return (f"{client}: none sent fewer retries than {ANSWERS[base.condition][1]} "
                f"({base.retries:.0f} per 1,000 calls)")
    return (f"{client}: fewest with {ANSWERS[best.condition][1]} ({best.retries:.0f} retries per 1,000 calls, "
            f"against {base.retries:.0f} with {ANSWERS[base.condition][1]})")


def _breaker_sentence(cells: Sequence[_Cell]) -> str | None:
    busy = [v for c in cells if c.condition == "breaker-busy-faults" for v in c.drain]
    errors = [v for c in cells if c.condition == "breaker-errors-only" for v in c.drain]
    if not busy or not errors:
        return None

    def said(values: list[int | None]) -> str:
        known = [v for v in values if v is not None]
        never = len(values) - len(known)
        text = f"median {median(known):.0f} s (max {max(known)} s)" if known else "never measured"
        return text + (f", {never} of {len(values)} runs without one" if never and known else "")

    return ("Time from drain to full service, over every client: with busy answers counted as faults "
            f"{said(busy)}; with only timeouts and errors counted {said(errors)}.")


def _answer(cells: Sequence[_Cell]) -> str:
    """The paragraph that answers the block's question, from the cells' numbers."""
    clients = list(dict.fromkeys(c.client for c in cells))
    parts: list[str] = []
    for group in (BUDGET, CAP):
        said = [s for client in clients if (s := _fewest(cells, group, client)) is not None]
        if said:
            parts.append(f"Under the {group}, per client: " + "; ".join(said) + ".")
    breaker = _breaker_sentence(cells)
    if breaker is not None:
        parts.append(breaker)
    return " ".join(parts)


def rejection_section(rs: RunSet) -> RejectionSection | None:
    """The section's data, or None when the report holds no run of the block."""
    cells = _cells(rs)
    if not any(c.condition not in BASELINES.values() for c in cells):
        return None  # the baselines alone are Table 1's runs, shared: the block itself did not run
    bars: list[RejectionBar] = [{"condition": c.condition, "client": c.client, "retries_per_1000": round(c.retries, 1)}
                                for c in cells]
    return {"rows": [_row(c) for c in cells], "bars": bars, "answer": _answer(cells),
            "runs": sum(len(c.runs) for c in cells)}
