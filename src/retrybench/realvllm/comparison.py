"""When the simulator and a real engine may be said to agree: pure rules over calibrations and run logs.

A live engine on a shared machine does not hold one speed: three calibrations of vLLM's CPU build
gave C-hat 1.56, 1.84 and 2.32. A disagreement with the simulator is then as likely the machine's
doing as the model's. So a comparison
- refuses to start when repeated calibrations spread by more than SPREAD_LIMIT ((max - min) / mean);
- is VOID for a run in which the engine served more than CAPACITY_TOLERANCE off its calibrated
  capacity (completions per second while its queue was not empty, as in the calibrations'
  saturated stages): neither agreement nor not;
- asserts a target only where the simulator gives the same outcome at both ends of the calibrated
  band (the lowest and the highest C-hat), since the live engine may have run anywhere inside it.

No I/O and no clock: the live orchestration (realvllm/compare_real.py) and the tests feed these. Each
value's `to_json` is its part of the comparison's record (realvllm/record.py), typed alongside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean, median
from typing import Literal

from typing_extensions import ReadOnly, TypedDict

from retrybench.records.runlog import FATE_CANCELLED, FATE_COMPLETED, FATE_ORPHANED, RunLog

__all__ = [
    "CAPACITY_TOLERANCE", "COMPLETION_REL", "HOLD_POINTS", "MIN_CALIBRATIONS", "MIN_SATURATED_S",
    "SPREAD_LIMIT", "Band", "BandJson", "CapacityCheck", "CapacityJson", "CapacityMeasurement", "ConditionVerdict",
    "MetricVerdict", "MetricVerdictJson", "PrefixCache", "PrefixCacheJson", "SaturatedJson", "SaturatedThroughput",
    "StagePoint", "StagePointJson", "SustainedJson", "SustainedRate", "TargetMetrics", "VerdictJson", "band_of",
    "capacity_check", "compare_condition", "points_verdict", "prefix_cache_delta", "recovery_verdict",
    "relative_verdict", "saturated_throughput", "stage_point", "sustained_rate",
]

SPREAD_LIMIT = 0.10  # (max - min) / mean of the calibrations' C-hat
MIN_CALIBRATIONS = 3
CAPACITY_TOLERANCE = 0.10  # a run's saturated throughput off the calibrated C-hat by more: VOID
MIN_SATURATED_S = 30  # trace seconds with a waiting queue below which a run's speed is not measured
MAX_CANCELLED_SHARE = 0.10  # engine exits that were cancellations, above which completions undercount work
HOLD_POINTS = 15.0  # hold delivered, percentage points
COMPLETION_REL = 0.20  # completion rate (completed_x), relative

Verdict = Literal["agree", "disagree", "not asserted"]
Status = Literal["agree", "disagree", "not asserted", "void", "refused"]


@dataclass(frozen=True, kw_only=True)
class Band:
    """The calibrated capacity: every C-hat measured, their mean (the runs' C-hat) and spread."""

    chats: tuple[float, ...]
    mean: float
    low: float
    high: float
    spread: float  # (high - low) / mean
    refusal: str | None  # why no comparison may be made on it, or None

    def to_json(self) -> BandJson:
        return {"chats": list(self.chats), "mean": self.mean, "low": self.low, "high": self.high,
                "spread": self.spread, "refusal": self.refusal}


class BandJson(TypedDict):
    chats: list[float]
    mean: float
    low: float
    high: float
    spread: float
    refusal: str | None


def band_of(chats: Sequence[float], limit: float = SPREAD_LIMIT, at_least: int = MIN_CALIBRATIONS) -> Band:
    """The band of repeated calibrations, with a refusal when there are too few or they spread too far."""
    if not chats or any(not c > 0 for c in chats):
        raise ValueError(f"C-hat values must be positive, got {list(chats)}")
    mean = fmean(chats)
    low, high = min(chats), max(chats)
    spread = (high - low) / mean
    refusal = None
    if len(chats) < at_least:
        refusal = f"only {len(chats)} calibration(s); the engine's speed needs at least {at_least} to be trusted"
    elif spread > limit:
        refusal = (f"the engine's speed drifted: C-hat {', '.join(f'{c:.3f}' for c in chats)} spread "
                   f"{100 * spread:.1f}% of their mean {mean:.3f}, over the {100 * limit:.0f}% a comparison allows")
    return Band(chats=tuple(chats), mean=mean, low=low, high=high, spread=spread, refusal=refusal)


@dataclass(frozen=True, kw_only=True)
class SaturatedThroughput:
    """Completions per (trace) second while the engine's waiting queue was not empty."""

    saturated_s: int  # 1-s samples with a waiting queue
    completions: int  # executions whose last token came in those seconds
    cancelled: int  # accepted executions cancelled in those seconds (work completions do not count)
    per_s: float | None  # completions / saturated_s; None without a saturated second

    @property
    def cancelled_share(self) -> float:
        exits = self.completions + self.cancelled
        return self.cancelled / exits if exits else 0.0

    def to_json(self) -> SaturatedJson:
        return {"saturated_s": self.saturated_s, "completions": self.completions, "cancelled": self.cancelled,
                "per_s": self.per_s, "cancelled_share": self.cancelled_share}


class SaturatedJson(TypedDict):
    saturated_s: int
    completions: int
    cancelled: int
    per_s: float | None
    cancelled_share: float


def saturated_throughput(log: RunLog) -> SaturatedThroughput:
    """The engine's service rate as the run log shows it: while executions wait in the engine, it
    runs full, so the executions it finishes per second are its capacity."""
    busy = {second for second, waiting in enumerate(log.samples.engine_waiting) if waiting > 0}

    def in_busy(t: float | None) -> bool:
        return t is not None and math.floor(t) in busy

    completions = sum(1 for e in log.executions
                      if e.fate in (FATE_COMPLETED, FATE_ORPHANED) and in_busy(e.finished_s))
    cancelled = sum(1 for e in log.executions
                    if e.fate == FATE_CANCELLED and e.accepted_s is not None and in_busy(e.abort_requested_s))
    return SaturatedThroughput(saturated_s=len(busy), completions=completions, cancelled=cancelled,
                               per_s=completions / len(busy) if busy else None)


@dataclass(frozen=True, kw_only=True)
class CapacityCheck:
    """Whether the engine ran at its calibrated capacity around a run: ok, void, or unchecked (no
    measurement could tell), with each measurement's deviation and why."""

    status: Literal["ok", "void", "unchecked"]
    reason: str
    measurements: tuple[CapacityMeasurement, ...]

    def to_json(self) -> CapacityJson:
        return {"status": self.status, "reason": self.reason, "measurements": [m.copy() for m in self.measurements]}


class CapacityMeasurement(TypedDict):
    """One measurement of the engine's speed around a run (SaturatedJson's fields after its name), whether
    it was used, its deviation from the calibrated capacity, or why it was not used."""

    name: str
    saturated_s: int
    completions: int
    cancelled: int
    per_s: float | None
    cancelled_share: float
    off_pct: float | None
    used: bool
    why_not: str | None


class CapacityJson(TypedDict):
    status: Literal["ok", "void", "unchecked"]
    reason: str
    measurements: list[CapacityMeasurement]


def capacity_check(measured: Mapping[str, SaturatedThroughput], capacity: float,
                   tolerance: float = CAPACITY_TOLERANCE, min_saturated_s: int = MIN_SATURATED_S,
                   max_cancelled_share: float = MAX_CANCELLED_SHARE) -> CapacityCheck:
    """VOID when any usable measurement (named: the run itself, a speed probe before or after it) is
    more than `tolerance` off `capacity`, the calibrations' saturated completions per second. A
    measurement is usable with at least `min_saturated_s` saturated seconds and at most
    `max_cancelled_share` of its engine exits cancelled (cancelled executions took engine time that
    completions do not count)."""
    rows: list[CapacityMeasurement] = []
    usable: list[tuple[str, float]] = []
    for name, t in measured.items():
        row: CapacityMeasurement = {"name": name, **t.to_json(), "off_pct": None, "used": False, "why_not": None}
        if t.per_s is None or t.saturated_s < min_saturated_s:
            row["why_not"] = f"saturated for {t.saturated_s} s, under {min_saturated_s} s"
        elif t.cancelled_share > max_cancelled_share:
            row["why_not"] = (f"{100 * t.cancelled_share:.0f}% of engine exits were cancellations: completions "
                              "undercount the engine's work")
        else:
            off = t.per_s / capacity - 1.0
            row["off_pct"], row["used"] = 100 * off, True
            usable.append((name, off))
        rows.append(row)
    if not usable:
        return CapacityCheck(status="unchecked", reason="no measurement of the engine's speed was usable",
                             measurements=tuple(rows))
    worst_name, worst = max(usable, key=lambda item: abs(item[1]))
    if abs(worst) > tolerance:
        return CapacityCheck(status="void", measurements=tuple(rows),
                             reason=f"the engine ran {100 * worst:+.1f}% off its calibrated capacity {capacity:.3f}/s "
                                    f"({worst_name}), beyond {100 * tolerance:.0f}%")
    return CapacityCheck(status="ok", measurements=tuple(rows),
                         reason=f"within {100 * tolerance:.0f}% of capacity {capacity:.3f}/s "
                                f"(worst {100 * worst:+.1f}%, {worst_name})")


@dataclass(frozen=True, kw_only=True)
class MetricVerdict:
    metric: str
    live: float | bool | None
    sim_low: float | bool | None  # the simulator with the engine at the band's lowest C-hat
    sim_high: float | bool | None  # ... and at its highest
    rule: str
    verdict: Verdict
    reason: str

    def to_json(self) -> MetricVerdictJson:
        return {"metric": self.metric, "live": self.live, "sim_low": self.sim_low, "sim_high": self.sim_high,
                "rule": self.rule, "verdict": self.verdict, "reason": self.reason}


class MetricVerdictJson(TypedDict):
    metric: str
    live: float | bool | None
    sim_low: float | bool | None
    sim_high: float | bool | None
    rule: str
    verdict: Verdict
    reason: str


def recovery_verdict(live: bool | None, sim_low: bool | None, sim_high: bool | None) -> MetricVerdict:
    """Recovery must be the same live as simulated, where the simulator's is the same across the band."""
    rule = "same recovery outcome"
    if live is None or sim_low is None or sim_high is None:
        return MetricVerdict(metric="recovered", live=live, sim_low=sim_low, sim_high=sim_high, rule=rule,
                             verdict="not asserted", reason="an outcome is missing")
    if sim_low is not sim_high:
        return MetricVerdict(metric="recovered", live=live, sim_low=sim_low, sim_high=sim_high, rule=rule,
                             verdict="not asserted",
                             reason="the simulator recovers at one end of the capacity band and not at the other")
    agree = live is sim_low
    return MetricVerdict(metric="recovered", live=live, sim_low=sim_low, sim_high=sim_high, rule=rule,
                         verdict="agree" if agree else "disagree",
                         reason=f"live {'recovered' if live else 'did not recover'}, simulator "
                                f"{'recovered' if sim_low else 'did not'} across the band")


def _distance(value: float, low: float, high: float) -> float:
    """How far `value` lies outside [low, high] (0 inside)."""
    return max(low - value, 0.0, value - high)


def points_verdict(metric: str, live: float | None, sim_low: float | None, sim_high: float | None,
                   points: float) -> MetricVerdict:
    """Within `points` (absolute) of the simulator's band, asserted where the band's ends are within
    `points` of each other."""
    rule = f"within {points:g} points"
    if live is None or sim_low is None or sim_high is None:
        return MetricVerdict(metric=metric, live=live, sim_low=sim_low, sim_high=sim_high, rule=rule,
                             verdict="not asserted", reason="a value is missing")
    low, high = sorted((sim_low, sim_high))
    if high - low > points:
        return MetricVerdict(metric=metric, live=live, sim_low=sim_low, sim_high=sim_high, rule=rule,
                             verdict="not asserted",
                             reason=f"the simulator moves {high - low:.1f} points across the capacity band")
    off = _distance(live, low, high)
    return MetricVerdict(metric=metric, live=live, sim_low=sim_low, sim_high=sim_high, rule=rule,
                         verdict="agree" if off <= points else "disagree",
                         reason=f"live {live:.1f} is {off:.1f} points outside the simulator's {low:.1f}-{high:.1f}")


def relative_verdict(metric: str, live: float | None, sim_low: float | None, sim_high: float | None,
                     rel: float) -> MetricVerdict:
    """Within `rel` (relative to the nearer end) of the simulator's band, asserted where the band's ends
    differ by at most `rel` of the larger."""
    rule = f"within {100 * rel:g}%"
    if live is None or sim_low is None or sim_high is None:
        return MetricVerdict(metric=metric, live=live, sim_low=sim_low, sim_high=sim_high, rule=rule,
                             verdict="not asserted", reason="a value is missing")
    low, high = sorted((sim_low, sim_high))
    if high - low > rel * max(abs(low), abs(high)):
        return MetricVerdict(metric=metric, live=live, sim_low=sim_low, sim_high=sim_high, rule=rule,
                             verdict="not asserted",
                             reason=f"the simulator moves from {low:.3f} to {high:.3f} across the capacity band")
    nearer = low if live < low else high
    off = _distance(live, low, high)
    agree = off <= rel * abs(nearer) if nearer else off == 0
    return MetricVerdict(metric=metric, live=live, sim_low=sim_low, sim_high=sim_high, rule=rule,
                         verdict="agree" if agree else "disagree",
                         reason=f"live {live:.3f} against the simulator's {low:.3f}-{high:.3f}")


@dataclass(frozen=True, kw_only=True)
class ConditionVerdict:
    condition: str
    status: Status
    reason: str
    metrics: tuple[MetricVerdict, ...]
    capacity: CapacityCheck | None

    def to_json(self) -> VerdictJson:
        return {"condition": self.condition, "status": self.status, "reason": self.reason,
                "metrics": [m.to_json() for m in self.metrics],
                "capacity": self.capacity.to_json() if self.capacity is not None else None}


class VerdictJson(TypedDict):
    condition: str
    status: Status
    reason: str
    metrics: list[MetricVerdictJson]
    capacity: CapacityJson | None


class TargetMetrics(TypedDict):
    """What the targets read of a run's summary (analysis.summarize), live or simulated."""

    recovered: ReadOnly[bool | None]
    hold_delivered_pct: ReadOnly[float | None]
    completed_x: ReadOnly[float | None]


def compare_condition(condition: str, live: TargetMetrics, sim_low: TargetMetrics, sim_high: TargetMetrics, *,
                      band: Band, capacity: CapacityCheck) -> ConditionVerdict:
    """The targets on one condition (recovery agrees; hold delivered within HOLD_POINTS; completion rate
    within COMPLETION_REL), from the run summaries (analysis.summarize) live and simulated at the band's
    ends. Refused when the band is; VOID when the engine was off its capacity around the run."""
    metrics = (
        recovery_verdict(live["recovered"], sim_low["recovered"], sim_high["recovered"]),
        points_verdict("hold_delivered_pct", live["hold_delivered_pct"], sim_low["hold_delivered_pct"],
                       sim_high["hold_delivered_pct"], HOLD_POINTS),
        relative_verdict("completed_x", live["completed_x"], sim_low["completed_x"], sim_high["completed_x"],
                         COMPLETION_REL),
    )
    if band.refusal is not None:
        return ConditionVerdict(condition=condition, status="refused", reason=band.refusal, metrics=metrics,
                                capacity=capacity)
    if capacity.status == "void":
        return ConditionVerdict(condition=condition, status="void", reason=capacity.reason, metrics=metrics,
                                capacity=capacity)
    asserted = [m for m in metrics if m.verdict != "not asserted"]
    failed = [m for m in asserted if m.verdict == "disagree"]
    if failed:
        status: Status = "disagree"
        reason = "; ".join(f"{m.metric}: {m.reason}" for m in failed)
    elif asserted:
        status, reason = "agree", f"{len(asserted)} of {len(metrics)} targets asserted, all met"
    else:
        status, reason = "not asserted", "the simulator's outcome changes across the capacity band on every target"
    if capacity.status == "unchecked" and status in ("agree", "disagree"):
        reason += f" (engine speed around the run unchecked: {capacity.reason})"
    return ConditionVerdict(condition=condition, status=status, reason=reason, metrics=metrics, capacity=capacity)


@dataclass(frozen=True, kw_only=True)
class SustainedRate:
    """Completions per second once the engine's running batch has stopped growing.

    While the batch grows, an engine completes fewer calls per second than it takes in and the
    difference is held in its running batch, not its waiting queue: a rate read over that time
    (and C-hat, arrival rate minus the waiting queue's growth) credits that growth as service.
    `from_s` is where the batch's 10-s mean first came within PLATEAU_SHARE of its level at the end of
    the stage (the median 10-s mean of the stage's last third); `per_s` is None when that left less
    than MIN_PLATEAU_SHARE of the stage (`why_not`): the batch was still growing."""

    from_s: int | None
    running: float | None  # the batch's mean over the plateau
    completions: int
    per_s: float | None
    why_not: str | None = None

    def to_json(self) -> SustainedJson:
        return {"from_s": self.from_s, "running": self.running, "completions": self.completions, "per_s": self.per_s,
                "why_not": self.why_not}


class SustainedJson(TypedDict):
    from_s: int | None
    running: float | None
    completions: int
    per_s: float | None
    why_not: str | None


PLATEAU_WINDOW_S = 10
PLATEAU_SHARE = 0.9
MIN_PLATEAU_SHARE = 1 / 3


def sustained_rate(log: RunLog, *, stage_s: float) -> SustainedRate:
    """The stage's completion rate over its plateau (see SustainedRate), from the run log's 1-s samples."""
    running = log.samples.engine_running[:math.floor(stage_s)]
    if len(running) < PLATEAU_WINDOW_S:
        return SustainedRate(from_s=None, running=None, completions=0, per_s=None,
                             why_not=f"{len(running)} samples of the running batch, under {PLATEAU_WINDOW_S}")
    means = [fmean(running[i - PLATEAU_WINDOW_S + 1:i + 1]) for i in range(PLATEAU_WINDOW_S - 1, len(running))]
    level = median(means[-max(len(running) // 3, 1):])
    start = PLATEAU_WINDOW_S - 1 + next(i for i, m in enumerate(means) if m >= PLATEAU_SHARE * level)
    span = stage_s - start
    done = sum(1 for e in log.executions if e.fate in (FATE_COMPLETED, FATE_ORPHANED)
               and e.finished_s is not None and start <= e.finished_s < stage_s)
    batch = fmean(running[start:]) if running[start:] else None
    if span < MIN_PLATEAU_SHARE * stage_s:
        return SustainedRate(from_s=start, running=batch, completions=done, per_s=None,
                             why_not=f"the running batch grew until {start} s of a {stage_s:g}-s stage")
    return SustainedRate(from_s=start, running=batch, completions=done, per_s=done / span)


@dataclass(frozen=True, kw_only=True)
class PrefixCache:
    """What the engine's prefix cache gave over a span: prompt tokens looked up and found (vLLM's
    prefix_cache_queries and prefix_cache_hits counters, or the simulator's)."""

    queries: int
    hits: int

    @property
    def hit_pct(self) -> float | None:
        return 100 * self.hits / self.queries if self.queries else None

    def to_json(self) -> PrefixCacheJson:
        return {"queries": self.queries, "hits": self.hits, "hit_pct": self.hit_pct}


class PrefixCacheJson(TypedDict):
    queries: int
    hits: int
    hit_pct: float | None


def prefix_cache_delta(before: Mapping[str, float], after: Mapping[str, float]) -> PrefixCache:
    """The prefix cache's counters' growth between two readings of vLLM's /metrics (metric_sums)."""
    def grown(name: str) -> int:
        return round(after.get(name, 0.0) - before.get(name, 0.0))

    return PrefixCache(queries=grown("vllm:prefix_cache_queries_total"), hits=grown("vllm:prefix_cache_hits_total"))


@dataclass(frozen=True, kw_only=True)
class StagePoint:
    """One point of the capacity curve: a constant-rate stage at `load_x` x C-hat."""

    load_x: float
    rate_calls_per_s: float
    completions_per_s: float  # executions finished in the stage after its warm-up, per second
    median_ttft_s: float | None  # of the attempts sent in the stage
    saturated: SaturatedThroughput
    sustained: SustainedRate

    def to_json(self) -> StagePointJson:
        return {"load_x": self.load_x, "rate_calls_per_s": self.rate_calls_per_s,
                "completions_per_s": self.completions_per_s, "median_ttft_s": self.median_ttft_s,
                "saturated": self.saturated.to_json(), "sustained": self.sustained.to_json()}


class StagePointJson(TypedDict):
    load_x: float
    rate_calls_per_s: float
    completions_per_s: float
    median_ttft_s: float | None
    saturated: SaturatedJson
    sustained: SustainedJson


def stage_point(log: RunLog, *, load_x: float, rate: float, stage_s: float, warmup: float = 1 / 3) -> StagePoint:
    """The curve's point from the run log of one stage that starts at 0 and lasts `stage_s`. Completions
    are counted after the first `warmup` share of the stage: until the first calls have had time to
    finish, the engine completes fewer than it serves, whatever its speed."""
    start = warmup * stage_s
    done = sum(1 for e in log.executions if e.fate in (FATE_COMPLETED, FATE_ORPHANED)
               and e.finished_s is not None and start <= e.finished_s < stage_s)
    ttft = [a.first_token_s - a.sent_s for a in log.attempts if a.first_token_s is not None and a.sent_s < stage_s]
    return StagePoint(load_x=load_x, rate_calls_per_s=rate, completions_per_s=done / (stage_s - start),
                      median_ttft_s=float(median(ttft)) if ttft else None, saturated=saturated_throughput(log),
                      sustained=sustained_rate(log, stage_s=stage_s))
