"""The report's "Real engine" section: the simulator against a real vLLM, from `real-engine.json`.

`retrybench compare-real-engine --out DIR` writes that file; `retrybench reproduce --out DIR` shows it
when it is there (or `--real-engine FILE`). Pure: the caller reads the file, this shapes the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

__all__ = ["FORMAT", "FORMATS", "RESULT_FILE", "RealEngineSection", "real_engine_section"]

FORMAT = "retrybench-real-engine/2"  # live.compare_real writes it; the report never imports live/
FORMATS = ("retrybench-real-engine/1", FORMAT)  # /1 has no per-stage seeds, cache counters or sustained rates
RESULT_FILE = "real-engine.json"


def _num(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{float(value):,.{digits}f}"


def _flag(value: Any) -> str:
    return "–" if value is None else ("yes" if value else "no")


class CurveRow(TypedDict):
    """One load of the capacity curve, live beside simulated, as printed."""

    load: str
    rate: str
    live_cps: str
    sim_cps: str
    live_sustained: str
    sim_sustained: str
    live_ttft: str
    sim_ttft: str
    live_hits: str
    sim_hits: str
    harness_cpu: str


class ConditionRow(TypedDict):
    """One condition live against the simulator at the band's ends, with the verdict and why."""

    condition: str
    paper: str
    recovered: str
    hold: str
    completed: str
    engine_cps: str
    probe_cps: str
    capacity: str
    harness_cpu: str
    status: str
    reason: str


class RealEngineSection(TypedDict):
    runtime: str
    pinning: str
    chats: str
    mean: str
    spread_pct: str
    refusal: str | None
    calibration_cpu: str
    curve: list[CurveRow]
    conditions: list[ConditionRow]
    wall_min: str


def _curve_row(point: Mapping[str, Any]) -> CurveRow:
    live, sim = point["live"], point.get("sim") or {}
    return {"load": f"{point['load_x']:g}", "rate": _num(point["rate_calls_per_s"], 3),
            "live_cps": _num(live["completions_per_s"], 3), "sim_cps": _num(sim.get("completions_per_s"), 3),
            "live_sustained": _num((live.get("sustained") or {}).get("per_s"), 3),
            "sim_sustained": _num((sim.get("sustained") or {}).get("per_s"), 3),
            "live_ttft": _num(live["median_ttft_s"], 3), "sim_ttft": _num(sim.get("median_ttft_s"), 3),
            "live_hits": _num((point.get("live_prefix_cache") or {}).get("hit_pct"), 1),
            "sim_hits": _num((point.get("sim_prefix_cache") or {}).get("hit_pct"), 1),
            "harness_cpu": _num(point.get("harness_cpu_pct"), 0)}


def real_engine_section(data: Mapping[str, Any]) -> RealEngineSection:
    """Rows for the page: the calibrations and their spread, the capacity curve live beside simulated,
    and per condition the live and simulated (band's ends) figures with the verdict and why."""
    if data.get("format") not in FORMATS:
        raise ValueError(f"not a {' or '.join(FORMATS)} file (format {data.get('format')!r})")
    band = data.get("band") or {}
    curve = [_curve_row(p) for p in data.get("capacity_curve", [])]
    conditions: list[ConditionRow] = []
    for row in data.get("conditions", []):
        verdict = row.get("verdict") or {"status": "not compared", "reason": "no simulated runs", "capacity": None}
        live, low, high = row["live"], row.get("sim_low") or {}, row.get("sim_high") or {}
        capacity = verdict.get("capacity") or {}
        conditions.append({
            "condition": row["condition"], "paper": _flag(row.get("paper_recovers")),
            "recovered": f"{_flag(live.get('recovered'))} / {_flag(low.get('recovered'))}–"
                         f"{_flag(high.get('recovered'))}",
            "hold": f"{_num(live.get('hold_delivered_pct'), 1)} / {_num(low.get('hold_delivered_pct'), 1)}–"
                    f"{_num(high.get('hold_delivered_pct'), 1)}",
            "completed": f"{_num(live.get('completed_x'), 3)} / {_num(low.get('completed_x'), 3)}–"
                         f"{_num(high.get('completed_x'), 3)}",
            "engine_cps": _num((row.get("saturated") or {}).get("per_s"), 3),
            "probe_cps": _num((row.get("probe_after") or {}).get("per_s"), 3),
            "capacity": capacity.get("status", "–"),
            "harness_cpu": _num(row.get("harness_cpu_pct"), 0),
            "status": verdict["status"], "reason": verdict["reason"],
        })
    calibration_cpu = [s.get("harness_cpu_pct") for c in data.get("calibrations", []) for s in c.get("stages", [])]
    calibration_cpu = [c for c in calibration_cpu if c is not None]
    return {
        "runtime": (data.get("settings") or {}).get("runtime", "process"),
        "pinning": (data.get("pinning") or {}).get("note", "–"),
        "chats": ", ".join(_num(c, 3) for c in band.get("chats", [])),
        "mean": _num(band.get("mean"), 3), "spread_pct": _num(100 * band["spread"], 1) if "spread" in band else "–",
        "refusal": band.get("refusal"),
        "calibration_cpu": _num(max(calibration_cpu), 0) if calibration_cpu else "–",
        "curve": curve, "conditions": conditions,
        "wall_min": _num(data.get("wall_s", 0) / 60, 0),
    }
