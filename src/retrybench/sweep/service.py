"""`retrybench sweep` as a service: the options as given -> a checked plan (SweepError before any run) ->
the runs on any executor (this machine's processes, Ray, or a live engine, one run after another) with
progress shown -> sweep.json and index.html, and the critical values in words.

Ctrl-C stops the runs (KeyboardInterrupt goes to the caller, INTERRUPTED says what to print): the
finished runs are cached, and the same sweep again computes only the rest.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

from retrybench.plan.engine_choice import EngineChoice
from retrybench.plan.recorded import WorkloadFields
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result, is_failed
from retrybench.runs.display import Display, SilentDisplay
from retrybench.runs.executors import Executor, make_executor
from retrybench.runs.live import LiveExecutor, live_refusal
from retrybench.runs.store import run_is_cached
from retrybench.sweep.axes import AxisError, parse_axes
from retrybench.sweep.output import SweepDocument, document, write_outputs
from retrybench.sweep.plan import PlanError, SweepPlan, check_specs, parse_conditions
from retrybench.sweep.run import SweepResult, describe, find_runs_bound, run_find, run_grid

__all__ = ["INTERRUPTED", "PlannedSweep", "SweepError", "SweepOutcome", "plan_sweep", "run_sweep", "sweep_executor"]

INTERRUPTED = "interrupted: the finished runs are cached; run the same command again to resume"


class SweepError(ValueError):
    """A sweep that cannot run: an axis, value, condition or executor refused (a usage error)."""


@dataclass(frozen=True)
class PlannedSweep:
    """A checked sweep: its plan, and the axis and resolution of its boundary search (None: a grid)."""

    plan: SweepPlan
    find: str | None = None
    resolution: Decimal | None = None
    until: str = "not-recovered"


@dataclass(frozen=True)
class SweepOutcome:
    """What a sweep gives the command to print."""

    result: SweepResult
    document: SweepDocument
    page: Path
    wall_s: float
    executor: str

    @property
    def failed(self) -> int:
        return self.result.failed

    def lines(self) -> list[str]:
        """The critical values per condition, then the sweep's size, time and page."""
        return [*describe(self.result), f"{len(self.result.rows)} runs in {self.wall_s:.1f} s ({self.executor}); "
                f"{self.failed} failed; page: {self.page}"]


def _resolution(text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        value = Decimal(0)
    if not value > 0:
        raise SweepError(f"--resolution must be a number > 0, got {text!r}")
    return value


def plan_sweep(*, conditions: str, axes: Sequence[str], seeds: Sequence[int], model: str, gpu: str = "h100",
               find: str | None = None, resolution: str | None = None,
               until: str = "not-recovered", recorded: WorkloadFields | None = None) -> PlannedSweep:
    """The sweep of `--condition`, `--axis` (each NAME=VALUES), `--seed` (the trace seeds), `--model`,
    `--gpu`, `--find`, `--resolution` and `--until` as given, over the recorded workload `recorded` (the
    fields of `--workload` and its options) when given: every axis, value and combination checked."""
    try:
        parsed = parse_axes(list(axes))
        if not parsed:
            raise AxisError("give at least one --axis NAME=VALUES")
        plan = SweepPlan(conditions=parse_conditions(conditions), axes=tuple(parsed),
                         seeds=tuple(seeds), model=model, gpu=gpu, recorded=recorded or WorkloadFields())
        step = _resolution(resolution)
        if find is not None:
            plan.find_grid(find, step)
        elif step is not None:
            raise SweepError("--resolution goes with --find")
        else:
            check_specs(p.spec for p in plan.points())
    except (AxisError, PlanError) as error:
        raise SweepError(str(error)) from error
    return PlannedSweep(plan, find, step, until)


def sweep_executor(name: str = "local", *, jobs: int | None = None, address: str | None = None,
                   engine: EngineChoice | None = None, time_scale: float = 1.0) -> Executor:
    """The executor of `--executor`, `--jobs`, `--address`, or of `--engine` (a live engine: engine-server
    or a running engine's URL) at `--time-scale`; SweepError where they do not go together or Ray is missing."""
    from retrybench.runs.ray import RayMissing

    try:
        return make_executor(name, jobs=jobs, address=address, engine=engine, time_scale=time_scale)
    except (ValueError, RayMissing) as error:
        raise SweepError(str(error)) from error


def _probes(sweep: PlannedSweep) -> list[RunSpec]:
    """Every spec the sweep may run: each point, or each grid value of a search along its axis in each cell."""
    plan, axis = sweep.plan, sweep.find
    if axis is None:
        return [p.spec for p in plan.points()]
    others = [a for a in plan.axes if a.name != axis]
    return [p.spec for value in plan.find_grid(axis, sweep.resolution) for p in plan.points(others, {axis: value})]


def _check_live(specs: Sequence[RunSpec]) -> None:
    """A live engine runs the paper's setup under each condition's own policies: refuse the rest up front."""
    for spec in specs:
        refusal = live_refusal(spec)
        if refusal is not None:
            raise SweepError(f"--engine: {refusal} (condition {spec.condition}: "
                             f"{', '.join(f'{n}={v}' for n, v in spec.overrides) or 'several replicas'})")


def run_sweep(sweep: PlannedSweep, executor: Executor, *, out: Path, command: str,
              display: Display | None = None) -> SweepOutcome:
    """Run the sweep on `executor`, write OUT/sweep.json and OUT/index.html. The executor is closed at the
    end; SweepError for a plan the engine refuses, before any run."""
    display = display or SilentDisplay()
    plan, find = sweep.plan, sweep.find
    live = isinstance(executor, LiveExecutor)
    try:
        if live:
            _check_live(_probes(sweep))
        if find is None:
            specs = [p.spec for p in plan.points()]
            if live:
                display.note(f"{len(specs)} runs live, one after another")
            else:
                cached = sum(run_is_cached(spec) for spec in specs)
                display.note(f"{len(specs)} runs: {cached} cached, {len(specs) - cached} to compute")
            total = len(specs)
        else:
            total = find_runs_bound(plan, find, sweep.resolution)
            display.note(f"boundary search along {find}: at most {total} runs")
        started = time.perf_counter()
        result = _run(sweep, executor, display, total)
    finally:
        executor.close()
    wall_s = time.perf_counter() - started
    doc = document(plan, result, command=command, executor=executor.name, wall_s=wall_s, find=find,
                   resolution=sweep.resolution)
    return SweepOutcome(result, doc, write_outputs(out, doc), wall_s, executor.name)


def _run(sweep: PlannedSweep, executor: Executor, display: Display, total: int) -> SweepResult:
    def advance(spec: RunSpec, result: Result) -> None:
        display.advance(1, f"{spec.condition} seed {spec.seed}")
        if is_failed(result):
            display.failed(f"{spec}: {result['error']}")

    display.start(f"sweep ({executor.name})", total)
    try:
        if sweep.find is None:
            return run_grid(sweep.plan, executor, sweep.until, advance)
        found = run_find(sweep.plan, sweep.find, sweep.resolution, executor, sweep.until, advance)
        display.stop(len(found.rows))
        return found
    except PlanError as error:
        raise SweepError(str(error)) from error
    finally:
        display.stop()

