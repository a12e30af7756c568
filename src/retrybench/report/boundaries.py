"""The report's "Boundaries (beyond the paper)" section: the boundary maps `reproduce` computed (the
sweep's boundary searches, handed over as plain data), as tables of critical values with their spread
over seeds, and the paper's two uncertain cells read off them.

Pure: no runs, no files. Every number in the text comes from the maps; the paper gives only where to
look (its 2 C-hat pulse, its Q = ceil(120 x C-hat) = 338). Recovery is taken as monotone along each
searched axis, as the search itself does: a seed recovers at or below the last value it recovered at,
and fails from its critical value on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from retrybench.claims.paper import paper_values
from retrybench.conditions.config import load_condition
from retrybench.plan.blocks import BLOCKS, PRIMARY_MODEL, TRIGGER_SWEEP
from retrybench.plan.spec import OverrideValue, RunSpec
from retrybench.records.results import Result, is_failed
from retrybench.report.runs import spec_of

__all__ = ["PAPER_Q", "UNCERTAIN_PULSE_X", "BoundariesSection", "Known", "MapDocument", "MapPoint",
           "boundaries_section", "known", "outcome_at"]

PAPER = paper_values()
# Section 6.2's cap: ceil(120 x the C-hat the paper measured for that block) = 338.
PAPER_Q = math.ceil(round(120 * PAPER["capacity"]["engine_cap_block_qwen25"], 6))
# Section 4.2's uncertain cell: the middle pulse of the trigger sweep, 2 C-hat.
UNCERTAIN_PULSE_X = float(PAPER["trigger_sweep"]["pulses_x"][1])
RECOVERS, FAILS, UNKNOWN = "recovers", "does not recover", "cannot be told at this resolution"

JsonRecord = Mapping[str, Any]  # a run, boundary or spread of a sweep: a JSON object keyed by axis names too


class MapPoint(TypedDict):
    """One of the paper's runs on a map: its panel and its place on the two axes."""

    panel: str
    x: OverrideValue
    y: OverrideValue


class MapDocument(TypedDict):
    """One boundary map as the sweep hands it over: how it is drawn (x the searched axis, y the other,
    a panel per value of `panel`), its runs, per-cell boundaries and spreads, and the paper's runs on it."""

    name: str
    x: str
    y: str
    panel: str
    panels: list[str]
    xs: list[float]
    ys: list[OverrideValue]
    seeds: list[int]
    until: str
    resolution: str
    gpu: str
    aliases: dict[str, list[str]]
    points: list[MapPoint]
    rows: Sequence[JsonRecord]
    boundaries: Sequence[JsonRecord]
    spreads: Sequence[JsonRecord]
    commands: list[str]


class SeedCell(TypedDict):
    seed: int
    critical: str
    recovered_at: str


class CriticalRow(TypedDict):
    condition: str
    other: str
    seeds: list[SeedCell]
    found: str
    spread: str


class PulseRow(TypedDict):
    model: str
    condition: str
    fails: int
    seeds: int
    at_boundary: int
    critical: list[float]


class PulseCell(TypedDict):
    pulse_x: float
    sentences: list[str]
    rows: list[PulseRow]


class QRow(TypedDict):
    condition: str
    pulse_x: float
    all_recover_to: float | None
    none_recover_from: float | None
    seed_dependent: list[float]
    own_q: int | None


class QRange(TypedDict):
    q: int
    sentences: list[str]
    rows: list[QRow]


class BoundariesSection(TypedDict):
    maps: dict[str, MapDocument]
    tables: dict[str, list[CriticalRow]]
    pulse_cell: PulseCell | None
    q_range: QRange | None
    runs: int
    distinct: int
    failed: int
    wall_s: float | None
    seeds: list[int]
    commands: list[str]
    settings: list[str]
    paper_points: dict[str, str]


