"""run_many's pool: calibration as pool tasks, written where calibration_for reads it; long runs first."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest

from retrybench import runner
from retrybench.spec import RunSpec


def test_long_runs_are_submitted_first() -> None:
    specs = [RunSpec(model="m", condition="c", seed=1),
             RunSpec(model="m", condition="c", seed=1, trace=True),
             RunSpec(model="m", condition="c", seed=1, trace=True, max_batched_tokens=2048)]
    assert sorted(specs, key=runner._expected_cost) == [specs[2], specs[1], specs[0]]


def test_pool_writes_the_calibration_calibration_for_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's record lands where calibration_for looks, so no run calibrates again."""
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(runner, "CALIBRATION_SEEDS", 1)
    monkeypatch.setattr(runner, "_calibrate_seed", _fake_seed)
    runner._calibrate_in_pool(_Inline(), [("qwen3-14b", "h100", False)])
    monkeypatch.setattr(runner, "calibrate_repeated", _forbidden)
    assert runner.calibration_for("qwen3-14b")["chat"] == pytest.approx(1.25)


class _Inline(Executor):
    """Runs each task at once, in this process."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def _fake_seed(model: str, gpu: str, mixed_prompts: bool, seed: int) -> object:
    stage = type("Stage", (), {"median_ttft_s": 0.1, "median_e2e_s": 1.0, "rate_calls_per_s": 1.25,
                               "growth_per_s": 0.2})()
    fake = type("Fake", (), {"chat_calls_per_s": 1.25, "stage_near": lambda self, rate: stage,
                             "saturated": stage, "stages": ()})()
    return fake


def _forbidden(*args: object, **kwargs: object) -> None:
    raise AssertionError("calibration_for calibrated again")
