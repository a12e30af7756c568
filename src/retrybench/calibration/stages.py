"""The stage plan of the paper's capacity calibration (Section 3.2) and C-hat from a stage's run log: pure.

The workload runs without retries in 300-s stages, each at 1.5 times the previous stage's rate,
until the engine's waiting queue grows by at least 0.1 calls/s. In that saturated stage, arrivals
that do not join the queue are served, so C-hat = the stage's arrival rate - the queue's growth.
The arrival rate is the one the stage's calls arrived at (the paper's 3.388 calls/s, in a stage
planned at 3.417), not the planned one: a stage's Poisson count is the largest noise in the
estimate, and the queue's growth moves with it, so the difference cancels most of it (over ten
traces of the simulated H100 with Qwen2.5-7B, C-hat's standard deviation is 1.7% this way, 4.6%
from the planned rate; the means agree within 0.1%).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from typing_extensions import TypedDict  # typing_extensions': realvllm/record.py extends it and is validated

from retrybench.conditions.config import ClientPolicy, WorkloadSpec
from retrybench.records.runlog import RunLog
from retrybench.traffic.workload import Call, concat_calls, stage_trace

__all__ = ["CALIBRATION_CLIENT", "FIRST_STAGE_RATE", "LATENCY_RATE", "LATENCY_SHARE", "NO_DEADLINE_S",
           "SATURATION_PER_S", "STAGES", "STAGE_FACTOR", "STAGE_S", "Calibration", "Stage", "StageRecord",
           "StageResult", "calibration_from_log", "deployment_stage_plan", "stage_calls", "stage_plan", "stage_rate",
           "stage_record"]

# The protocol, shared by the simulated and the live calibration. 0.2 calls/s x 1.5^5 = 1.52 calls/s:
# the stage at which the paper reports TTFT and E2E.
FIRST_STAGE_RATE = 0.2
STAGE_FACTOR = 1.5
STAGE_S = 300.0
STAGES = 11
SATURATION_PER_S = 0.1  # the waiting queue's growth that marks the saturated stage
LATENCY_RATE = 1.52  # calls/s: the stage (0.2 x 1.5^5) whose latencies the paper reports, for one engine
# The paper reports latencies at 1.52 calls/s with C-hat 2.78: for another engine, the stage at the same
# share of its C-hat.
LATENCY_SHARE = LATENCY_RATE / 2.78
NO_DEADLINE_S = 1e9
"""The calibration's attempt timeout: none. A stage measures the engine's own queue, and an attempt
given up would take load off it; a client policy needs a finite timeout, so "none" is 1e9 s (about 32
years), beyond any run. The simulated calibrations (and their pinned digest) were computed with it."""
CALIBRATION_CLIENT = ClientPolicy(retries=False, attempt_timeout_s=NO_DEADLINE_S)


@dataclass(frozen=True, kw_only=True)
class StageResult:
    index: int
    rate_calls_per_s: float  # planned
    start_s: float
    end_s: float
    calls: int
    growth_per_s: float  # least-squares slope of the engine's waiting queue over the stage
    median_ttft_s: float | None
    median_e2e_s: float | None

    @property
    def arrived_per_s(self) -> float:
        """The rate the stage's calls arrived at (planned arrival times within the stage)."""
        return self.calls / (self.end_s - self.start_s)


class StageRecord(TypedDict):
    """A stage's result as JSON holds it (a calibration's record, live or cached)."""

    index: int
    rate_calls_per_s: float
    start_s: float
    end_s: float
    calls: int
    growth_per_s: float
    median_ttft_s: float | None
    median_e2e_s: float | None


def stage_record(stage: StageResult) -> StageRecord:
    return StageRecord(index=stage.index, rate_calls_per_s=stage.rate_calls_per_s, start_s=stage.start_s,
                       end_s=stage.end_s, calls=stage.calls, growth_per_s=stage.growth_per_s,
                       median_ttft_s=stage.median_ttft_s, median_e2e_s=stage.median_e2e_s)


@dataclass(frozen=True, kw_only=True)
class Calibration:
    chat_calls_per_s: float
    saturated: StageResult
    stages: tuple[StageResult, ...]

    def stage_near(self, rate_calls_per_s: float) -> StageResult:
        return min(self.stages, key=lambda s: abs(s.rate_calls_per_s - rate_calls_per_s))


Stage = tuple[float, float, float]  # (rate in calls/s, start_s, end_s)


def stage_rate(k: int, first_rate: float = FIRST_STAGE_RATE, factor: float = STAGE_FACTOR) -> float:
    """The planned rate of stage k (from 0): first_rate x factor^k."""
    return first_rate * factor**k


def stage_plan(first_rate: float = FIRST_STAGE_RATE, factor: float = STAGE_FACTOR, stages: int = STAGES,
               stage_s: float = STAGE_S) -> list[Stage]:
    """(rate, start_s, end_s) of each stage."""
    if first_rate <= 0 or factor <= 1 or stages < 1 or stage_s <= 0:
        raise ValueError("need first_rate > 0, factor > 1, stages >= 1 and stage_s > 0")
    return [(stage_rate(k, first_rate, factor), k * stage_s, (k + 1) * stage_s) for k in range(stages)]


def deployment_stage_plan(replicas: int) -> list[Stage]:
    """The plan of a replica set's calibration: the paper's, every rate times the replica count, so that its
    stages cut the deployment's capacity at the same relative points as one engine's."""
    return stage_plan(FIRST_STAGE_RATE * replicas)


def stage_calls(plan: list[Stage], stage_s: float, seed: int, spec: WorkloadSpec) -> tuple[Call, ...]:
    """The calls of every stage of `plan` (each `stage_s` long), one after another: constant-rate
    Poisson arrivals of `spec`'s calls on trace seed `seed`."""
    return concat_calls([stage_trace(rate, stage_s, seed, spec, start_s=start) for rate, start, _ in plan])


def _slope(values: list[int]) -> float:
    if len(values) < 2:
        return float("nan")
    x = np.arange(len(values), dtype=float)
    return float(np.polyfit(x, np.asarray(values, dtype=float), 1)[0])


def calibration_from_log(log: RunLog, plan: list[Stage],
                         threshold_per_s: float = SATURATION_PER_S) -> Calibration:
    """Stage results and C-hat from a calibration run's log; raises if no stage saturated."""
    waiting = log.samples.engine_waiting
    results: list[StageResult] = []
    for index, (rate, start, end) in enumerate(plan):
        in_stage = [c for c in log.calls if start <= c.arrival_s < end]
        ttft = [a.first_token_s - a.sent_s for a in log.attempts
                if a.first_token_s is not None and start <= a.sent_s < end]
        e2e = [c.delivered_s - c.arrival_s for c in in_stage if c.delivered_s is not None]
        results.append(StageResult(
            index=index, rate_calls_per_s=rate, start_s=start, end_s=end, calls=len(in_stage),
            growth_per_s=_slope(waiting[int(start):int(end)]),
            median_ttft_s=float(np.median(ttft)) if ttft else None,
            median_e2e_s=float(np.median(e2e)) if e2e else None,
        ))
        if results[-1].growth_per_s >= threshold_per_s:
            saturated = results[-1]
            return Calibration(chat_calls_per_s=saturated.arrived_per_s - saturated.growth_per_s,
                               saturated=saturated, stages=tuple(results))
    raise ValueError(f"no stage's waiting queue grew by {threshold_per_s}/s; the last stage ran at "
                     f"{plan[-1][0]:.3f} calls/s: add stages")
