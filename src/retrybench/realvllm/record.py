"""The real-engine comparison's record, `real-engine.json` (format retrybench-real-engine/2), as types.

realvllm/compare_real.py builds it as the comparison runs: the settings, the pinning and the start;
the live part adds the calibrations, their band and the service rate, then (unless the band is
refused) the capacity curve and the conditions; the simulated part adds the simulated engine's speeds
and, to each stage, curve point and condition, the simulator's side and the verdict; `wall_s` ends
it. The keys a later part adds are NotRequired. The report's "Real engine" section
(report/real_engine.py) reads the file. Keys are listed in the order the file holds them.

TypedDict is typing_extensions', as in the parts from comparison.py, pinning.py and loadgen: typing's cannot be
validated at run time before Python 3.12, and tests/live/test_real_engine_record.py validates a
recorded file against these types.
"""

from __future__ import annotations

from typing import Literal, NotRequired

from typing_extensions import TypedDict

from retrybench.calibration.stages import StageRecord
from retrybench.loadgen.loadgen import SendLateness
from retrybench.realvllm.comparison import (
    BandJson,
    PrefixCacheJson,
    SaturatedJson,
    StagePointJson,
    SustainedJson,
    VerdictJson,
)
from retrybench.realvllm.pinning import PinningJson

__all__ = ["Calibration", "CalibrationStage", "ComparedMetrics", "ConditionRow", "CurvePoint", "RealEngineRecord",
           "SettingsJson", "SimPrefixCaches", "SimSpeeds", "SpeedFitJson"]


class SettingsJson(TypedDict):
    """compare_real.CompareSettings' fields but `log`; `out` as a string."""

    out: str
    model: str
    gpu: str
    time_scale: float
    token_scale: float
    seed: int
    calibrations: int
    first_stage: int
    max_stages: int
    stage_s: float
    curve_loads: list[float]
    curve_stage_s: float
    probe_s: float
    conditions: list[str]
    pin: bool
    run_when_refused: bool
    engine_start_timeout_s: float
    runtime: Literal["process", "container"]
    vllm_image: str | None
    proxy_image: str | None


class CalibrationStage(StageRecord):
    """One 300-s stage of a calibration, live (calibration.stages.StageRecord's fields first), and the
    simulator on the same trace."""

    seed: int
    harness_cpu_pct: float
    saturated: SaturatedJson
    sustained: SustainedJson
    prefix_cache: PrefixCacheJson
    sim_sustained: NotRequired[SustainedJson]
    sim_prefix_cache: NotRequired[PrefixCacheJson]


class Calibration(TypedDict):
    chat: float  # C-hat: the saturated stage's rate less its queue's growth
    stages: list[CalibrationStage]
    service_per_s: float | None  # completions per second in the saturated stage


class CurvePoint(TypedDict):
    """One load of the capacity curve, live, then simulated."""

    load_x: float
    rate_calls_per_s: float
    seed: int
    live: StagePointJson
    live_saturated: SaturatedJson
    live_prefix_cache: PrefixCacheJson
    harness_cpu_pct: float
    sim: NotRequired[StagePointJson]
    sim_prefix_cache: NotRequired[PrefixCacheJson]


class ComparedMetrics(TypedDict):
    """The metrics of a run's summary (analysis.summarize) the record keeps, live and simulated."""

    recovered: bool
    recovery_s: float | None
    hold_delivered_pct: float | None
    pulse_delivered_pct: float | None
    created_x: float | None
    completed_x: float | None
    retry_share_pct: float | None
    mean_waiting: float | None
    attempts: int
    retries_attached: int
    executions_cancelled: int
    executions_created: int


class SimPrefixCaches(TypedDict):
    sim_low: PrefixCacheJson
    sim_high: PrefixCacheJson


class ConditionRow(TypedDict):
    """One condition of the scaled diagnostic: the live run with the engine's speed around it, then
    the simulator at the band's ends and the verdict."""

    condition: str
    paper_recovers: bool | None  # whether the paper's engine recovers under it (None: not a paper condition)
    live: ComparedMetrics
    live_prefix_cache: PrefixCacheJson
    probe_seed: int
    harness_cpu_pct: float
    probe_harness_cpu_pct: float
    saturated: SaturatedJson  # the engine's speed during the run
    probe_before: SaturatedJson | None  # ... in the speed probe before it (the previous run's), and after it
    probe_after: SaturatedJson
    fates: dict[str, int]  # executions per fate
    send_lateness_ms: SendLateness | None
    sim_low: NotRequired[ComparedMetrics]
    sim_high: NotRequired[ComparedMetrics]
    sim_prefix_cache: NotRequired[SimPrefixCaches]
    verdict: NotRequired[VerdictJson]


class SpeedFitJson(TypedDict):
    """realvllm.simband.SpeedFit: the simulated engine's speed that calibrates to a target C-hat."""

    target: float
    speed: float
    chat: float


class SimSpeeds(TypedDict):
    low: SpeedFitJson
    mean: SpeedFitJson
    high: SpeedFitJson


class RealEngineRecord(TypedDict):
    format: str
    settings: SettingsJson
    pinning: PinningJson
    started_unix: float
    calibrations: NotRequired[list[Calibration]]
    band: NotRequired[BandJson]
    service_per_s: NotRequired[float]  # what the void rule compares a run's saturated completions/s with
    capacity_curve: NotRequired[list[CurvePoint]]
    conditions: NotRequired[list[ConditionRow]]
    sim_speeds: NotRequired[SimSpeeds]
    wall_s: NotRequired[float]
