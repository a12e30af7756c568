"""The boundary maps `retrybench reproduce` computes beyond the paper, as boundary searches of the
sweep (`run_finds`), through the same executor and result cache as every other run.

1. pulse: per condition and model that Table 1 runs, the smallest pulse that does not recover.
2. deferral: the same over the deferral window W of deferred cancellation.
3. engine-cap: the smallest vLLM queue cap Q that does not recover, at each of the paper's pulses.

Each map is returned as plain data (its runs, per-cell boundaries and their spread over seeds, the
paper's own runs on it), which the report draws and reads; it never imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from retrybench.conditions.config import ClientPolicy, Condition, ProxyPolicy, load_condition
from retrybench.plan.blocks import PRIMARY_MODEL, PULSES_X, TABLE1
from retrybench.plan.spec import OverrideValue
from retrybench.report.boundaries import PAPER_Q, MapDocument, MapPoint
from retrybench.runs.executors import Executor, Progress
from retrybench.sweep.axes import Axis, parse_axis
from retrybench.sweep.plan import SweepPlan
from retrybench.sweep.run import Find, SweepResult, find_runs_bound, run_finds

__all__ = ["CAP_AXIS", "DEFER_AXIS", "PULSE_AXIS", "SEEDS", "BoundaryMap", "plan_maps", "run_maps", "runs_bound"]

# The default resolution, kept small so that `reproduce` stays a few minutes on a 2-core machine: every
# search bisects (2 + ceil(log2(points - 1)) runs per cell at most, 5 along the pulse grid, 8 along the Q
# grid), and a cell whose ends agree costs its 2 end runs. Cold, the three maps on the three paper models
# took 292 distinct runs, 40-59 s on a 2-core machine shared with other work (at most 486 runs).
# `retrybench sweep` runs any map finer or on more seeds (README, "Sweeps").
SEEDS = (1, 2)  # trace seeds: those of Table 1's first two runs, whose runs a probe at 2.0 C-hat reuses
PULSE_AXIS = "pulse_x=1.0:3.0:0.25"  # C-hat multiples; 9 grid points, 2.0 the first midpoint probed
DEFER_AXIS = "proxy.defer_s=0,1,2,5,10,30"  # seconds; 10 is the paper's window
CAP_AXIS = "engine_cap=25:1000:25"  # vLLM's --max-num-queued-reqs; 40 grid points, 100 among them
CAP_PULSES = PULSES_X  # the pulses (C-hat multiples) at which Q is searched: the paper's three
UNTIL = "not-recovered"


@dataclass(frozen=True)
class BoundaryMap:
    """One map: its searches, how it is drawn (x the searched axis, y the other, a panel per value of
    `panel`), the Table 1 conditions each searched one stands for, and the paper's runs on it."""

    name: str
    finds: tuple[Find, ...]
    x: str
    y: str
    panel: str
    panels: tuple[str, ...]
    ys: tuple[OverrideValue, ...]
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    points: tuple[MapPoint, ...] = ()


def _policy(condition: Condition) -> tuple[ClientPolicy, ProxyPolicy, int | str | None]:
    return condition.client, condition.proxy, condition.engine_cap


