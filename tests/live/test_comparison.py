"""The rules that decide whether the simulator and a real engine agree (realvllm/comparison.py), on small
synthetic inputs: the calibration band's refusal, the VOID rule, agreement across the capacity band."""

from __future__ import annotations

import pytest

from retrybench.realvllm.comparison import (
    Band,
    CapacityCheck,
    SaturatedThroughput,
    TargetMetrics,
    band_of,
    capacity_check,
    compare_condition,
    points_verdict,
    prefix_cache_delta,
    recovery_verdict,
    relative_verdict,
    saturated_throughput,
    stage_point,
    sustained_rate,
)
from retrybench.records import runlog
from retrybench.records.runlog import AttemptRecord, ExecutionRecord, QueueSamples, RunLog

# -- the calibration band ---------------------------------------------------------------------------


def test_the_drifting_calibrations_seen_on_the_cpu_build_are_refused() -> None:
    band = band_of([1.56, 1.84, 2.32])
    assert band.refusal is not None and "drifted" in band.refusal and "39.9%" in band.refusal
    assert band.mean == pytest.approx(1.9067, abs=1e-4) and (band.low, band.high) == (1.56, 2.32)


def test_calibrations_within_ten_percent_of_their_mean_are_accepted() -> None:
    band = band_of([2.0, 2.1, 2.19])  # (2.19 - 2.0) / 2.0967 = 9.1%
    assert band.refusal is None and band.spread == pytest.approx(0.0906, abs=1e-3)


def test_a_spread_just_over_the_limit_is_refused() -> None:
    assert band_of([2.0, 2.1, 2.22]).refusal is not None  # 10.5%


def test_fewer_calibrations_than_required_are_refused_with_the_count() -> None:
    refusal = band_of([2.0, 2.0]).refusal
    assert refusal is not None and "only 2 calibration" in refusal


def test_a_calibration_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        band_of([2.0, 0.0, 2.0])


# -- the engine's saturated throughput and the VOID rule ---------------------------------------------


def execution(eid: int, fate: runlog.Fate, finished_s: float | None = None,
              abort_s: float | None = None) -> ExecutionRecord:
    return ExecutionRecord(execution_id=eid, call_index=eid, attempt_no=0, created_s=0.0, accepted_s=0.0,
                           refused_s=None, first_scheduled_s=None, first_token_s=None, finished_s=finished_s,
                           abort_requested_s=abort_s, aborted_s=None, fate=fate, prompt_tokens=100)


def log_of(waiting: list[int], executions: list[ExecutionRecord],
           attempts: list[AttemptRecord] | None = None) -> RunLog:
    samples = QueueSamples()
    samples.engine_waiting.extend(waiting)
    return RunLog(meta={}, calls=[], attempts=attempts or [], executions=executions, samples=samples,
                  end_s=float(len(waiting)))


def test_saturated_throughput_counts_completions_only_while_the_engine_queue_is_not_empty() -> None:
    # seconds 0-1 idle, 2-5 saturated, 6 idle
    executions = [execution(0, runlog.FATE_COMPLETED, 0.5),  # idle second: not counted
                  execution(1, runlog.FATE_COMPLETED, 2.2), execution(2, runlog.FATE_ORPHANED, 3.9),
                  execution(3, runlog.FATE_COMPLETED, 5.0), execution(4, runlog.FATE_COMPLETED, 6.1),
                  execution(5, runlog.FATE_CANCELLED, abort_s=4.0)]
    t = saturated_throughput(log_of([0, 0, 3, 4, 5, 2, 0], executions))
    assert (t.saturated_s, t.completions, t.cancelled) == (4, 3, 1)
    assert t.per_s == 0.75 and t.cancelled_share == 0.25


def test_a_run_that_never_queued_has_no_throughput() -> None:
    assert saturated_throughput(log_of([0, 0, 0], [execution(0, runlog.FATE_COMPLETED, 1.0)])).per_s is None


def tput(per_s: float, saturated_s: int = 100, cancelled: int = 0) -> SaturatedThroughput:
    return SaturatedThroughput(saturated_s=saturated_s, completions=round(per_s * saturated_s), cancelled=cancelled,
                               per_s=per_s)


