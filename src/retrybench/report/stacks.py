"""The report's section on the `stacked-retries` block: retry layers stacked (application, SDK, gateway)
under each control and with one layer's retries off. Pure: it reads run results (a RunSet) and returns the
section's data, with a paragraph computed from the runs on how far the layers multiply the requests and
which single control, at which layer, cuts the multiplication most."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from statistics import mean
from typing import TypedDict

from retrybench.conditions.client_profiles import client_profile
from retrybench.plan.blocks import BLOCKS, PRIMARY_MODEL
from retrybench.plan.spec import OverrideValue
from retrybench.records.results import RunSummary
from retrybench.report import fmt
from retrybench.report.runs import RunSet

__all__ = ["BLOCK", "StackBar", "StackRow", "StacksSection", "stacks_section"]

BLOCK = "stacked-retries"
NO_CONTROL = "no-control"


class StackRow(TypedDict):
    stack: str
    layers: str
    control: str
    runs: int
    recovered: str
    wire_per_call: str
    executions_per_call: str
    layer_attempts_per_call: str
    max_wire_attempts: str
    hold_delivered_pct: str
    pulse_delivered_pct: str


class StackBar(TypedDict):
    stack: str
    control: str
    wire_per_call: float
    executions_per_call: float
    recovered: int
    runs: int


class StacksSection(TypedDict):
    rows: list[StackRow]
    bars: list[StackBar]
    stacks: list[str]
    sentences: list[str]
    runs: int


@dataclass(frozen=True)
class _Cell:
    stack: str
    control: str
    runs: tuple[RunSummary, ...]

    @property
    def recovered(self) -> int:
        return sum(1 for r in self.runs if r["recovered"])

    def per_call(self, key: str) -> list[float]:
        return [float(r[key]) / r["calls"] for r in self.runs if r["calls"]]  # type: ignore[literal-required]

    @property
    def wire(self) -> float:
        return mean(self.per_call("attempts"))

    @property
    def executions(self) -> float:
        return mean(self.per_call("executions_created"))


def _control(condition: str, overrides: tuple[tuple[str, OverrideValue], ...]) -> str:
    """A run's control as the table names it: the proxy's condition, or the layer whose retries were off."""
    for name, value in overrides:
        if name.endswith(".retries") and value is False:
            layer = name.split(".")[1] if name.startswith("layer.") else "sdk"
            return f"{layer} retries off"
    return condition


def _layers(stack: str) -> tuple[list[str], list[int]]:
    """The stack's layer names and attempts allowed per layer attempt, outermost first."""
    profile = client_profile(stack)
    if profile.layers:
        return [layer.name for layer in profile.layers], [layer.policy.max_attempts for layer in profile.layers]
    return ["sdk"], [profile.policy.max_attempts]


def _layers_text(stack: str) -> str:
    names, attempts = _layers(stack)
    return " × ".join(f"{name} {n}" for name, n in zip(names, attempts, strict=True))


def _cells(rs: RunSet) -> list[_Cell]:
    grouped: dict[tuple[str, str], list[RunSummary]] = {}
    for entry in rs.block_entries(BLOCK):
        s = entry.spec
        if entry.summary is not None and s.model == PRIMARY_MODEL and s.client is not None:
            grouped.setdefault((s.client, _control(s.condition, s.overrides)), []).append(entry.summary)
    block = BLOCKS[BLOCK]
    order = [(str(c), cond) for c in block.clients for cond in block.conditions]
    order += [(str(c), _control(block.conditions[0], o)) for c, o in block.variants]
    return [_Cell(stack, control, tuple(grouped[(stack, control)])) for stack, control in order
            if (stack, control) in grouped]


def _layer_text(cell: _Cell) -> str:
    """Attempts per call each layer made (mean over runs), outermost first."""
    per_layer: list[list[float]] = []
    for r in cell.runs:
        stack = r.get("stack")
        made = stack["attempts"] if stack is not None else [r["attempts"]]
        per_layer.append([m / r["calls"] for m in made])
    return " / ".join(fmt.number(mean(column)) for column in zip(*per_layer, strict=True))


