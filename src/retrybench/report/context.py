"""The report's data (sections.py's ReportContext) built from run results (and, under pytest, the finding tests'
outcomes). Pure: no files, no clock, no matplotlib; render.py turns it into HTML.

Verdicts come from measured numbers: from the registered claims checked on the runs (verdicts.py)
for `retrybench reproduce`, or from the outcomes of the finding tests asserting those same claims when
pytest built the report (a strict xfail is "not reproduced", with its reason, which carries the
measured numbers).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from statistics import fmean
from typing import Any

from retrybench.claims import ROWS, Row, claim
from retrybench.claims.paper import paper_values
from retrybench.plan.blocks import BLOCKS, DIAGNOSTIC, PRIMARY_MODEL, UNSEEN_SEEDS, paper_runs
from retrybench.records.results import Result, RunSummary, is_failed
from retrybench.report import fmt
from retrybench.report.deadlines import deadlines_section
from retrybench.report.headlines import HEADLINES
from retrybench.report.margins import MarginsSection, margins_section
from retrybench.report.rejection import rejection_section
from retrybench.report.replicas import deployment_suffix, replicas_section
from retrybench.report.robustness import robustness
from retrybench.report.runs import Entry, RunSet, spec_of
from retrybench.report.scoring import SYMBOLS, ScoredFigure, score, tally
from retrybench.report.sections import (
    BlockRow,
    BlockSection,
    Counts,
    Fig1,
    Fig1Line,
    Fig3,
    Fig3Bar,
    Fig4,
    Fig4Bar,
    Fig5,
    Fig5Bar,
    Fig5Group,
    Fig6,
    Fig6Point,
    FigSdk,
    HeadlineFigure,
    ReportContext,
    RetentionRow,
    RobustnessSection,
    ScoredRow,
    SdkClientRow,
    SdkPoint,
    SdkSeries,
    Setup,
    SummaryRow,
    Table2Cell,
    Table2Row,
    Table3Cell,
    Table3Row,
    TestVerdict,
)
from retrybench.report.stacks import stacks_section
from retrybench.report.verdicts import NOT_REPRODUCED, NOT_RUN, REPRODUCED, UNCERTAIN, ClaimCheck, checks_of, verdict

__all__ = ["build_context", "run_file_name"]

PAPER = paper_values()
SECTION6_BLOCKS = ("composition", "budget-with-cancellation", "queue-policy", "engine-cap", "deferral")
RUN_COLUMNS = (("recovered", "recovered"), ("recovery_s", "recovery s"), ("hold_delivered_pct", "hold %"),
               ("pulse_delivered_pct", "pulse %"), ("primary_timely_pct", "primary ≤120 s %"),
               ("created_x", "created ×C"), ("accepted_x", "accepted ×C"), ("completed_x", "completed ×C"),
               ("retries", "retries"), ("wall_s", "wall s"))


def run_file_name(result: Result) -> str:
    """The file name of a run's summary JSON beside the report: readable and unique per spec."""
    s = spec_of(result)
    extra = "".join(("-mixed" if s.mixed_prompts else "", "-traced" if s.trace else "",
                     f"-cap{s.engine_cap}" if s.engine_cap is not None else "",
                     f"-client-{s.client}" if s.client is not None else "", deployment_suffix(s),
                     "".join(f"-{k}-{v}" for k, v in s.overrides)))
    return f"{s.model}-{s.gpu}-{s.condition}-seed{s.seed}-pulse{s.pulse_x}-{s.max_batched_tokens}{extra}.json"