def test_an_engine_more_than_ten_percent_slow_makes_the_run_void() -> None:
    check = capacity_check({"run": tput(2.0), "probe after": tput(1.78)}, capacity=2.0)  # probe 11% slow
    assert check.status == "void" and "probe after" in check.reason and "-11.0%" in check.reason


def test_an_engine_within_ten_percent_is_ok() -> None:
    check = capacity_check({"run": tput(2.15), "probe after": tput(1.85)}, capacity=2.0)
    assert check.status == "ok", check.reason


def test_a_run_whose_engine_exits_were_mostly_cancellations_does_not_measure_speed() -> None:
    # completions far below C-hat because cancelled executions took the engine's time: not a slow engine
    check = capacity_check({"run": tput(0.5, cancelled=400)}, capacity=2.0)
    assert check.status == "unchecked" and "cancellations" in str(check.measurements[0]["why_not"])


def test_a_short_saturation_does_not_measure_speed() -> None:
    check = capacity_check({"run": tput(1.0, saturated_s=10)}, capacity=2.0)
    assert check.status == "unchecked" and "10 s" in str(check.measurements[0]["why_not"])


# -- agreement across the capacity band --------------------------------------------------------------


def test_recovery_is_asserted_only_where_the_simulator_agrees_with_itself_across_the_band() -> None:
    assert recovery_verdict(True, True, True).verdict == "agree"
    assert recovery_verdict(False, True, True).verdict == "disagree"
    sensitive = recovery_verdict(False, False, True)
    assert sensitive.verdict == "not asserted" and "one end" in sensitive.reason


def test_hold_delivered_within_fifteen_points_of_the_band() -> None:
    assert points_verdict("hold", 80.0, 90.0, 100.0, 15).verdict == "agree"  # 10 points below the band
    assert points_verdict("hold", 70.0, 90.0, 100.0, 15).verdict == "disagree"  # 20 points below
    assert points_verdict("hold", 70.0, 40.0, 100.0, 15).verdict == "not asserted"  # the band spans 60 points


def test_completion_rate_within_twenty_percent_of_the_band() -> None:
    assert relative_verdict("completed_x", 0.85, 0.95, 1.0, 0.2).verdict == "agree"  # 10.5% below 0.95
    assert relative_verdict("completed_x", 0.0026, 0.30, 0.31, 0.2).verdict == "disagree"  # a collapse vs not
    assert relative_verdict("completed_x", 0.5, 0.3, 0.9, 0.2).verdict == "not asserted"


def band(refusal: str | None = None) -> Band:
    return Band(chats=(2.0, 2.05, 2.1), mean=2.05, low=2.0, high=2.1, spread=0.049, refusal=refusal)


OK = CapacityCheck(status="ok", reason="within", measurements=())
SIM: TargetMetrics = {"recovered": True, "hold_delivered_pct": 95.0, "completed_x": 0.9}


def test_a_condition_agrees_when_every_asserted_target_is_met() -> None:
    live: TargetMetrics = {"recovered": True, "hold_delivered_pct": 85.0, "completed_x": 0.8}
    verdict = compare_condition("coalescing", live, SIM, SIM, band=band(), capacity=OK)
    assert verdict.status == "agree", verdict.reason


def test_a_condition_disagrees_and_names_the_target_missed() -> None:
    live: TargetMetrics = {"recovered": False, "hold_delivered_pct": 25.4, "completed_x": 0.55}
    verdict = compare_condition("coalescing", live, SIM, SIM, band=band(), capacity=OK)
    assert verdict.status == "disagree" and "recovered" in verdict.reason and "hold_delivered_pct" in verdict.reason


def test_a_void_run_is_neither_agreement_nor_disagreement() -> None:
    live: TargetMetrics = {"recovered": False, "hold_delivered_pct": 25.4, "completed_x": 0.55}
    void = CapacityCheck(status="void", reason="the engine ran -20.0% off", measurements=())
    verdict = compare_condition("coalescing", live, SIM, SIM, band=band(), capacity=void)
    assert verdict.status == "void" and verdict.reason == "the engine ran -20.0% off"


