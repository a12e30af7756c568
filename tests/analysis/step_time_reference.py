"""The step-time attribution as first written (one dataclass per entry): the oracle the faster
retrybench.analysis.step_time must match bit for bit. Kept verbatim apart from this docstring and the
result types, which it imports."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from retrybench.analysis.step_time import StepCostFit, StepTimeShares  # the result types, shared

__all__ = ["RULES", "StepCostFit", "StepTimeShares", "fit_step_costs", "step_time_shares"]

RULES = ("tokens", "attention", "fitted_cost", "marginal", "aborted_pay_fixed")


@dataclass(frozen=True)
class _Entry:
    execution: int
    tokens: int
    attention: float
    prompt: bool


@dataclass(frozen=True)
class _Step:
    start_s: float
    duration_s: float
    entries: list[_Entry]


def _steps(events: Iterable[Mapping[str, Any]]) -> list[_Step]:
    """The trace's steps in order, each entry with its attention weight from the tracked context."""
    context: dict[int, int] = {}
    steps: list[_Step] = []
    for event in events:
        kind = event.get("event")
        if kind == "preempted":
            context[int(event["execution"])] = 0
        if kind != "step":
            continue
        for eid, hit in event.get("cached_tokens", {}).items():
            context[int(eid)] = int(hit)
        entries: list[_Entry] = []
        for eid, n in event.get("prompt_tokens", {}).items():
            rid, n = int(eid), int(n)
            c = context.get(rid, 0)
            entries.append(_Entry(rid, n, n * c + n * (n + 1) / 2, True))
            context[rid] = c + n
        for eid in event.get("decode", []):
            rid = int(eid)
            c = context.get(rid, 0)
            entries.append(_Entry(rid, 1, c + 1.0, False))
            context[rid] = c + 1
        for eid in event.get("preempted", []):
            context[int(eid)] = 0
        start = float(event["start_s"])
        steps.append(_Step(start, float(event["end_s"]) - start, entries))
    return steps


def _fit(steps: list[_Step]) -> StepCostFit:
    if not steps:
        raise ValueError("the trace has no steps to fit")
    y = np.array([s.duration_s for s in steps], dtype=np.float64)
    x = np.array([[1.0, len(s.entries), sum(e.tokens for e in s.entries)] for s in steps], dtype=np.float64)
    keep = [0, 1, 2]
    coef = np.zeros(3)
    while keep:
        sol = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        coef = np.zeros(3)
        coef[keep] = sol
        negative = [k for k in keep if coef[k] < 0]
        if not negative:
            break
        keep = [k for k in keep if k not in negative]
        coef = np.zeros(3)
    ss_res = float(np.sum((y - x @ coef) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    return StepCostFit(fixed_s=float(coef[0]), per_execution_s=float(coef[1]), per_token_s=float(coef[2]), r2=r2)


def fit_step_costs(events: Iterable[Mapping[str, Any]]) -> StepCostFit:
    """Least squares over all steps; a negative coefficient is dropped (set to 0) and the rest refitted."""
    return _fit(_steps(events))


def _proportional(d: float, weights: list[float], fallback: list[float]) -> list[float]:
    total = sum(weights)
    if total <= 0:
        weights, total = fallback, sum(fallback)
    return [d * w / total for w in weights] if total > 0 else [0.0] * len(weights)


def _capped(d: float, charges: list[float]) -> list[float]:
    total = sum(charges)
    return [c * d / total for c in charges] if total > d > 0 else charges


def _charges(step: _Step, fit: StepCostFit, aborted: set[int]) -> dict[str, list[float]]:
    """Each rule's charge (seconds) to each entry of one step."""
    d = step.duration_s
    tokens = [float(e.tokens) for e in step.entries]
    fitted = [fit.per_execution_s + fit.per_token_s * e.tokens for e in step.entries]
    n_aborted = sum(1 for e in step.entries if e.execution in aborted)
    pay_fixed = [f + (fit.fixed_s / n_aborted if e.execution in aborted else 0.0)
                 for e, f in zip(step.entries, fitted, strict=True)]
    return {
        "tokens": _proportional(d, tokens, tokens),
        "attention": _proportional(d, [e.attention for e in step.entries], tokens),
        "fitted_cost": _proportional(d, fitted, tokens),
        "marginal": _capped(d, fitted),
        "aborted_pay_fixed": _capped(d, pay_fixed),
    }


def step_time_shares(
    events: Iterable[Mapping[str, Any]],
    fit: StepCostFit | None = None,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
) -> StepTimeShares:
    """Shares of the step time of steps starting in [start_s, end_s); fit defaults to one over all steps."""
    events = list(events)
    aborted = {int(e["execution"]) for e in events if e.get("event") == "aborted"}
    steps = _steps(events)
    if fit is None:
        fit = _fit(steps)
    window = [s for s in steps if (start_s is None or s.start_s >= start_s) and (end_s is None or s.start_s < end_s)]
    total = sum(s.duration_s for s in window)
    charged = dict.fromkeys(RULES, 0.0)
    charged_prompt = dict.fromkeys(RULES, 0.0)
    for step in window:
        if not step.entries:
            continue
        for rule, charges in _charges(step, fit, aborted).items():
            for entry, charge in zip(step.entries, charges, strict=True):
                if entry.execution in aborted:
                    charged[rule] += charge
                    if entry.prompt:
                        charged_prompt[rule] += charge

    def pct(values: dict[str, float]) -> dict[str, float]:
        return {rule: 100.0 * v / total if total > 0 else float("nan") for rule, v in values.items()}

    return StepTimeShares(total_s=total, aborted_share_pct=pct(charged), aborted_prompt_share_pct=pct(charged_prompt))