def _g(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


@dataclass(frozen=True)
class Known:
    """What one seed's search says along its axis: it recovered up to `recovers_to` (None: nowhere
    probed) and did not from `fails_from` on (None: nowhere probed); between the two, not known."""

    recovers_to: float | None
    fails_from: float | None


def known(boundary: Mapping[str, Any], grid: Sequence[float]) -> Known:
    """A boundary row of the sweep (not-recovered searched for), as what is known of recovery."""
    status = boundary["status"]
    if status == "found" and boundary["rises"]:
        return Known(boundary["bracket"][0], boundary["critical"])
    if status == "nowhere":
        return Known(max(grid), None)
    if status == "everywhere":
        return Known(None, min(grid))
    return Known(None, None)  # non-monotone, failed, or falling (recovering above a value)


def outcome_at(what: Known, value: float) -> str:
    """Whether the seed recovers at `value`: RECOVERS, FAILS or UNKNOWN (between its bracket's values)."""
    if what.recovers_to is not None and value <= what.recovers_to:
        return RECOVERS
    if what.fails_from is not None and value >= what.fails_from:
        return FAILS
    return UNKNOWN


def _critical_text(boundary: Mapping[str, Any], grid: Sequence[float]) -> str:
    """One seed's critical value as printed: the value, or beyond the range, or why there is none."""
    status = boundary["status"]
    if status == "found":
        return _g(boundary["critical"])
    return {"nowhere": f"> {_g(max(grid))}", "everywhere": f"≤ {_g(min(grid))}",
            "non-monotone": "not monotone", "failed": "a run failed"}[status]


def _other_key(doc: MapDocument) -> str:
    """The field besides the condition that tells a map's cells apart (model, W, pulse)."""
    return str(doc["panel"] if doc["y"] == "condition" else doc["y"])


def _label(condition: str, aliases: Mapping[str, Sequence[str]]) -> str:
    same = [a for a in aliases.get(condition, ()) if a != condition]
    return condition + (f" (= {', '.join(same)})" if same else "")


def _cells(doc: MapDocument) -> list[tuple[str, Any, list[JsonRecord]]]:
    """(condition, other value, boundary rows by seed) per cell, in the map's order."""
    other = _other_key(doc)
    cells: dict[tuple[str, Any], list[JsonRecord]] = {}
    for b in doc["boundaries"]:
        cells.setdefault((b["condition"], b.get(other)), []).append(b)
    return [(c, v, sorted(bs, key=lambda b: b["seed"])) for (c, v), bs in cells.items()]


def critical_table(doc: MapDocument) -> list[CriticalRow]:
    """Per cell: the critical value on each seed and their spread (low-high over the seeds where found)."""
    rows: list[CriticalRow] = []
    for condition, other, bs in _cells(doc):
        found = [b["critical"] for b in bs if b["status"] == "found"]
        spread = "–" if not found else _g(min(found)) if min(found) == max(found) else \
            f"{_g(min(found))}–{_g(max(found))}"
        rows.append({"condition": _label(condition, doc["aliases"]), "other": _g(other),
                     "seeds": [{"seed": b["seed"], "critical": _critical_text(b, doc["xs"]),
                                "recovered_at": _g(b["bracket"][0]) if b["status"] == "found" and b["rises"] else ""}
                               for b in bs],
                     "found": f"{len(found)} of {len(bs)}", "spread": spread})
    return rows


def _retry_conditions(doc: MapDocument) -> list[str]:
    """The map's conditions that stand for the trigger sweep's conditions with retries on."""
    wanted = {c for c in TRIGGER_SWEEP if load_condition(c).client.retries}
    return [c for c, names in doc["aliases"].items() if wanted & set(names)]


def pulse_cell(doc: MapDocument) -> PulseCell:
    """Section 4.2's uncertain cell: per model, the critical pulse with retries on each seed, and where
    the 2 C-hat pulse lies against it."""
    step, pulse = float(doc["resolution"]), UNCERTAIN_PULSE_X
    sentences: list[str] = []
    rows: list[PulseRow] = []
    for condition in _retry_conditions(doc):
        for _, model, bs in (cell for cell in _cells(doc) if cell[0] == condition):
            knowns = [known(b, doc["xs"]) for b in bs]
            outcomes = [outcome_at(k, pulse) for k in knowns]
            at_boundary = [b["seed"] for b, k in zip(bs, knowns, strict=True)
                           if k.recovers_to is not None and k.fails_from is not None
                           and k.recovers_to <= pulse <= k.fails_from]
            per_seed = ", ".join(f"{_critical_text(b, doc['xs'])} on seed {b['seed']}" for b in bs)
            unknown = outcomes.count(UNKNOWN)
            text = (f"{model}: the smallest pulse that does not recover is {per_seed} (grid step {_g(step)} C-hat). "
                    f"At {_g(pulse)} C-hat, seeds that do not recover: {outcomes.count(FAILS)} of {len(bs)}"
                    + (f" and {unknown} cannot be told at this resolution" if unknown else "") + "; ")
            if at_boundary:
                text += (f"{_g(pulse)} C-hat is one of the two grid values around the boundary on "
                         f"{len(at_boundary)} of {len(bs)} seeds ({', '.join(map(str, at_boundary))}): "
                         "it sits at the boundary, to within one step.")
            else:
                brackets = "; ".join(f"seed {b['seed']} {b['bracket'][0]:g}–{b['bracket'][1]:g}" for b in bs
                                     if b["status"] == "found")
                text += (f"it lies outside every seed's bracket ({brackets or 'no boundary in range'}), "
                         "more than one step from the boundary.")
            sentences.append(text)
            rows.append({"model": model, "condition": condition, "fails": outcomes.count(FAILS), "seeds": len(bs),
                         "at_boundary": len(at_boundary),
                         "critical": [b["critical"] for b in bs if b["status"] == "found"]})
    found = [c for r in rows for c in r["critical"]]
    if found:
        fails = sum(r["fails"] for r in rows)
        sentences.append(f"Over {len(rows)} model(s), {fails} of {sum(r['seeds'] for r in rows)} seed runs at "
                         f"{_g(pulse)} C-hat do not recover; the critical pulses found span "
                         f"{_g(min(found))}–{_g(max(found))} C-hat.")
    return {"pulse_x": pulse, "sentences": sentences, "rows": rows}


def _own_runs(results: Iterable[Result], condition: str, pulse: float) -> tuple[int | None, int, int]:
    """Table 1's runs of `condition` on the primary model at `pulse`: the cap they resolved
    ceil(120 x C-hat) to here (None: no such run), how many recovered, how many there are."""
    runs = [r for r in results if not is_failed(r) and isinstance(r.get("engine_cap"), int)
            and spec_of(r) == RunSpec(model=PRIMARY_MODEL, condition=condition, seed=r["seed"], pulse_x=pulse)]
    caps = {r["engine_cap"] for r in runs}
    cap = caps.pop() if len(caps) == 1 else None
    return cap, sum(1 for r in runs if r["recovered"]), len(runs)


def _where(q: float, lo: float | None, hi: float | None, dis: tuple[float, float] | None) -> str:
    if lo is not None and q <= lo:
        return "every seed recovers there"
    if hi is not None and q >= hi:
        return "no seed recovers there"
    if dis is not None and dis[0] <= q <= dis[1]:
        return "it is inside the range where recovery depends on the seed"
    return "it lies between grid values inside the band where the seeds' boundaries fall"


def q_range(doc: MapDocument, results: Iterable[Result] = ()) -> QRange:
    """Section 6.2's uncertain cell: per cancellation setting, the Q range over which recovery at the
    engine-cap block's pulse depends on the seed, and where Q = 338 falls."""
    runs = list(results)
    step = float(doc["resolution"])
    sentences: list[str] = []
    rows: list[QRow] = []
    for pulse in BLOCKS["engine-cap"].pulses_x:
        for condition, _, bs in (cell for cell in _cells(doc) if cell[1] == pulse):
            knowns = [known(b, doc["xs"]) for b in bs]
            tos = [k.recovers_to for k in knowns]
            froms = [k.fails_from for k in knowns]
            all_recover = min(t for t in tos if t is not None) if None not in tos else None
            none_recover = max(f for f in froms if f is not None) if None not in froms else None
            low_fail = min((f for f in froms if f is not None), default=None)
            high_recover = max((t for t in tos if t is not None), default=None)
            seed_dependent = (low_fail, high_recover) if low_fail is not None and high_recover is not None \
                and low_fail <= high_recover else None
            per_seed = ", ".join(f"{_critical_text(b, doc['xs'])} on seed {b['seed']}" for b in bs)
            text = (f"{condition} at {_g(pulse)} C-hat: the smallest Q that does not recover is {per_seed} "
                    f"(grid step {_g(step)}).")
            if all_recover is not None:
                text += f" Every seed recovers at Q ≤ {_g(all_recover)}."
            if none_recover is not None:
                text += f" No seed recovers at Q ≥ {_g(none_recover)}."
            if seed_dependent is not None:
                low, high = seed_dependent
                text += (f" Recovery depends on the seed at Q = {_g(low)}." if low == high else
                         f" Recovery depends on the seed from Q = {_g(low)} to {_g(high)}.")
            elif all_recover is not None and none_recover is not None:
                text += (f" The seeds' boundaries fall between Q = {_g(all_recover)} and {_g(none_recover)}, with "
                         "no grid value of Q on which they disagree.")
            text += f" Q = {PAPER_Q} (the paper's): {_where(PAPER_Q, all_recover, none_recover, seed_dependent)}."
            own, recovered, total = _own_runs(runs, condition, pulse)
            if own is not None and own != PAPER_Q:
                text += (f" Q = {own} (ceil(120 x C-hat) at this engine's C-hat, which Table 1's runs here use): "
                         f"{_where(own, all_recover, none_recover, seed_dependent)}; {recovered} of {total} of "
                         "those runs recovered.")
            sentences.append(text)
            rows.append({"condition": condition, "pulse_x": pulse, "all_recover_to": all_recover,
                         "none_recover_from": none_recover, "seed_dependent": list(seed_dependent or ()),
                         "own_q": own})
    return {"q": PAPER_Q, "sentences": sentences, "rows": rows}


def _settings(by_name: Mapping[str, MapDocument]) -> list[str]:
    """What each map searched, in words, from the maps themselves."""
    words = []
    for name, doc in by_name.items():
        xs, step = doc["xs"], doc["resolution"]
        span = f"{doc['x']} {_g(xs[0])}–{_g(xs[-1])} in steps of {step}"
        across = "" if doc["y"] == "condition" else f" at {doc['y']} " + ", ".join(_g(y) for y in doc["ys"])
        words.append(f"{name}: {span}{across}")
    return words


def _paper_points(by_name: Mapping[str, MapDocument]) -> dict[str, str]:
    """The paper's runs on each map, in words (x at y)."""
    return {name: "; ".join(sorted({f"{doc['x']} = {_g(p['x'])} at {doc['y']} = {_g(p['y'])}"
                                     for p in doc["points"] if doc["y"] != "condition"}))
            for name, doc in by_name.items()}


def boundaries_section(maps: Sequence[MapDocument], *, wall_s: float | None = None,
                       results: Iterable[Result] = ()) -> BoundariesSection:
    """The section's data: each map (for its figure) with its table of critical values, the two
    uncertain cells, and what the maps cost (`results`: Table 1's runs, for the cap they resolved)."""
    by_name = {doc["name"]: doc for doc in maps}
    rows = [row for doc in maps for row in doc["rows"]]
    return {
        "maps": by_name,
        "tables": {name: critical_table(doc) for name, doc in by_name.items()},
        "pulse_cell": pulse_cell(by_name["pulse"]) if "pulse" in by_name else None,
        "q_range": q_range(by_name["engine-cap"], results) if "engine-cap" in by_name else None,
        "runs": len(rows), "distinct": len({row["key"] for row in rows}),
        "failed": sum(1 for row in rows if row.get("error")), "wall_s": wall_s,
        "seeds": sorted({s for doc in maps for s in doc["seeds"]}),
        "commands": [c for doc in maps for c in doc["commands"]],
        "settings": _settings(by_name), "paper_points": _paper_points(by_name),
    }
