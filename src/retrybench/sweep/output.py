"""A sweep's outputs in `--out DIR`: sweep.json (the document: plan, every run, boundaries) and
index.html (drawn from that document alone), each written atomically."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import TypedDict

from retrybench.plan.spec import OverrideValue
from retrybench.records.atomicfile import write_atomic
from retrybench.records.cache import code_version
from retrybench.sweep.page import render_page
from retrybench.sweep.plan import SweepPlan
from retrybench.sweep.run import Record, SweepResult

__all__ = ["FORMAT", "SweepDocument", "document", "write_outputs"]

FORMAT = "retrybench-sweep/1"


class AxisRecord(TypedDict):
    name: str
    values: list[OverrideValue]


class FindRecord(TypedDict):
    """A boundary search: the axis, the outcome searched for, the resolution and the grid it probed."""

    axis: str
    until: str
    resolution: str
    grid: list[float]


class SweepDocument(TypedDict):
    """sweep.json: what was swept, how, and every run, boundary and spread."""

    format: str
    command: str
    model: str
    gpu: str
    conditions: list[str]
    seeds: list[int]
    axes: list[AxisRecord]
    find: FindRecord | None
    executor: str
    wall_s: float
    code_version: str
    boundary_axis: str | None
    until: str
    rows: list[Record]
    boundaries: list[Record]
    spreads: list[Record]


def document(plan: SweepPlan, result: SweepResult, *, command: str, executor: str, wall_s: float,
             find: str | None = None, resolution: Decimal | None = None) -> SweepDocument:
    """sweep.json's content: what was swept, how, and what every run and cell gave."""
    step = resolution if resolution is not None else (plan.axis(find).step if find else None)
    return {
        "format": FORMAT, "command": command, "model": plan.model, "gpu": plan.gpu,
        "conditions": list(plan.conditions), "seeds": list(plan.seeds),
        "axes": [{"name": a.name, "values": list(a.values)} for a in plan.axes],
        "find": {"axis": find, "until": result.until, "resolution": str(step),
                 "grid": plan.find_grid(find, resolution)} if find else None,
        "executor": executor, "wall_s": round(wall_s, 3), "code_version": code_version(),
        "boundary_axis": result.axis, "until": result.until,
        "rows": result.rows, "boundaries": [b.record() for b in result.boundaries],
        "spreads": [s.record() for s in result.spreads],
    }


def write_outputs(out: Path, doc: SweepDocument) -> Path:
    """Write OUT/sweep.json and OUT/index.html; return the page's path."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "sweep.json", json.dumps(doc, indent=1))
    page = out / "index.html"
    write_atomic(page, render_page(doc))
    return page
