"""The report's section on the `replicas` block: several engine replicas behind a router, the proxy as
several instances. Pure: it reads run results (a RunSet) and returns the section's data, with sentences
computed from them on where coalescing loses its effect and whether a key-affine front restores it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from retrybench.plan.blocks import BLOCKS, PRIMARY_MODEL, PROXY_TIERS, REPLICA_DEPLOYMENTS
from retrybench.plan.spec import DEPLOYMENT_DEFAULTS, RunSpec
from retrybench.records.results import RunSummary
from retrybench.report import fmt
from retrybench.report.runs import RunSet
from retrybench.report.sections import ReplicasRow, ReplicasSection, TierCell

__all__ = ["deployment_suffix", "replicas_section"]

BLOCK = "replicas"
# The proxy tier's three settings, as the table's columns name them.
TIER_NAMES = {("per-instance", "random"): "per-instance state, random front", ("shared", "random"): "shared state",
              ("per-instance", "key-affine"): "per-instance state, key-affine front"}
PER_INSTANCE, SHARED, KEY_AFFINE = TIER_NAMES
COALESCING_CONDITIONS = ("coalescing", "deferred-cancellation")  # the conditions that attach retries


def deployment_suffix(spec: RunSpec) -> str:
    """The part of a run's file name that tells its deployment apart ('' for one engine behind one proxy)."""
    parts = []
    for name, default in DEPLOYMENT_DEFAULTS.items():
        value = getattr(spec, name)
        if value != default:
            parts.append(f"{name.replace('_', '-')}-{str(value).replace(',', '+')}")
    return "".join(f"-{p}" for p in parts)


@dataclass(frozen=True)
class _Cell:
    replicas: int
    router: str
    tier: tuple[str, str]
    condition: str
    runs: tuple[RunSummary, ...]

    @property
    def recovered(self) -> int:
        return sum(1 for r in self.runs if r["recovered"])


def _tier(spec: RunSpec) -> tuple[str, str]:
    return spec.proxy_state, spec.front


def _cells(rs: RunSet) -> list[_Cell]:
    """The block's runs grouped by replica count, router, proxy tier and condition, in the block's order."""
    grouped: dict[tuple[int, str, tuple[str, str], str], list[RunSummary]] = {}
    for entry in rs.block_entries(BLOCK):
        s = entry.spec
        if entry.summary is not None and s.model == PRIMARY_MODEL:
            grouped.setdefault((s.replicas, s.router, _tier(s), s.condition), []).append(entry.summary)
    order = [(int(d["replicas"]), str(d.get("router", "round-robin")),
              (str(d["proxy_state"]), str(d.get("front", "random")))) for d in REPLICA_DEPLOYMENTS]
    conditions = BLOCKS[BLOCK].conditions
    return [_Cell(n, router, tier, condition, tuple(grouped[(n, router, tier, condition)]))
            for n, router, tier in order for condition in conditions if (n, router, tier, condition) in grouped]


def _cell_text(cell: _Cell | None) -> TierCell:
    if cell is None:
        return {"recovered": fmt.DASH, "pulse": fmt.DASH, "attached": fmt.DASH}
    return {"recovered": f"{cell.recovered} of {len(cell.runs)}",
            "pulse": fmt.span([r["pulse_delivered_pct"] for r in cell.runs]),
            "attached": fmt.span([r["retries_attached_pct"] for r in cell.runs])}


def _rows(cells: Sequence[_Cell]) -> list[ReplicasRow]:
    """One row per replica count, router and condition; one column group per proxy tier."""
    by_key = {(c.replicas, c.router, c.condition, c.tier): c for c in cells}
    rows: list[ReplicasRow] = []
    seen: set[tuple[int, str, str]] = set()
    for c in cells:
        key = (c.replicas, c.router, c.condition)
        if key in seen:
            continue
        seen.add(key)
        chats = [r["chat"] for tier in TIER_NAMES for r in by_key.get((*key, tier), _EMPTY).runs]
        rows.append({"replicas": c.replicas, "router": c.router if c.replicas > 1 else fmt.DASH,
                     "condition": c.condition, "chat": fmt.span(chats, 2),
                     "tiers": [_cell_text(by_key.get((*key, tier))) for tier in TIER_NAMES]})
    return rows


_EMPTY = _Cell(0, "", ("", ""), "", ())


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None


