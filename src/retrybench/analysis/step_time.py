"""Scheduler step time divided among a step's executions (Section 5.1, "Counted in time rather than tokens").

Pure: reads engine-trace events (retrybench.records.tracefile), never a file or a clock. Each step's time is fitted as
fixed + per_execution * executions + per_token * tokens, then split under five rules (RULES); the report is the
share of step time charged to executions later aborted (an "aborted" event anywhere in the trace).

Approximations, from what the trace has:
- A step's time is its GPU interval end_s - start_s; steps run back to back, so their sum counts overlapping
  (asynchronously scheduled) steps once. Output processing after end_s is not included.
- Attention context is rebuilt from scheduled tokens: reset to cached_tokens at each admission (and to 0 on
  preemption), then grown by every prompt chunk and decode scheduled for the execution, in trace order. An
  execution never seen admitted starts at 0. Context tracking runs over the whole trace, even with a window.
- Under "marginal" and "aborted_pay_fixed" a step's charges are scaled down if they exceed its duration (a step
  faster than the fit), so no step is charged more than its time. "fitted_cost" and "attention" fall back to
  "tokens" when their weights sum to 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from retrybench.analysis.prompt_work import TraceEvents
from retrybench.records.tracefile import TraceEvent

__all__ = ["RULES", "StepCostFit", "StepTimeShares", "fit_step_costs", "prompt_step_time_shares", "step_time_shares"]

RULES = ("tokens", "attention", "fitted_cost", "marginal", "aborted_pay_fixed")


@dataclass(frozen=True, kw_only=True)
class StepCostFit:
    """duration_s ~ fixed_s + per_execution_s * executions + per_token_s * tokens (coefficients >= 0)."""

    fixed_s: float
    per_execution_s: float
    per_token_s: float
    r2: float  # NaN when every step took the same time


@dataclass(frozen=True, kw_only=True)
class StepTimeShares:
    """Shares (%) of total step time charged to later-aborted executions, per rule (NaN when total_s is 0)."""

    total_s: float
    aborted_share_pct: dict[str, float]  # their prompt and decode work
    aborted_prompt_share_pct: dict[str, float]  # their prompt chunks only

    @property
    def low_pct(self) -> float:
        return min(self.aborted_prompt_share_pct.values())

    @property
    def high_pct(self) -> float:
        return max(self.aborted_prompt_share_pct.values())


@dataclass(frozen=True)
class _Steps:
    """Every step of a trace as columns; decodes and prompt chunks flattened in trace order (step s's decodes
    are decode_rid[decode_offset[s]:decode_offset[s + 1]]). The op_ columns are the context changes other
    than decodes, in trace order, each made just before the decode at position op_at: an admission or a
    preemption sets a context (op_resets), a prompt chunk (the op_ row chunk_op) adds to it."""

    start_s: np.ndarray
    end_s: np.ndarray
    decode_offset: np.ndarray
    decode_rid: np.ndarray
    chunk_step: np.ndarray
    chunk_tokens: np.ndarray
    chunk_aborted: np.ndarray
    chunk_op: np.ndarray
    op_at: np.ndarray
    op_rid: np.ndarray
    op_resets: np.ndarray
    op_value: np.ndarray

    @property
    def n_decode(self) -> np.ndarray:
        return np.diff(self.decode_offset)

    def per_step(self, values: np.ndarray) -> np.ndarray:
        """Per step, the sum of a per-chunk integer column (exact in any order)."""
        out = np.zeros(len(self.start_s), dtype=np.int64)
        np.add.at(out, self.chunk_step, values)
        return out


def _standalone_preemptions(trace: TraceEvents) -> tuple[list[int], list[int]]:
    """Steps before it and execution of each "preempted" event outside a step (rare: C-level scans)."""
    before: list[int] = []
    rids: list[int] = []
    at = counted = 0
    while "preempted" in trace.kinds[at:]:
        found = trace.kinds.index("preempted", at)
        counted += trace.kinds[at:found].count("step")
        before.append(counted)
        rids.append(int(trace.events[found]["execution"]))
        at = found + 1
    return before, rids


def _scan(trace: TraceEvents, aborted: set[int]) -> _Steps:
    """Columns built by comprehensions and numpy, with no Python loop over steps or decodes."""
    decodes = trace.step_field("decode")
    offset = np.zeros(len(decodes) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, decodes), np.int64, len(decodes)), out=offset[1:])
    chunk_step, chunk_rid, chunk_tokens = trace.chunks
    held: list[tuple[int, Any]] = []
    alone: tuple[list[int], list[int]] = ([], [])
    if not aborted:  # nothing to charge: no contexts to track (the fit reads only the per-step counts)
        decodes = ()
    else:
        held = [(s, p) for s, p in enumerate(trace.step_field("preempted")) if p]
        alone = _standalone_preemptions(trace)
    decode_rid = np.fromiter(chain.from_iterable(decodes), np.int64, int(offset[-1]) if aborted else 0)
    cached_step, cached_rid, cached_value = trace.mapping_items("cached_tokens") if aborted else ([], [], [])
    preempted_step = np.array([s for s, p in held for _ in p], dtype=np.int64)
    preempted_rid = [int(r) for _, p in held for r in p]
    alone_before, alone_rid = alone
    # trace order: per step, admissions, prompt chunks, preemptions, then "preempted" events before the next
    steps_of = [np.array(cached_step, dtype=np.int64), np.array(chunk_step, dtype=np.int64), preempted_step,
                np.array(alone_before, dtype=np.int64)]
    key = np.concatenate([5 * steps_of[0] + 1, 5 * steps_of[1] + 2, 5 * steps_of[2] + 3, 5 * steps_of[3] - 1])
    order = np.argsort(key, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    at = np.concatenate([offset[steps_of[0]], offset[steps_of[1]], offset[steps_of[2] + 1], offset[steps_of[3]]])
    n_set, n_chunks = len(cached_rid), len(chunk_rid)
    return _Steps(
        start_s=np.array(trace.step_field("start_s"), dtype=np.float64),
        end_s=np.array(trace.step_field("end_s"), dtype=np.float64),
        decode_offset=offset, decode_rid=decode_rid,
        chunk_step=steps_of[1], chunk_tokens=np.array(chunk_tokens, dtype=np.int64),
        chunk_aborted=np.array([rid in aborted for rid in chunk_rid], dtype=bool),
        chunk_op=rank[n_set:n_set + n_chunks],
        op_at=at[order],
        op_rid=np.array(cached_rid + chunk_rid + preempted_rid + alone_rid, dtype=np.int64)[order],
        op_resets=(order < n_set) | (order >= n_set + n_chunks),  # admissions and preemptions
        op_value=np.array(cached_value + chunk_tokens + [0] * (len(preempted_rid) + len(alone_rid)),
                          dtype=np.int64)[order])


def _contexts(steps: _Steps) -> tuple[np.ndarray, np.ndarray]:
    """Each decode's attention weight (its context + 1) and each prompt chunk's context before it.

    All context changes are laid out in trace order (an op before the decode at its position), stably
    sorted by execution, and each execution's context is a running sum of its additions restarted at
    every admission or preemption (or 0 before its first change). Integers: exact."""
    n_ops = len(steps.op_at)
    if not n_ops and not len(steps.decode_rid):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    op_at = steps.op_at + np.arange(n_ops)  # where each op lands among decodes and ops
    is_decode = np.ones(len(steps.decode_rid) + n_ops, dtype=bool)
    is_decode[op_at] = False
    rid = np.empty(len(is_decode), dtype=np.int64)
    rid[is_decode] = steps.decode_rid
    rid[op_at] = steps.op_rid
    resets = np.zeros(len(is_decode), dtype=bool)
    resets[op_at] = steps.op_resets
    value = np.ones(len(is_decode), dtype=np.int64)
    value[op_at] = steps.op_value
    order = np.argsort(rid, kind="stable")
    rid, resets, value = rid[order], resets[order], value[order]
    added = np.where(resets, 0, value)
    running = np.cumsum(added)
    restart = resets.copy()
    restart[0] = True
    restart[1:] |= rid[1:] != rid[:-1]
    last = np.maximum.accumulate(np.where(restart, np.arange(len(rid)), 0))
    after = np.where(resets, value, 0)[last] + running - (running[last] - added[last])
    context_after = np.empty_like(after)
    context_after[order] = after
    chunk_at = op_at[steps.chunk_op]
    return context_after[is_decode], context_after[chunk_at] - steps.chunk_tokens


def _in_order_row_sums(row: np.ndarray, column: np.ndarray, values: np.ndarray, n_rows: int) -> np.ndarray:
    """Per row, its values added up column after column from 0.0, as Python's sum() over a list does
    (a padding 0.0 after a row's last value leaves its sum unchanged)."""
    width = int(column.max()) + 1 if len(column) else 0
    table = np.zeros((width, n_rows), dtype=np.float64)
    table[column, row] = values
    total = np.zeros(n_rows, dtype=np.float64)
    for line in table:
        total += line
    return total


@dataclass(frozen=True)
class _Entries:
    """The charged entries (aborted prompt chunks, then with `decodes` aborted decodes), with what each rule
    reads of them and of their step; `prompt` marks the prompt chunks. In charging order."""

    prompt: np.ndarray
    d: np.ndarray
    tokens: np.ndarray
    tokens_total: np.ndarray
    attention: np.ndarray
    attention_total: np.ndarray
    fitted: np.ndarray
    fitted_total: np.ndarray
    pay: np.ndarray
    pay_total: np.ndarray

    def charges(self) -> list[np.ndarray]:
        """Each rule's charge to each entry, with _proportional's and _capped's float operations."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return [
                _proportional_all(self.d, self.tokens, self.tokens_total, self.tokens, self.tokens_total),
                _proportional_all(self.d, self.attention, self.attention_total, self.tokens, self.tokens_total),
                _proportional_all(self.d, self.fitted, self.fitted_total, self.tokens, self.tokens_total),
                _capped_all(self.d, self.fitted, self.fitted_total),
                _capped_all(self.d, self.pay, self.pay_total),
            ]


def _proportional_all(d: np.ndarray, weight: np.ndarray, total: np.ndarray, fallback: np.ndarray,
                      fallback_total: np.ndarray) -> np.ndarray:
    use_fallback = total <= 0
    weight = np.where(use_fallback, fallback, weight)
    total = np.where(use_fallback, fallback_total, total)
    return np.where(total > 0, d * weight / total, 0.0)


def _capped_all(d: np.ndarray, charge: np.ndarray, total: np.ndarray) -> np.ndarray:
    return np.where((total > d) & (d > 0), charge * d / total, charge)


def _entries(steps: _Steps, aborted: set[int], fit: StepCostFit, inside: np.ndarray, decodes: bool) -> _Entries:
    """The charged entries of the steps in the window that hold one (an aborted prompt chunk, or with
    `decodes` an aborted decode); every per-step total runs over all of the step's entries in entry order."""
    n_steps = len(steps.start_s)
    n_decode = steps.n_decode
    decode_step = np.repeat(np.arange(n_steps), n_decode)
    decode_aborted = np.isin(steps.decode_rid, np.fromiter(aborted, np.int64, len(aborted)))
    aborted_decodes = np.bincount(decode_step[decode_aborted], minlength=n_steps)
    aborted_chunks = steps.per_step(steps.chunk_aborted.astype(np.int64))
    charged = inside & ((aborted_chunks > 0) | (decodes & (aborted_decodes > 0)))
    row = np.cumsum(charged) - 1  # a charged step's row
    decode_weight, chunk_context = _contexts(steps)
    n = steps.chunk_tokens
    chunk_weight = n * chunk_context + n * (n + 1) / 2
    decode_weights_before = np.concatenate([[0], np.cumsum(decode_weight)])[steps.decode_offset]
    attention_total = (steps.per_step(n * chunk_context + n * (n + 1) // 2)  # whole numbers: exact
                       + np.diff(decode_weights_before))
    extra = fit.fixed_s / np.maximum(1, aborted_chunks + aborted_decodes)
    chunk_fitted = fit.per_execution_s + fit.per_token_s * n
    decode_cost = fit.per_execution_s + fit.per_token_s * 1
    chunk_pay = np.where(steps.chunk_aborted, chunk_fitted + extra[steps.chunk_step], chunk_fitted)
    decode_pay = np.where(decode_aborted, decode_cost + extra[decode_step], decode_cost)
    # the charged steps' entries as a table: row = step, column = entry (prompt chunks, then decodes)
    chunk_in = charged[steps.chunk_step]
    decode_in = charged[decode_step]
    n_chunks = steps.per_step(np.ones(len(n), dtype=np.int64))
    chunk_column = np.arange(len(n)) - np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
    decode_column = np.arange(len(decode_step)) - steps.decode_offset[decode_step] + n_chunks[decode_step]
    rows = np.concatenate([row[steps.chunk_step[chunk_in]], row[decode_step[decode_in]]])
    columns = np.concatenate([chunk_column[chunk_in], decode_column[decode_in]])
    n_rows = int(charged.sum())
    fitted_total = _in_order_row_sums(rows, columns, np.concatenate(
        [chunk_fitted[chunk_in], np.full(int(decode_in.sum()), decode_cost)]), n_rows)
    pay_total = _in_order_row_sums(rows, columns, np.concatenate([chunk_pay[chunk_in], decode_pay[decode_in]]),
                                   n_rows)
    # the entries charged, in order: step by step, its aborted prompt chunks, then its aborted decodes
    chunk_pick = chunk_in & steps.chunk_aborted
    decode_pick = decode_in & decode_aborted if decodes else np.zeros(len(decode_step), dtype=bool)
    step = np.concatenate([steps.chunk_step[chunk_pick], decode_step[decode_pick]])
    order = np.argsort(step, kind="stable")  # stable: prompt chunks (listed first) stay before decodes
    step = step[order]
    d = (steps.end_s - steps.start_s)[step]
    tokens_total = (steps.per_step(n) + n_decode).astype(np.float64)[step]
    return _Entries(
        prompt=np.concatenate([np.ones(int(chunk_pick.sum()), dtype=bool),
                               np.zeros(int(decode_pick.sum()), dtype=bool)])[order],
        d=d,
        tokens=np.concatenate([n[chunk_pick].astype(np.float64), np.ones(int(decode_pick.sum()))])[order],
        tokens_total=tokens_total,
        attention=np.concatenate([chunk_weight[chunk_pick], decode_weight[decode_pick].astype(np.float64)])[order],
        attention_total=attention_total.astype(np.float64)[step],
        fitted=np.concatenate([chunk_fitted[chunk_pick], np.full(int(decode_pick.sum()), decode_cost)])[order],
        fitted_total=fitted_total[row[step]],
        pay=np.concatenate([chunk_pay[chunk_pick], decode_pay[decode_pick]])[order],
        pay_total=pay_total[row[step]],
    )


def _fit(start_s: np.ndarray, end_s: np.ndarray, executions: np.ndarray, tokens: np.ndarray) -> StepCostFit:
    if not len(start_s):
        raise ValueError("the trace has no steps to fit")
    y = end_s - start_s
    x = np.empty((len(start_s), 3), dtype=np.float64)
    x[:, 0] = 1.0
    x[:, 1] = executions
    x[:, 2] = tokens
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


def _fit_steps(steps: _Steps) -> StepCostFit:
    n_chunks = steps.per_step(np.ones(len(steps.chunk_step), dtype=np.int64))
    return _fit(steps.start_s, steps.end_s, n_chunks + steps.n_decode, steps.per_step(steps.chunk_tokens)
                + steps.n_decode)


def fit_step_costs(events: Iterable[TraceEvent] | TraceEvents) -> StepCostFit:
    """Least squares over all steps; a negative coefficient is dropped (set to 0) and the rest refitted."""
    return _fit_steps(_scan(TraceEvents.read(events), set()))


def _in_order_sum(rows: np.ndarray) -> list[float]:
    """Column sums added up row by row (np.cumsum adds in order, as `+=` in a loop does; np.sum does not)."""
    if not len(rows):
        return [0.0] * rows.shape[1]
    return [float(v) for v in np.cumsum(rows, axis=0)[-1]]


def _charged_time(events: Iterable[TraceEvent] | TraceEvents, fit: StepCostFit | None, start_s: float | None,
                  end_s: float | None, decodes: bool) -> tuple[float, list[float], list[float]]:
    """Total step time in the window, and per rule the time charged to aborted entries (all of them, or
    none when not `decodes`) and to aborted prompt chunks."""
    trace = TraceEvents.read(events)
    aborted = trace.aborted_ids
    steps = _scan(trace, aborted)
    if fit is None:
        fit = _fit_steps(steps)
    inside = np.ones(len(steps.start_s), dtype=bool)
    if start_s is not None:
        inside &= steps.start_s >= start_s
    if end_s is not None:
        inside &= steps.start_s < end_s
    durations = (steps.end_s - steps.start_s)[inside]
    total = float(np.cumsum(durations)[-1]) if len(durations) else 0  # as sum() over the steps: in order
    if not aborted:
        return total, [0.0] * len(RULES), [0.0] * len(RULES)
    entries = _entries(steps, aborted, fit, inside, decodes)
    rows = np.column_stack(entries.charges()) if len(entries.d) else np.zeros((0, len(RULES)))
    charged = _in_order_sum(rows) if decodes else [0.0] * len(RULES)
    return total, charged, _in_order_sum(rows[entries.prompt])


def _pct(values: list[float], total: float) -> dict[str, float]:
    return {rule: 100.0 * v / total if total > 0 else float("nan") for rule, v in zip(RULES, values, strict=True)}


def step_time_shares(
    events: Iterable[TraceEvent] | TraceEvents,
    fit: StepCostFit | None = None,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
) -> StepTimeShares:
    """Shares of the step time of steps starting in [start_s, end_s); fit defaults to one over all steps."""
    total, charged, charged_prompt = _charged_time(events, fit, start_s, end_s, decodes=True)
    return StepTimeShares(total_s=total, aborted_share_pct=_pct(charged, total),
                          aborted_prompt_share_pct=_pct(charged_prompt, total))


def prompt_step_time_shares(
    events: Iterable[TraceEvent] | TraceEvents,
    fit: StepCostFit | None = None,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
) -> dict[str, float]:
    """step_time_shares(...).aborted_prompt_share_pct alone, at a fraction of the cost: the aborted
    executions' decodes are not charged (Section 5.1 reports their prompt chunks only)."""
    total, _, charged_prompt = _charged_time(events, fit, start_s, end_s, decodes=False)
    return _pct(charged_prompt, total)