def build_context(results: Iterable[Result], meta: Mapping[str, object], runs: int | None = None,
                  tests: Sequence[Mapping[str, Any]] | None = None,
                  unseen: Iterable[Result] | None = None, at_speeds: Iterable[Result] | None = None
                  ) -> ReportContext:
    """Everything the report shows. `meta`: engine, wall time, versions, commit (meta.py gathers them);
    `runs`: the run count per block (None: the paper's); `tests`: finding-test outcomes under pytest, each
    {nodeid, name (test function), markers, outcome (passed | failed | xfailed | skipped), reason,
    properties [[name, value]], claims [claim ids]}; `unseen`: the runs on the unseen seeds, for the
    robustness section (None: no such section); `at_speeds`: the same runs with the engine faster and
    slower, for each verdict's margin (None: no margins)."""
    rs = RunSet(results, runs)
    checks = checks_of(rs)
    outcomes = _group_tests(tests) if tests is not None else None
    scored = score(c for row in ROWS for c in checks[row.key])
    margins = margins_section([*rs.results, *at_speeds], runs) if at_speeds is not None else None
    summary = [_summary_row(row, checks[row.key], rs, outcomes, [f for f in scored if f.row == row.key])
               for row in ROWS]
    if margins is not None and outcomes is None:
        _add_margins(summary, margins)
    return {
        "meta": dict(meta),
        "source": "pytest" if tests is not None else "reproduce",
        "counts": _counts(rs),
        "summary": summary,
        "scores": {"tally": tally(scored), "figures": [_scored(f) for f in scored]},
        "robustness": _robustness(unseen) if unseen is not None else None,
        "margins": margins,
        "checks": [{"finding": row.title, "claim": c.claim.wording, "id": c.claim.id, "subject": c.subject.label(),
                    "thresholds": fmt.value(dict(c.claim.thresholds)) if c.claim.thresholds else "",
                    "held": {True: "yes", False: "no", None: "not evaluated"}[c.passed],
                    "measured": fmt.value(c.measured) if c.measured else c.note, "paper": fmt.value(c.paper)}
                   for row in ROWS for c in checks[row.key]],
        "table2": _table2(rs),
        "table3": _table3(rs),
        "figures": {"fig1": _fig1(rs), "fig3": _fig3(rs), "fig4": _fig4(rs), "fig5": _fig5(rs),
                    "fig6": _fig6(rs), "sdk": _fig_sdk(rs)},
        "blocks": [_block(name, rs) for name in BLOCKS if rs.block_entries(name)],
        "retention": _retention(rs),
        "sdk_clients": _sdk_clients(rs),
        "sdk_verdicts": _sdk_verdicts(rs),
        "replicas": replicas_section(rs),
        "stacks": stacks_section(rs),
        "deadlines": deadlines_section(rs),
        "rejection": rejection_section(rs),
        "setup": _setup(rs),
        "failed": [{"spec": _describe(e), "block": e.block, "error": e.result["error"]}
                   for e in [*rs.entries, *rs.beyond] if is_failed(e.result)],
        "tests": list(tests) if tests is not None else None,
        "files": sorted({run_file_name(r) for r in rs.results}),
    }


# -- summary ----------------------------------------------------------------------------------------------

def _counts(rs: RunSet) -> Counts:
    ok = rs.summaries()
    return {"runs": len(rs.entries), "unique": len(rs), "failed": len(rs.entries) - len(ok),
            "recovered": sum(1 for r in ok if r["recovered"]),
            "paper_runs": PAPER["recovered_runs"]["runs"], "paper_recovered": PAPER["recovered_runs"]["recovered"]}


def _figures(row: Row, checks: Sequence[ClaimCheck]) -> list[HeadlineFigure]:
    """The row's headline figures: the paper's, and the measured ones over every evaluated check."""
    rows: list[HeadlineFigure] = []
    for head in HEADLINES.get(row.key, ()):
        chosen = [c for c in checks if head.matches(c.claim.id, c.subject) and head.metric in c.measured]
        if not chosen:
            continue
        paper = next((c.paper[head.metric] for c in chosen if head.metric in c.paper), None)
        rows.append({"name": head.label, "paper": fmt.DASH if paper is None else fmt.value(paper),
                     "measured": _over_runs([c.measured[head.metric] for c in chosen])})
    return rows


def _over_runs(values: Sequence[Any]) -> str:
    if all(isinstance(v, bool) for v in values):
        held = sum(values)
        if held in (0, len(values)):
            return f"{'yes' if held else 'no'} in all {len(values)} runs" if len(values) > 1 else fmt.value(values[0])
        return f"yes in {held} of {len(values)} runs"
    if all(isinstance(v, int | float) or v is None for v in values):
        return fmt.span(values)
    if all(isinstance(v, list | tuple) for v in values):
        flat = [x for v in values for x in v if isinstance(x, int | float)]
        return fmt.span(flat)
    if all(isinstance(v, dict) for v in values):
        return f"{sum(1 for v in values if v)} of {len(values)} non-empty"
    return "; ".join(fmt.value(v) for v in values)


