"""The body of `retrybench sweep`: options -> plan (every error a usage error, before any run) -> runs
on the chosen executor with a progress display -> sweep.json and index.html, and the critical values."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress

from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result, is_failed
from retrybench.runs.runner import run_is_cached
from retrybench.sweep.axes import AxisError, parse_axes
from retrybench.sweep.executors import RayMissing, RunExecutor, make_executor
from retrybench.sweep.output import document, write_outputs
from retrybench.sweep.plan import PlanError, SweepPlan, check_specs, parse_conditions
from retrybench.sweep.run import SweepResult, describe, find_runs_bound, run_find, run_grid

__all__ = ["SweepOptions", "plan_of", "run_sweep"]


@dataclass(frozen=True)
class SweepOptions:
    """The command's options as given."""

    conditions: str
    axes: tuple[str, ...]
    seeds: tuple[int, ...]
    model: str
    gpu: str
    find: str | None
    until: str
    resolution: str | None
    out: Path
    executor: str
    address: str | None
    jobs: int | None
    command: str


def _resolution(text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        value = Decimal(0)
    if not value > 0:
        raise click.UsageError(f"--resolution must be a number > 0, got {text!r}")
    return value


def plan_of(options: SweepOptions) -> tuple[SweepPlan, Decimal | None]:
    """The plan and --find's resolution, every axis, value and combination checked (UsageError if not)."""
    try:
        axes = parse_axes(options.axes)
        if not axes:
            raise AxisError("give at least one --axis NAME=VALUES")
        plan = SweepPlan(conditions=parse_conditions(options.conditions), axes=tuple(axes),
                         seeds=options.seeds, model=options.model, gpu=options.gpu)
        resolution = _resolution(options.resolution)
        if options.find is not None:
            plan.find_grid(options.find, resolution)
        elif resolution is not None:
            raise click.UsageError("--resolution goes with --find")
        else:
            check_specs(p.spec for p in plan.points())
    except (AxisError, PlanError) as error:
        raise click.UsageError(str(error)) from error
    return plan, resolution


def run_sweep(options: SweepOptions, progress: Progress, console: Console) -> None:
    """Run the sweep, write its outputs, print its critical values; Ctrl-C exits 130 (runs done are cached)."""
    plan, resolution = plan_of(options)
    try:
        executor = make_executor(options.executor, jobs=options.jobs, address=options.address)
    except (ValueError, RayMissing) as error:
        raise click.UsageError(str(error)) from error
    if options.find is None:
        specs = [p.spec for p in plan.points()]
        cached = sum(run_is_cached(spec) for spec in specs)
        console.print(f"{len(specs)} runs: {cached} cached, {len(specs) - cached} to compute")
        total = len(specs)
    else:
        total = find_runs_bound(plan, options.find, resolution)
        console.print(f"boundary search along {options.find}: at most {total} runs")
    started = time.perf_counter()
    try:
        result = _run(plan, options, resolution, executor, progress, total, console)
    except KeyboardInterrupt:
        console.print("interrupted: the finished runs are cached; run the same command again to resume")
        sys.exit(130)
    except PlanError as error:
        raise click.UsageError(str(error)) from error
    finally:
        executor.close()
    wall_s = time.perf_counter() - started
    doc = document(plan, result, command=options.command, executor=executor.name, wall_s=wall_s, find=options.find,
                   resolution=resolution)
    page = write_outputs(options.out, doc)
    for line in describe(result):
        console.print(line, soft_wrap=True)
    failed = sum(1 for row in result.rows if row.get("error"))
    console.print(f"{len(result.rows)} runs in {wall_s:.1f} s ({executor.name}); {failed} failed; page: {page}")
    if failed:
        sys.exit(1)


def _run(plan: SweepPlan, options: SweepOptions, resolution: Decimal | None, executor: RunExecutor,
         progress: Progress, total: int, console: Console) -> SweepResult:
    with progress:
        task = progress.add_task(f"sweep ({executor.name})", total=total)

        def advance(spec: RunSpec, result: Result) -> None:
            progress.update(task, advance=1, description=f"{spec.condition} seed {spec.seed}")
            if is_failed(result):
                console.print(f"[red]run failed[/red] {spec}: {result['error']}")

        if options.find is None:
            return run_grid(plan, executor, options.until, advance)
        found = run_find(plan, options.find, resolution, executor, options.until, advance)
        progress.update(task, total=len(found.rows), completed=len(found.rows))
        return found