def _row(cell: _Cell) -> StackRow:
    runs = cell.runs
    most = [r["stack"]["max_attempts"][-1] if "stack" in r else None for r in runs]
    return {"stack": cell.stack, "layers": _layers_text(cell.stack), "control": cell.control, "runs": len(runs),
            "recovered": f"{cell.recovered} of {len(runs)}", "wire_per_call": fmt.span(cell.per_call("attempts")),
            "executions_per_call": fmt.span(cell.per_call("executions_created")),
            "layer_attempts_per_call": _layer_text(cell),
            "max_wire_attempts": fmt.span([m for m in most if m is not None], 0),
            "hold_delivered_pct": fmt.span([r["hold_delivered_pct"] for r in runs]),
            "pulse_delivered_pct": fmt.span([r["pulse_delivered_pct"] for r in runs])}


def _no_control_sentence(cell: _Cell) -> str:
    _, attempts = _layers(cell.stack)
    most = [r["stack"]["max_attempts"][-1] for r in cell.runs if "stack" in r]
    top = f"; at most {max(most)} for one call, of the {prod(attempts)} its layers allow" if most else ""
    return (f"Under no control, {cell.stack} ({_layers_text(cell.stack)}) sent {fmt.number(cell.wire)} requests and "
            f"created {fmt.number(cell.executions)} executions per call{top}, and recovered in {cell.recovered} of "
            f"{len(cell.runs)} runs.")


def _best_sentence(stack: str, cells: Sequence[_Cell]) -> str | None:
    """The single control (a proxy control or one layer's retries off) that cut executions per call most,
    and which controls recovered every run."""
    base = next((c for c in cells if c.control == NO_CONTROL), None)
    controls = [c for c in cells if c.control != NO_CONTROL]
    if base is None or not controls:
        return None
    best = min(controls, key=lambda c: c.executions)
    every = [c.control for c in controls if c.recovered == len(c.runs)]
    recovered = (f"every run recovered with {', '.join(every)}" if every
                 else "no single control recovered every run")
    if fmt.number(best.executions) == fmt.number(base.executions):
        return (f"For {stack}, no single control cut executions per call below no control's "
                f"{fmt.number(base.executions)}; {recovered}.")
    return (f"For {stack}, the single control that cut executions per call most was {best.control}: from "
            f"{fmt.number(base.executions)} to {fmt.number(best.executions)} ({fmt.number(best.wire)} requests per "
            f"call; recovered in {best.recovered} of {len(best.runs)} runs); {recovered}.")


def _layers_off_sentence(stack: str, cells: Sequence[_Cell]) -> str | None:
    """What turning each one layer's retries off did to requests per call and recovery."""
    off = [c for c in cells if c.control.endswith(" retries off")]
    names, _ = _layers(stack)
    if not off or len(names) < 2:
        return None
    listed = "; ".join(f"{c.control.removesuffix(' retries off')}'s: {fmt.number(c.wire)} requests per call, "
                       f"recovered in {c.recovered} of {len(c.runs)} runs" for c in off)
    return f"For {stack} with one layer's retries off, {listed}."


def stacks_section(rs: RunSet) -> StacksSection | None:
    """The section's data, or None when the report holds no run of the block."""
    cells = _cells(rs)
    if not cells:
        return None
    stacks = list(dict.fromkeys(c.stack for c in cells))
    sentences = [_no_control_sentence(c) for c in cells if c.control == NO_CONTROL]
    for stack in stacks:
        mine = [c for c in cells if c.stack == stack]
        sentences += [s for s in (_best_sentence(stack, mine), _layers_off_sentence(stack, mine)) if s]
    bars: list[StackBar] = [{"stack": c.stack, "control": c.control, "wire_per_call": c.wire,
                             "executions_per_call": c.executions, "recovered": c.recovered, "runs": len(c.runs)}
                            for c in cells]
    return {"rows": [_row(c) for c in cells], "bars": bars, "stacks": stacks, "sentences": sentences,
            "runs": sum(len(c.runs) for c in cells)}