def _summary_row(row: Row, checks: list[ClaimCheck], rs: RunSet,
                 outcomes: Mapping[str, list[Mapping[str, Any]]] | None,
                 scored: Sequence[ScoredFigure]) -> SummaryRow:
    figures = _section65_figures(rs) if row.key == "section65" else _figures(row, checks)
    failing = [f"{c.claim.wording} — {c.subject.label()}: failed {'; '.join(c.failed_parts)}; "
               f"{fmt.value(c.measured)}" for c in checks if c.passed is False]
    failing += [f"{c.claim.wording} — {c.subject.label()}: {c.note}" for c in checks
                if c.note.startswith("run failed")]
    out: SummaryRow = {"key": row.key, "title": row.title, "claim": row.claim,
                       "figures": figures, "checks": len([c for c in checks if c.passed is not None]),
                       "passed": sum(1 for c in checks if c.passed), "verdict": verdict(row, checks),
                       "reasons": failing, "basis": "claim checks on the runs", "tally": None}
    if outcomes is not None:
        tested = _verdict_from_tests(row, outcomes.get(row.key, []))
        out["verdict"], out["reasons"], out["tally"], out["basis"] = (tested["verdict"], tested["reasons"],
                                                                      tested["tally"], tested["basis"])
    out["scores"] = scores = tally(scored)
    off = scores["off"]
    out["figures_note"] = (f"reproduced, yet {off} of {len(scored)} paper figures are off the paper's band"
                           if out["verdict"] == REPRODUCED and off else "")
    return out


def _add_margins(summary: list[SummaryRow], margins: MarginsSection) -> None:
    """Each finding's margin beside its verdict (the verdict from claim checks, as the margins' are)."""
    for row in summary:
        found = margins["findings"][row["key"]]
        row["margin"], row["flips_at"] = found["margin"], found["flips_at"]


def _robustness(unseen: Iterable[Result]) -> RobustnessSection:
    """Per claim and model: on how many of the unseen seeds it held, and the seeds it failed on; and
    the paper figures those runs measured, scored."""
    runs = list(unseen)
    rows = robustness(runs, UNSEEN_SEEDS)
    checks = checks_of(RunSet(runs, runs=len(UNSEEN_SEEDS), first_seed=UNSEEN_SEEDS[0]))
    scored = score(c for row in ROWS for c in checks[row.key])
    by_row = {row.title: tally([f for f in scored if f.row == row.key]) for row in ROWS}
    return {"seeds": list(UNSEEN_SEEDS), "not_robust": sum(1 for r in rows if r.robust is False),
            "scores": tally(scored), "scores_by_finding": {k: v for k, v in by_row.items() if v["scored"]},
            "rows": [{"claim": r.claim.id, "finding": r.claim.row.title, "wording": r.claim.wording,
                      "model": r.model, "held": len(r.held), "evaluated": r.evaluated,
                      "failed_seeds": list(r.failed), "not_evaluated_seeds": list(r.not_evaluated),
                      "robust": {True: "robust", False: "not robust", None: "not evaluated"}[r.robust]}
                     for r in rows]}


def _plain(x: float) -> str:
    """A scored figure as printed: whole numbers without decimals."""
    return fmt.number(int(x) if x.is_integer() else x)


def _scored(figure: ScoredFigure) -> ScoredRow:
    low, high = _plain(figure.low), _plain(figure.high)
    paper = low if figure.low == figure.high else f"{low}–{high}"
    return {"row": figure.row, "claim": figure.claim_id, "subject": figure.subject, "name": figure.name,
            "measured": _plain(figure.measured), "paper": paper, "mark": figure.mark,
            "symbol": SYMBOLS[figure.mark]}


