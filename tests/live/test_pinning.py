"""The CPU plan that keeps the real engine and the harness apart, and the harness's CPU share
(realvllm/pinning.py): pure decisions on given CPU sets and CPU-time samples."""

from __future__ import annotations

import pytest

from retrybench.realvllm.pinning import CpuSample, HarnessMeter, cpu_pct, pinning_plan


def test_on_two_cpus_the_engine_gets_the_first_and_the_harness_the_second() -> None:
    plan = pinning_plan({0, 1})
    assert plan.engine_cpus == frozenset({0}) and plan.harness_cpus == frozenset({1})
    assert plan.engine_env() == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in plan.engine_env()  # read by vLLM only with "auto"


def test_on_more_cpus_the_rest_stay_unused_and_the_plan_says_so() -> None:
    plan = pinning_plan({3, 5, 7, 9})  # a cpuset need not start at 0
    assert plan.engine_cpus == frozenset({3}) and plan.harness_cpus == frozenset({5})
    assert "7, 9 unused" in plan.note


def test_on_one_cpu_nothing_is_pinned_and_the_plan_says_why() -> None:
    plan = pinning_plan({2})
    assert not plan.pinned and plan.engine_cpus is None and plan.harness_cpus is None
    assert plan.engine_env() == {} and "only CPU 2" in plan.note


def test_no_cpu_is_an_error() -> None:
    with pytest.raises(ValueError, match="no CPU"):
        pinning_plan(set())


def test_harness_cpu_is_a_percentage_of_one_core() -> None:
    assert cpu_pct(CpuSample(wall_s=10.0, cpu_s=1.0), CpuSample(wall_s=20.0, cpu_s=3.5)) == 25.0
    assert cpu_pct(CpuSample(wall_s=0.0, cpu_s=0.0), CpuSample(wall_s=1.0, cpu_s=2.0)) == 200.0  # two cores busy


def test_harness_cpu_needs_the_end_after_the_start() -> None:
    with pytest.raises(ValueError, match="apart"):
        cpu_pct(CpuSample(wall_s=5.0, cpu_s=0.0), CpuSample(wall_s=5.0, cpu_s=0.0))


def test_the_meter_reads_only_inside_its_block() -> None:
    meter = HarnessMeter()
    with pytest.raises(RuntimeError, match="inside"):
        _ = meter.pct
