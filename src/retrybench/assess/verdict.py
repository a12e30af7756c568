"""Per control, what its runs on one setup say, and the verdict paragraph over all of them. Pure: results in,
outcomes and words out.

A control *keeps the setup up* where every one of its runs recovered within the hold: the paper's "restores
service" (the claims of Section 6 read exactly `recovered is True`, no delivery threshold). Delivery of the
burst and of the hold, and executions created against C-hat, are reported beside it, not judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean

from retrybench.records.results import Result, RunSummary, is_failed
from retrybench.sweep.bisect import Boundary

__all__ = ["BurstLimit", "ControlOutcome", "SeedLimit", "consistent", "outcome_of", "seed_limit", "verdict"]

CANCELLATION_ONLY = "retries-on-cancel-on"


@dataclass(frozen=True)
class SeedLimit:
    """One seed's burst search: `survived` the largest grid burst it recovered at below the first it did not
    (`failed_at`); status as bisect.Boundary's ("found", "everywhere": not recovered even at the grid's
    bottom, "nowhere": recovered at its top) or "unclear" (recovered at the top, not at the bottom), "failed"."""

    seed: int
    status: str
    survived: float | None
    failed_at: float | None


def seed_limit(seed: int, boundary: Boundary | None, grid: Sequence[float]) -> SeedLimit:
    """A finished search for "not recovered" on `grid` as a SeedLimit (None: a run of it failed)."""
    if boundary is None:
        return SeedLimit(seed, "failed", None, None)
    if boundary.status == "everywhere":
        return SeedLimit(seed, "everywhere", None, grid[0])
    if boundary.status == "nowhere":
        return SeedLimit(seed, "nowhere", grid[-1], None)
    assert boundary.critical is not None
    if boundary.rises:
        return SeedLimit(seed, "found", grid[boundary.critical - 1], grid[boundary.critical])
    return SeedLimit(seed, "unclear", None, grid[boundary.critical])


@dataclass(frozen=True)
class BurstLimit:
    """The critical burst search of one control: per seed, on the grid low .. high (x C-hat)."""

    low: float
    high: float
    seeds: tuple[SeedLimit, ...]

    @property
    def largest(self) -> float | None:
        """The largest grid burst survived on every seed; None where some seed survived none (or failed)."""
        survived = [s.survived for s in self.seeds]
        return None if not survived or None in survived else min(s for s in survived if s is not None)

    def words(self) -> str:
        """The limit in a few words: "up to 2.25x", "at least 3x" (the grid's top), "below 1x"."""
        if any(s.status == "failed" for s in self.seeds):
            return "a run failed"
        largest = self.largest
        if largest is None:
            if any(s.status == "unclear" for s in self.seeds):
                return "not monotone"
            return f"below {self.low:g}x"
        if all(s.status == "nowhere" for s in self.seeds):
            return f"at least {self.high:g}x"
        return f"up to {largest:g}x"

    def short(self) -> str:
        """The limit for a table cell: "2.25x", ">=6x", "<1x"."""
        words = self.words()
        for long, brief in (("up to ", ""), ("at least ", ">="), ("below ", "<")):
            if words.startswith(long):
                return brief + words.removeprefix(long)
        return words


@dataclass(frozen=True)
class ControlOutcome:
    """One control on the setup: its runs (one per seed) summed up, and the burst it survives."""

    control: str
    aliases: tuple[str, ...]
    runs: int
    recovered_runs: int
    failed_runs: int
    recovery_s: float | None  # the slowest seed's recovery (None: some seed did not recover)
    pulse_delivered_pct: float | None  # means over the seeds
    hold_delivered_pct: float | None
    primary_delivered_pct: float | None
    created_x: float | None
    limit: BurstLimit | None = None

    @property
    def keeps_up(self) -> bool:
        """Every run recovered within the hold (the paper's "restores service")."""
        return self.runs > 0 and self.failed_runs == 0 and self.recovered_runs == self.runs

    def record(self) -> dict[str, object]:
        """The outcome as JSON data."""
        limit = self.limit
        return {"control": self.control, "same_as": [a for a in self.aliases if a != self.control],
                "keeps_up": self.keeps_up, "runs": self.runs, "recovered_runs": self.recovered_runs,
                "failed_runs": self.failed_runs, "recovery_s": self.recovery_s,
                "pulse_delivered_pct": self.pulse_delivered_pct, "hold_delivered_pct": self.hold_delivered_pct,
                "primary_delivered_pct": self.primary_delivered_pct, "created_x": self.created_x,
                "largest_burst_x": limit.largest if limit else None,
                "largest_burst": limit.words() if limit else None,
                "burst_search": None if limit is None else {
                    "low": limit.low, "high": limit.high,
                    "seeds": [{"seed": s.seed, "status": s.status, "survived": s.survived, "failed_at": s.failed_at}
                              for s in limit.seeds]}}


def _mean(runs: Sequence[RunSummary], key: str) -> float | None:
    values = [v for r in runs if isinstance(v := r.get(key), int | float) and not isinstance(v, bool)]
    return round(fmean(values), 4) if values else None


def consistent(limit: BurstLimit, results: Sequence[Result], burst: float | None) -> BurstLimit:
    """`limit` with each seed's search marked "unclear" where it contradicts that seed's run at the setup's
    own burst (recovered there yet failing below it, or failing there yet surviving above): recovery is not
    monotone in the burst, so no one largest burst holds."""
    if burst is None:
        return limit
    recovered = {r["seed"]: r["recovered"] for r in results if not is_failed(r)}
    seeds = []
    for s in limit.seeds:
        at_burst = recovered.get(s.seed)
        survived_above = s.survived is not None and s.survived >= burst
        failed_below = s.failed_at is not None and s.failed_at <= burst
        if (at_burst is False and survived_above) or (at_burst is True and failed_below):
            s = SeedLimit(s.seed, "unclear", None, s.failed_at)
        seeds.append(s)
    return BurstLimit(limit.low, limit.high, tuple(seeds))


def outcome_of(control: str, aliases: tuple[str, ...], results: Sequence[Result],
               limit: BurstLimit | None = None, burst: float | None = None) -> ControlOutcome:
    """The outcome of a control from its runs at the setup's burst (`burst` x C-hat, one run per seed) and
    its burst search, checked against those runs."""
    runs = [r for r in results if not is_failed(r)]
    recovered = [r for r in runs if r["recovered"]]
    slowest = [r["recovery_s"] for r in recovered]
    recovery = max((s for s in slowest if s is not None), default=None) \
        if runs and len(recovered) == len(runs) else None
    return ControlOutcome(control=control, aliases=aliases, runs=len(results), recovered_runs=len(recovered),
                          failed_runs=len(results) - len(runs), recovery_s=recovery,
                          pulse_delivered_pct=_mean(runs, "pulse_delivered_pct"),
                          hold_delivered_pct=_mean(runs, "hold_delivered_pct"),
                          primary_delivered_pct=_mean(runs, "primary_delivered_pct"),
                          created_x=_mean(runs, "created_x"),
                          limit=None if limit is None else consistent(limit, results, burst))


def _listed(names: Sequence[str]) -> str:
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def verdict(outcomes: Sequence[ControlOutcome], setup: str, burst: str, seeds: Sequence[int]) -> str:
    """The paragraph on top of the page: the controls that keep `setup` up at `burst` and what each costs."""
    by_name: Mapping[str, ControlOutcome] = {o.control: o for o in outcomes}
    up = [o for o in outcomes if o.keeps_up]
    some = [o for o in outcomes if not o.keeps_up and o.recovered_runs > 0]
    failed = [o.control for o in outcomes if o.failed_runs]
    on_seeds = f"seed {seeds[0]}" if len(seeds) == 1 else f"every one of seeds {_listed([str(s) for s in seeds])}"
    parts = [f"On {setup}, at {burst}, "]
    if up:
        parts.append(f"{len(up)} of {len(outcomes)} controls keep the setup up (recovered within the hold on "
                     f"{on_seeds}): {_listed([o.control for o in up])}.")
    else:
        parts.append(f"none of the {len(outcomes)} controls keeps the setup up (recovered within the hold on "
                     f"{on_seeds}).")
    baseline = by_name.get("no-control")
    if baseline is not None and not baseline.keeps_up:
        alone = by_name.get(CANCELLATION_ONLY)
        also = " and neither does cancellation alone" if alone is not None and not alone.keeps_up else ""
        parts.append(f" Without a control it does not recover{also}.")
    elif baseline is not None:
        parts.append(" It recovers without any control: this burst does not overload it.")
    if up:
        delivered = [o.pulse_delivered_pct for o in up if o.pulse_delivered_pct is not None]
        if delivered:
            most = [o.control for o in up if o.pulse_delivered_pct == max(delivered)]
            if len(most) == len(up) > 1:
                parts.append(f" Each of them delivers {_pct(max(delivered))} of the burst.")
            else:
                verb = "delivers" if len(most) == 1 else "deliver"
                parts.append(f" Of those, {_listed(most)} {verb} the most of the burst ({_pct(max(delivered))}).")
        limited = sorted((o for o in up if o.limit is not None and o.limit.largest is not None),
                         key=lambda o: -(o.limit.largest or 0.0) if o.limit else 0.0)
        if limited:
            parts.append(" Largest burst survived on every seed: " + "; ".join(
                f"{o.control} {o.limit.words()}" for o in limited if o.limit) + " (x C-hat).")
        unclear = [o.control for o in up if o.limit is not None and o.limit.words() == "not monotone"]
        if unclear:
            parts.append(f" For {_listed(unclear)} recovery is not monotone in the burst: no one largest burst.")
    if some:
        parts.append(" Recovered on some seeds only: " + _listed(
            [f"{o.control} ({o.recovered_runs} of {o.runs})" for o in some]) + ".")
    if failed:
        parts.append(f" Runs failed for {_listed(failed)}: see the table.")
    return "".join(parts)