def _verdict_from_tests(row: Row, tests: Sequence[Mapping[str, Any]]) -> TestVerdict:
    tally = {k: sum(1 for t in tests if t["outcome"] == k) for k in ("passed", "failed", "xfailed", "skipped")}
    if row.uncertain:
        result = UNCERTAIN if tests else NOT_RUN
    elif tally["failed"] or tally["xfailed"]:
        result = NOT_REPRODUCED
    elif tally["passed"]:
        result = REPRODUCED
    else:
        result = NOT_RUN
    reasons = [f"{t['outcome']}: {t['nodeid']}: {t['reason']}" for t in tests if t["outcome"] in ("failed", "xfailed")]
    return {"verdict": result, "reasons": reasons, "tally": tally, "basis": "outcomes of the finding tests"}


def _group_tests(tests: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Tests by summary row: the row of the claim each test asserts."""
    grouped: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for test in tests:
        for row in sorted({claim(claim_id).row.key for claim_id in test.get("claims", ())}):
            grouped[row].append(test)
    return grouped


def _section65_figures(rs: RunSet) -> list[HeadlineFigure]:
    ok = [r for r in rs.summaries() if r["created_x"] is not None]
    above = sum(1 for r in ok if r["recovered"] and (r["created_x"] or 0.0) >= 1.0)
    below = sum(1 for r in ok if not r["recovered"] and (r["created_x"] or 0.0) < 1.0)
    paper = PAPER["recovered_runs"]
    return [
        {"name": "recovered runs", "paper": f"{paper['recovered']} of {paper['runs']}",
         "measured": f"{sum(1 for r in ok if r['recovered'])} of {len(ok)}"},
        {"name": "recovered runs creating at or above C-hat", "paper": "0", "measured": str(above)},
        {"name": "runs below C-hat that did not recover", "paper": "1 (Q = 338, cancellation on, 0.98 ×C)",
         "measured": str(below)},
    ]


# -- tables 2 and 3 --------------------------------------------------------------------------------------

TABLE2_CONDITIONS = (("retries-on-cancel-on", "on", "on"), ("retries-off-cancel-on", "off", "on"),
                     ("retries-off-cancel-off", "off", "off"), ("retries-on-cancel-off", "on", "off"))


def _runs_of(rs: RunSet, block: str, model: str, condition: str, **where: Any) -> list[RunSummary]:
    out = []
    for e in rs.block_entries(block):
        s, summary = e.spec, e.summary
        if summary is None or s.model != model or s.condition != condition:
            continue
        if all(getattr(s, k) == v for k, v in where.items()):
            out.append(summary)
    return out


def _table2(rs: RunSet) -> list[Table2Row]:
    rows: list[Table2Row] = []
    for model in BLOCKS["diagnostic"].models:
        if not rs.pairs("diagnostic", (model,)):
            continue
        cells: list[Table2Cell] = []
        chats = []
        for condition, retries, cancellation in TABLE2_CONDITIONS:
            runs = _runs_of(rs, "diagnostic", model, condition)
            chats += [r["chat"] for r in runs]
            paper = PAPER["diagnostic"]["hold_delivered_pct"][model][condition.replace("-", "_")]
            cells.append({"retries": retries, "cancellation": cancellation, "paper": fmt.value(paper),
                          "measured": fmt.span([r["hold_delivered_pct"] for r in runs]), "runs": len(runs)})
        rows.append({"model": model, "chat_paper": fmt.number(PAPER["capacity"][model]),
                     "chat_measured": fmt.span(chats), "cells": cells})
    return rows


def _table3(rs: RunSet) -> list[Table3Row]:
    rows: list[Table3Row] = []
    pulses = PAPER["trigger_sweep"]["pulses_x"]
    for model in BLOCKS["trigger-sweep"].models:
        if not rs.pairs("trigger-sweep", (model,)):
            continue
        for retries in ("on", "off"):
            cells: list[Table3Cell] = []
            for i, pulse in enumerate(pulses):
                delivered, recovery = PAPER["trigger_sweep"][model][f"retries_{retries}"][i]
                runs = _runs_of(rs, "trigger-sweep", model, f"retries-{retries}-cancel-off", pulse_x=pulse)
                measured = "; ".join(f"{fmt.number(r['hold_delivered_pct'])} ({fmt.number(r['recovery_s'], 0)})"
                                     for r in runs) or fmt.DASH
                cells.append({"pulse_x": pulse, "measured": measured,
                              "paper": f"{fmt.number(delivered)} ({fmt.DASH if recovery < 0 else recovery})"})
            rows.append({"model": model, "retries": retries, "cells": cells})
    return rows


# -- figures (data only) -----------------------------------------------------------------------------------

def _first_seed(rs: RunSet, block: str, model: str) -> int | None:
    seeds = [seed for m, seed in rs.pairs(block, (model,))]
    return min(seeds) if seeds else None


def _fig1(rs: RunSet) -> Fig1:
    """Calls delivered per 60 s and the waiting queue over time, one diagnostic run per condition."""
    seed = _first_seed(rs, "diagnostic", PRIMARY_MODEL)
    lines: list[Fig1Line] = []
    for condition in DIAGNOSTIC:
        run = rs.find(PRIMARY_MODEL, condition, seed) if seed is not None else None
        if run is None or is_failed(run) or "series" not in run:
            continue
        lines.append({"condition": condition, "delivered_per_60s": run["series"]["delivered_per_60s"],
                      "waiting": run["series"]["waiting"], "waiting_step_s": run["series"]["waiting_step_s"]})
    return {"model": PRIMARY_MODEL, "seed": seed, "lines": lines}


def _fig3(rs: RunSet) -> Fig3:
    """Execution rates over 347-947 s, means over the diagnostic block's runs."""
    bars: list[Fig3Bar] = []
    for condition in DIAGNOSTIC:
        runs = _runs_of(rs, "diagnostic", PRIMARY_MODEL, condition)
        if runs:
            bars.append({"condition": condition, "runs": len(runs),
                         "created_x": fmean(r["created_x"] or 0.0 for r in runs),
                         "accepted_x": fmean(r["accepted_x"] or 0.0 for r in runs),
                         "completed_x": fmean(r["completed_x"] or 0.0 for r in runs)})
    return {"model": PRIMARY_MODEL, "bars": bars}


def _fig4(rs: RunSet) -> Fig4:
    """Computed prompt tokens of each tracing run: aborted (body, in flight), not aborted, missed."""
    bars: list[Fig4Bar] = []
    block = BLOCKS["tracing"]
    for entry in rs.block_entries("tracing"):
        r, s = entry.summary, entry.spec
        aborted = r.get("aborted_prompt_share_pct") if r is not None else None
        if r is None or aborted is None:
            continue
        in_flight = aborted * (r.get("in_flight_share_pct") or 0.0) / 100
        steps = "2K" if s.max_batched_tokens == 2048 else "8K"
        cancel = "on" if "cancel-on" in s.condition else "off"
        bars.append({"label": f"{steps}, cancel {cancel}, run {s.seed}", "body": aborted - in_flight,
                     "in_flight": in_flight, "not_aborted": 100 - aborted, "missed": r.get("missed_share_pct") or 0.0})
    return {"model": PRIMARY_MODEL, "bars": bars, "conditions": len(block.conditions)}


def _fig5(rs: RunSet) -> Fig5:
    """Delivery shares of the primary and pulse cohorts per condition of Section 6's blocks: means over
    runs, one bar per run where the runs differed in recovery."""
    groups: list[Fig5Group] = []
    for block in SECTION6_BLOCKS:
        bars: list[Fig5Bar] = []
        for condition in BLOCKS[block].conditions:
            runs = _runs_of(rs, block, PRIMARY_MODEL, condition)
            if not runs:
                continue
            split = len({r["recovered"] for r in runs}) > 1
            for part in ([[r] for r in runs] if split else [runs]):
                name = condition + (f" (run {part[0]['seed']})" if split else "")
                shares = {(cohort, kind): fmean(_share(r, cohort, kind) for r in part)
                          for cohort in ("primary", "pulse") for kind in ("timely", "late", "undelivered")}
                bars.append({"condition": name, "recovered": all(r["recovered"] for r in part), "runs": len(part),
                             "primary_timely": shares["primary", "timely"], "primary_late": shares["primary", "late"],
                             "primary_undelivered": shares["primary", "undelivered"],
                             "pulse_timely": shares["pulse", "timely"], "pulse_late": shares["pulse", "late"],
                             "pulse_undelivered": shares["pulse", "undelivered"]})
        if bars:
            groups.append({"block": block, "bars": bars})
    return {"model": PRIMARY_MODEL, "groups": groups}


def _share(run: RunSummary, cohort: str, kind: str) -> float:
    delivered, timely = {"primary": (run["primary_delivered_pct"], run["primary_timely_pct"]),
                         "pulse": (run["pulse_delivered_pct"], run["pulse_timely_pct"])}[cohort]
    delivered, timely = delivered or 0.0, timely or 0.0
    return float({"timely": timely, "late": delivered - timely, "undelivered": 100.0 - delivered}[kind])


def _fig6(rs: RunSet) -> Fig6:
    """Every run: primary-cohort delivery within 120 s against the creation rate at the proxy."""
    points: list[Fig6Point] = [
        {"block": e.block, "condition": e.spec.condition, "model": e.spec.model, "seed": e.spec.seed,
         "created_x": r["created_x"], "primary_timely_pct": r["primary_timely_pct"] or 0.0,
         "recovered": bool(r["recovered"])}
        for e in rs.entries if (r := e.summary) is not None and r["created_x"] is not None]
    return {"points": points}


# -- blocks and setup -----------------------------------------------------------------------------------------

# -- beyond the paper: result retention -------------------------------------------------------------------

RETENTION_PAIRS = (("coalescing", "coalescing-retain"), ("lookup-first", "lookup-first-retain"))


def _retention(rs: RunSet) -> list[RetentionRow]:
    """Per model, each composition condition beside the same condition with retention: what the
    retries that came after their execution completed cost, over the block's runs."""
    rows: list[RetentionRow] = []
    for model in BLOCKS["retention"].models:
        for paper, kept in RETENTION_PAIRS:
            for condition in (paper, kept):
                runs = _runs_of(rs, "retention", model, condition)
                if not runs:
                    continue
                rows.append({
                    "model": model, "condition": condition, "retained": condition == kept, "runs": len(runs),
                    "recovered": _over_runs([r["recovered"] for r in runs]),
                    "pulse_delivered_pct": fmt.span([r["pulse_delivered_pct"] for r in runs]),
                    "retries_refused": sum(r["retries_refused"] for r in runs),
                    "gave_up": sum(r["gave_up_retry_after"] for r in runs),
                    "served_retained": sum(r.get("attempts_served_retained", 0) for r in runs),
                    "executions_created": sum(r["executions_created"] for r in runs),
                    "calls_delivered": sum(r["calls_delivered"] for r in runs),
                })
    return rows


def _sdk_clients(rs: RunSet) -> list[SdkClientRow]:
    """Per model, pulse, client profile and condition, over the block's runs: whether the engine
    recovered, what was delivered, and how many executions each delivered call cost."""
    block = BLOCKS["sdk-clients"]
    rows: list[SdkClientRow] = []
    for model, pulse_x, client, condition in itertools.product(block.models, block.pulses_x, block.clients,
                                                               block.conditions):
        runs = _runs_of(rs, "sdk-clients", model, condition, pulse_x=pulse_x, client=client)
        if not runs:
            continue
        delivered = sum(r["calls_delivered"] for r in runs)
        per_call = sum(r["executions_created"] for r in runs) / delivered if delivered else None
        rows.append({
            "model": model, "pulse_x": pulse_x, "client": client or "paper", "condition": condition,
            "runs": len(runs), "recovered": _over_runs([r["recovered"] for r in runs]),
            "hold_delivered_pct": fmt.span([r["hold_delivered_pct"] for r in runs]),
            "pulse_delivered_pct": fmt.span([r["pulse_delivered_pct"] for r in runs]),
            "executions_per_delivered_call": fmt.DASH if per_call is None else f"{per_call:.3f}",
        })
    return rows


def _fig_sdk(rs: RunSet) -> FigSdk:
    """The sdk-clients figure's data: per condition and client, the hold delivered and the share of runs
    that recovered at each pulse, over the block's runs on every model."""
    block = BLOCKS["sdk-clients"]
    series: list[SdkSeries] = []
    for condition, client in itertools.product(block.conditions, block.clients):
        points: list[SdkPoint] = []
        for pulse_x in block.pulses_x:
            runs = [r for model in block.models
                    for r in _runs_of(rs, "sdk-clients", model, condition, pulse_x=pulse_x, client=client)]
            holds = [h for r in runs if (h := r["hold_delivered_pct"]) is not None]  # None: a run with no hold
            if holds:
                points.append({"pulse_x": pulse_x, "runs": len(runs), "hold_pct": sum(holds) / len(holds),
                               "recovered": sum(1 for r in runs if r["recovered"]) / len(runs)})
        if points:
            series.append({"condition": condition, "client": client or "paper", "points": points})
    return {"conditions": [c for c in block.conditions if any(s["condition"] == c for s in series)],
            "series": series}


def _sdk_verdicts(rs: RunSet) -> list[str]:
    """One plain sentence per client profile and pulse: with no control, did its default recover or
    collapse?"""
    block = BLOCKS["sdk-clients"]
    sentences = []
    for client, pulse_x in itertools.product(block.clients, block.pulses_x):
        runs = [r for model in block.models
                for r in _runs_of(rs, "sdk-clients", model, "no-control", client=client, pulse_x=pulse_x)]
        if not runs:
            continue
        recovered = sum(1 for r in runs if r["recovered"])
        verdict = ("recovers" if recovered == len(runs) else "collapses" if recovered == 0
                   else "recovers on some runs only")
        sentences.append(f"With no control at a {pulse_x:g} C-hat pulse, the {client or 'paper'} client's default "
                         f"{verdict} ({recovered} of {len(runs)} runs recovered).")
    return sentences


def _describe(entry: Entry) -> str:
    s = entry.spec
    client = f" client {s.client}" if s.client is not None else ""
    return f"{s.model} {s.condition}{client} seed {s.seed} pulse {s.pulse_x} steps {s.max_batched_tokens}"


def _block(name: str, rs: RunSet) -> BlockSection:
    block = BLOCKS[name]
    rows: list[BlockRow] = []
    for entry in rs.block_entries(name):
        s, r = entry.spec, entry.result
        summary = entry.summary
        cells = [fmt.value(summary.get(key)) for key, _ in RUN_COLUMNS] if summary is not None else []
        rows.append({"model": s.model, "seed": s.seed, "pulse_x": s.pulse_x, "steps": s.max_batched_tokens,
                     "condition": (s.condition if s.client is None else f"{s.condition} ({s.client} client)")
                     + deployment_suffix(s),
                     "cells": cells, "error": r["error"] if is_failed(r) else None, "file": run_file_name(r)})
    seeds = sorted({e.spec.seed for e in rs.block_entries(name)})
    return {"name": name, "section": block.section, "paper": block.paper, "models": list(block.models),
            "rows": rows,
            "columns": [title for _, title in RUN_COLUMNS], "seeds": seeds,
            "paper_runs": {m: paper_runs(name, m) for m in block.models}}


def _setup(rs: RunSet) -> Setup:
    builds: dict[tuple[str, str, bool], set[float]] = defaultdict(set)
    summaries = [r for r in rs.results if not is_failed(r)]
    for r in summaries:
        if r.get("replicas", 1) > 1:
            continue  # a replica set's C-hat is the replicas section's
        builds[(r["model"], r["gpu"], bool(r["mixed_prompts"]))].add(r["chat"])
    return {
        "chat": [{"model": m, "gpu": g, "prompts": "mixed" if mixed else "12,000-token",
                  "measured": fmt.span(sorted(v), 2),
                  "paper": fmt.number(PAPER["capacity"].get(m)) if not mixed and g == "h100" else fmt.DASH}
                 for (m, g, mixed), v in sorted(builds.items())],
        "gpus": sorted({str(r["gpu"]) for r in rs.results}),
        "models": sorted({str(r["model"]) for r in rs.results}),
        "code_versions": sorted({str(r.get("code_version")) for r in summaries if "code_version" in r}),
        "run_wall_s": round(sum(float(r.get("wall_s", 0.0)) for r in summaries), 1),
    }