def same_policy(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Each distinct policy once, under its first name -> every name with that policy (no-control is
    retries-on-cancel-off): a condition's runs are the same under either name, so it is searched once."""
    groups: dict[tuple[ClientPolicy, ProxyPolicy, int | str | None], list[str]] = {}
    for name in names:
        groups.setdefault(_policy(load_condition(name)), []).append(name)
    return {members[0]: tuple(members) for members in groups.values()}


def table1_models(models: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Every condition of Table 1 -> the chosen models Table 1 runs it on, in Table 1's order."""
    found: dict[str, list[str]] = {}
    for block in TABLE1.values():
        for condition in block.conditions:
            chosen = found.setdefault(condition, [])
            chosen.extend(m for m in block.models if m in models and m not in chosen)
    return {c: tuple(m for m in models if m in ms) for c, ms in found.items() if ms}


def _paper_pulses() -> dict[tuple[str, str], set[float]]:
    """(condition, model) -> the pulses of Table 1's runs of it (its 8,192-token, uniform-prompt blocks)."""
    pulses: dict[tuple[str, str], set[float]] = {}
    for block in TABLE1.values():
        if block.mixed_prompts or any(step != 8192 for step in block.step_tokens):
            continue
        for condition in block.conditions:
            for model in block.models:
                pulses.setdefault((condition, model), set()).update(block.pulses_x)
    return pulses


def pulse_map(models: Sequence[str], gpu: str = "h100", seeds: tuple[int, ...] | None = None,
              conditions: Sequence[str] | None = None) -> BoundaryMap | None:
    """Map 1: the critical pulse of every (condition, model) pair Table 1 runs (or of `conditions`)."""
    seeds = seeds or SEEDS
    pairs = table1_models(models)
    if conditions is not None:
        pairs = {c: pairs[c] for c in conditions if c in pairs}
    aliases = same_policy(pairs)
    if not aliases:
        return None
    by_models: dict[tuple[str, ...], list[str]] = {}
    for condition in aliases:
        by_models.setdefault(pairs[condition], []).append(condition)
    pulse = parse_axis(PULSE_AXIS)
    finds = tuple(Find(SweepPlan(conditions=tuple(conds), axes=(pulse, parse_axis("model=" + ",".join(ms))),
                                 seeds=seeds, model=ms[0], gpu=gpu), pulse.name)
                  for ms, conds in by_models.items())
    representative = {name: rep for rep, names in aliases.items() for name in names}
    found = {(model, x, representative[c]) for (c, model), xs in _paper_pulses().items()
              if c in representative and model in pairs[representative[c]] for x in xs}
    panels = tuple(m for m in models if any(m in ms for ms in by_models))
    return BoundaryMap(name="pulse", finds=finds, x=pulse.name, y="condition", panel="model", panels=panels,
                       ys=tuple(aliases), aliases=aliases,
                       points=tuple(MapPoint(panel=m, x=x, y=c) for m, x, c in sorted(found)))


def _table1_conditions(keep: Callable[[Condition], bool]) -> list[str]:
    """Table 1's conditions (on the primary model) whose loaded policy `keep` accepts."""
    return [c for c, ms in table1_models([PRIMARY_MODEL]).items() if keep(load_condition(c))]


def _block_pulses(condition: str) -> set[float]:
    return {x for block in TABLE1.values() if condition in block.conditions for x in block.pulses_x}


def deferral_map(gpu: str = "h100", seeds: tuple[int, ...] | None = None) -> BoundaryMap | None:
    """Map 2: the critical pulse of deferred cancellation at each deferral window W."""
    seeds = seeds or SEEDS
    conditions = _table1_conditions(lambda c: c.proxy.cancellation == "deferred")
    if not conditions:
        return None
    pulse, window = parse_axis(PULSE_AXIS), parse_axis(DEFER_AXIS)
    plan = SweepPlan(conditions=tuple(conditions), axes=(pulse, window), seeds=seeds, model=PRIMARY_MODEL, gpu=gpu)
    points = tuple(MapPoint(panel=c, x=x, y=load_condition(c).proxy.defer_s)
                   for c in conditions for x in sorted(_block_pulses(c)))
    return BoundaryMap(name="deferral", finds=(Find(plan, pulse.name),), x=pulse.name, y=window.name,
                       panel="condition", panels=tuple(conditions), ys=window.values,
                       aliases={c: (c,) for c in conditions}, points=points)


def engine_cap_map(gpu: str = "h100", seeds: tuple[int, ...] | None = None) -> BoundaryMap | None:
    """Map 3: the critical engine cap Q at each of the paper's pulses, for each condition whose cap is
    the paper's ceil(120 x C-hat) (cancellation off and on)."""
    seeds = seeds or SEEDS
    conditions = _table1_conditions(lambda c: c.engine_cap == "auto")
    if not conditions:
        return None
    cap = parse_axis(CAP_AXIS)
    pulses = parse_axis("pulse_x=" + ",".join(str(x) for x in CAP_PULSES))
    plan = SweepPlan(conditions=tuple(conditions), axes=(cap, pulses), seeds=seeds, model=PRIMARY_MODEL, gpu=gpu)
    # The paper's capped runs: each on the panel of the condition it equals but for its cap.
    panel_of = {}
    for name in conditions:
        condition = load_condition(name)
        panel_of[condition.client, condition.proxy] = name
    points: list[MapPoint] = []
    for name in _table1_conditions(lambda c: c.engine_cap is not None):
        condition = load_condition(name)
        panel = panel_of.get((condition.client, condition.proxy))
        q = PAPER_Q if condition.engine_cap == "auto" else condition.engine_cap
        points += [MapPoint(panel=panel, x=q, y=x) for x in sorted(_block_pulses(name)) if panel is not None]
    return BoundaryMap(name="engine-cap", finds=(Find(plan, cap.name),), x=cap.name, y=pulses.name,
                       panel="condition", panels=tuple(conditions), ys=pulses.values,
                       aliases={c: (c,) for c in conditions}, points=tuple(points))


def plan_maps(models: Sequence[str], gpu: str = "h100", seeds: tuple[int, ...] | None = None) -> list[BoundaryMap]:
    """The maps for the chosen models: the pulse map on each; deferral and engine cap on the primary
    model, the only one Table 1 runs those blocks on."""
    maps = [pulse_map(models, gpu, seeds)]
    if PRIMARY_MODEL in models:
        maps += [deferral_map(gpu, seeds), engine_cap_map(gpu, seeds)]
    return [m for m in maps if m is not None]


def runs_bound(maps: Sequence[BoundaryMap]) -> int:
    """The most runs the maps may make (every cell's bisection at its longest)."""
    return sum(find_runs_bound(f.plan, f.axis, f.resolution) for m in maps for f in m.finds)


def _axis_text(axis: Axis) -> str:
    values = [v for v in axis.values if v is not None]
    if axis.step is not None and values:
        return f"{axis.name}={min(values)}:{max(values)}:{axis.step}"
    return f"{axis.name}=" + ",".join(str(v) for v in axis.values)


def _seeds_text(seeds: Sequence[int]) -> str:
    """Seeds as `--seed` reads them: a range where they run on without a gap (1-5), else listed."""
    ordered = sorted(seeds)
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def sweep_command(find: Find, out: str) -> str:
    """The `retrybench sweep` that runs the same search (widen its --seed or add --resolution R for more)."""
    plan = find.plan
    fixed = [] if any(a.name == "model" for a in plan.axes) else [f"--model {plan.model}"]
    return " ".join(["retrybench sweep", f"--condition {','.join(plan.conditions)}",
                     *(f"--axis {_axis_text(a)}" for a in plan.axes), *fixed, f"--find {find.axis}",
                     f"--seed {_seeds_text(plan.seeds)}", f"--out {out}"])


def _document(found: BoundaryMap, results: Sequence[SweepResult]) -> MapDocument:
    """A map as the report reads it: plain data, the runs and boundaries of all its searches."""
    first = found.finds[0]
    grid = first.plan.find_grid(first.axis, first.resolution)
    rows = [row for r in results for row in r.rows]
    return {
        "name": found.name, "x": found.x, "y": found.y, "panel": found.panel, "panels": list(found.panels),
        "xs": grid, "ys": list(found.ys), "seeds": list(first.plan.seeds), "until": UNTIL,
        "resolution": str(first.resolution or first.plan.axis(first.axis).step), "gpu": first.plan.gpu,
        "aliases": {k: list(v) for k, v in found.aliases.items()}, "points": list(found.points),
        "rows": rows, "boundaries": [b.record() for r in results for b in r.boundaries],
        "spreads": [s.record() for r in results for s in r.spreads],
        "commands": [sweep_command(f, f"boundaries-{found.name}") for f in found.finds],
    }


def run_maps(maps: Sequence[BoundaryMap], executor: Executor,
             progress: Progress | None = None) -> list[MapDocument]:
    """Every search of every map, advanced together a round at a time; each map as the report reads it."""
    finds = [f for m in maps for f in m.finds]
    results = iter(run_finds(finds, executor, UNTIL, progress))
    return [_document(m, [next(results) for _ in m.finds]) for m in maps]
