"""Simulator speed (pytest-benchmark): one paper run, Qwen2.5-7B-Instruct, retries and
cancellation on, after the 2.7 C-hat pulse, beside the same run with cancellation off.

Run on its own: pytest benchmarks/perf -p no:xdist --benchmark-only
"""

from __future__ import annotations

from typing import Any

import pytest

from retrybench.runner import RunSpec, calibration_for, simulate_spec

MODEL = "qwen2.5-7b-instruct"


@pytest.fixture(scope="module")
def chat() -> float:
    return float(calibration_for(MODEL)["chat"])


@pytest.mark.parametrize("condition", ["retries-on-cancel-on", "retries-on-cancel-off", "retries-off-cancel-off"])
def test_one_paper_run(benchmark: Any, chat: float, condition: str) -> None:
    spec = RunSpec(model=MODEL, condition=condition, seed=1, pulse_x=2.7)
    log = benchmark.pedantic(simulate_spec, args=(spec, chat), rounds=3, iterations=1, warmup_rounds=1)
    assert log.calls and all(c.delivered_s is not None or c.failed_s is not None for c in log.calls)