def test_a_refused_band_refuses_every_condition() -> None:
    verdict = compare_condition("coalescing", SIM, SIM, SIM, band=band("the engine's speed drifted"), capacity=OK)
    assert verdict.status == "refused" and "drifted" in verdict.reason


def test_nothing_is_asserted_where_the_simulator_changes_across_the_band_on_every_target() -> None:
    low: TargetMetrics = {"recovered": False, "hold_delivered_pct": 30.0, "completed_x": 0.3}
    verdict = compare_condition("retry-budget", SIM, low, SIM, band=band(), capacity=OK)
    assert verdict.status == "not asserted"


# -- the capacity curve ------------------------------------------------------------------------------


def test_a_stage_point_counts_completions_in_the_stage_and_the_median_ttft_of_its_attempts() -> None:
    attempts = [AttemptRecord(call_index=i, attempt_no=0, sent_s=float(i), first_token_s=i + ttft,
                              ended_s=i + 1.0, outcome=runlog.COMPLETED, execution_id=i)
                for i, ttft in enumerate((0.1, 0.2, 0.4))]
    executions = [execution(0, runlog.FATE_COMPLETED, 1.0),  # in the warm-up (the first 4 s of 12)
                  execution(1, runlog.FATE_COMPLETED, 5.0), execution(2, runlog.FATE_ORPHANED, 6.0),
                  execution(3, runlog.FATE_COMPLETED, 13.0)]  # after the 12-s stage
    point = stage_point(log_of([0] * 14, executions, attempts), load_x=1.0, rate=0.3, stage_s=12.0)
    assert point.completions_per_s == 0.25 and point.median_ttft_s == pytest.approx(0.2)


def running_log(running: list[int], finished: list[float]) -> RunLog:
    log = log_of([0] * len(running), [execution(i, runlog.FATE_COMPLETED, t) for i, t in enumerate(finished)])
    log.samples.engine_running.extend(running)
    return log


def test_the_sustained_rate_starts_once_the_running_batch_has_stopped_growing() -> None:
    # The batch grows by 10 a second for 20 s, then holds at 200 for 40 s; 30 completions in the
    # growth, 80 on the plateau (2/s), none after the 60-s stage.
    running = [10 * (i + 1) for i in range(20)] + [200] * 40
    finished = [0.5 * i for i in range(30)] + [20 + 0.5 * i for i in range(80)] + [61.0]
    sustained = sustained_rate(running_log(running, finished), stage_s=60)
    # the 10-s mean first reaches 90% of 200 at 23 s (mean of 14..23 s: 180+...): the plateau
    assert sustained.from_s == 23 and sustained.running == 200
    assert sustained.per_s == pytest.approx(sum(1 for t in finished if 23 <= t < 60) / 37)
    assert sustained.why_not is None


def test_a_batch_that_fluctuates_around_its_level_is_sustained_from_early_on() -> None:
    running = [0, 2, 4, 6] + [8, 12, 9, 11, 10, 7, 13, 10] * 7
    sustained = sustained_rate(running_log(running, [float(t) for t in range(60)]), stage_s=60)
    assert sustained.from_s is not None and sustained.from_s <= 12 and sustained.per_s == pytest.approx(1.0)


def test_a_batch_that_grows_until_the_stage_ends_has_no_sustained_rate() -> None:
    running = list(range(1, 61))
    sustained = sustained_rate(running_log(running, [30.0]), stage_s=60)
    assert sustained.per_s is None and sustained.why_not is not None and "grew until" in sustained.why_not


def test_the_prefix_cache_delta_is_the_growth_of_vllms_two_counters() -> None:
    before = {"vllm:prefix_cache_queries_total": 1000.0, "vllm:prefix_cache_hits_total": 100.0}
    after = {"vllm:prefix_cache_queries_total": 5000.0, "vllm:prefix_cache_hits_total": 1100.0}
    delta = prefix_cache_delta(before, after)
    assert (delta.queries, delta.hits, delta.hit_pct) == (4000, 1000, 25.0)
    assert prefix_cache_delta({}, {}).hit_pct is None
