"""The run service under the names the command line imports (runs/executors.py, plan.py, live.py,
store.py and calibration/ hold the code): remove once it calls those modules directly."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from retrybench.calibration.live import calibrate_engine as calibrate_one_live
from retrybench.calibration.store import calibration_at_steps, calibration_for, chat_for
from retrybench.plan.engine_choice import EngineChoice
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result
from retrybench.runs.executors import LocalExecutor, run_one, run_specs
from retrybench.runs.live import LiveExecutor, run_one_live
from retrybench.runs.simulate import run_traced as _run_traced
from retrybench.runs.store import live_workdir, run_is_cached

__all__ = ["calibrate_one_live", "calibration_at_steps", "calibration_for", "live_workdir", "run_is_cached",
           "run_many", "run_many_live", "run_one", "run_one_live", "run_traced"]


def run_many(specs: Iterable[RunSpec], jobs: int | None = None,
             progress: Callable[[RunSpec, Result], None] | None = None) -> list[Result]:
    """Results in the order of `specs` from the local executor (a process pool of `jobs`)."""
    return run_specs(LocalExecutor(jobs), list(specs), progress)


def run_many_live(specs: Iterable[RunSpec], engine: EngineChoice,
                  progress: Callable[[RunSpec, Result], None] | None = None) -> list[Result]:
    """Results in the order of `specs`, one live run after another on `engine`."""
    return run_specs(LiveExecutor(engine), list(specs), progress)


def run_traced(spec: RunSpec, trace_path: Path) -> dict[str, object]:
    """One traced run computed afresh at its build's C-hat, as `retrybench run --trace` prints it."""
    return _run_traced(spec, chat_for(spec), trace_path).record()