def _tally(cells: Sequence[_Cell]) -> tuple[int, int, float | None]:
    """Runs recovered, runs, and the median share of retries attached, over the cells."""
    runs = [r for c in cells for r in c.runs]
    return (sum(1 for r in runs if r["recovered"]), len(runs),
            _median([r["retries_attached_pct"] for r in runs]))


def _where(lost: Sequence[_Cell], of: int) -> str:
    if len(lost) == of:
        return "in every replica count and router"
    names = [f"{c.replicas} replica{'s' if c.replicas > 1 else ''}" + (f" {c.router}" if c.replicas > 1 else "")
             for c in lost]
    return "with " + ", ".join(names)


def _pct(x: float | None) -> str:
    return fmt.DASH if x is None else f"{x:.0f}%"


def _sentence(condition: str, cells: Sequence[_Cell]) -> str | None:
    """Where `condition` loses its effect once retries are spread over instances with their own state, and
    whether a key-affine front restores it, from the runs' recovery and attached shares."""
    tiers = {tier: [c for c in cells if c.condition == condition and c.tier == tier] for tier in TIER_NAMES}
    if not tiers[SHARED] or not tiers[PER_INSTANCE]:
        return None
    shared_ok, runs, shared_att = _tally(tiers[SHARED])
    spread_ok, spread_runs, spread_att = _tally(tiers[PER_INSTANCE])
    head = (f"{condition.capitalize()}: with one state shared by the proxy instances {shared_ok} of {runs} runs "
            f"recovered (median {_pct(shared_att)} of retries attached); with per-instance state behind a random "
            f"front {spread_ok} of {spread_runs} (median {_pct(spread_att)} attached)")
    if shared_ok == 0:
        return head + ": it did not restore service even with a shared state, so there was no effect to lose."
    shared_cells = {(c.replicas, c.router): c for c in tiers[SHARED]}
    lost = [c for c in tiers[PER_INSTANCE] if (s := shared_cells.get((c.replicas, c.router))) is not None
            and c.recovered < s.recovered]
    if spread_ok >= shared_ok:
        verdict = ": it keeps its effect."
    elif spread_ok == 0:
        verdict = f": it loses its effect ({_where(lost, len(tiers[PER_INSTANCE]))})."
    else:
        verdict = f": it loses part of its effect ({_where(lost, len(tiers[PER_INSTANCE]))})."
    if not tiers[KEY_AFFINE] or spread_ok >= shared_ok:
        return head + verdict
    affine_ok, affine_runs, affine_att = _tally(tiers[KEY_AFFINE])
    restores = ("restores it" if affine_ok >= shared_ok else "does not restore it" if affine_ok <= spread_ok
                else "partly restores it")
    return (head + verdict + f" A key-affine front {restores}: {affine_ok} of {affine_runs} runs recovered "
            f"(median {_pct(affine_att)} attached).")


def _router_sentence(cells: Sequence[_Cell]) -> str | None:
    """How recovery varied with the router, over every condition and proxy tier with several replicas."""
    routers: dict[str, list[_Cell]] = {}
    for c in cells:
        if c.replicas > 1:
            routers.setdefault(c.router, []).append(c)
    if len(routers) < 2:
        return None
    counts = {router: _tally(group)[:2] for router, group in routers.items()}
    listed = ", ".join(f"{router} {ok} of {n}" for router, (ok, n) in counts.items())
    same = len({ok / n for ok, n in counts.values() if n}) == 1
    return (f"With several replicas, runs recovered per router policy: {listed}"
            + (" (the router did not change recovery)." if same else "."))


def replicas_section(rs: RunSet) -> ReplicasSection | None:
    """The section's data, or None when the report holds no run of the block."""
    cells = _cells(rs)
    if not cells:
        return None
    sentences = [s for condition in COALESCING_CONDITIONS if (s := _sentence(condition, cells)) is not None]
    router = _router_sentence(cells)
    proxies = sorted({e.spec.proxies for e in rs.block_entries(BLOCK)})
    return {"tiers": list(TIER_NAMES.values()), "rows": _rows(cells),
            "sentences": sentences + ([router] if router else []),
            "proxies": ", ".join(str(p) for p in proxies), "runs": sum(len(c.runs) for c in cells),
            "proxy_tiers": len(PROXY_TIERS)}
