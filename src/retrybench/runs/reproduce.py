"""`retrybench reproduce` as a service: Table 1's blocks (and the unseen seeds, the runs at the other
engine speeds of each verdict's margin, and the boundary maps) planned, run on any executor through the
result cache, and turned into the HTML report.

`plan_reproduction` checks a request before any run (ReproduceError: a usage error); `reproduce` runs it
and returns what the command prints. Ctrl-C stops the runs and raises Interrupted, which says how many
are cached and how to resume: a rerun of the same request computes only what is missing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from retrybench.calibration.store import calibration_at_steps, calibration_for
from retrybench.plan.blocks import DEFAULT_BLOCKS, PAPER_MODELS, TABLE1, block_specs, blocks_plan, unseen_seeds_plan
from retrybench.plan.engine_choice import EngineChoice, parse_engine
from retrybench.plan.spec import RunSpec
from retrybench.plan.speeds import side_speeds, speed_label
from retrybench.records.results import Result, is_failed
from retrybench.runs.display import Display, SilentDisplay
from retrybench.runs.executors import Executor, Interrupted, make_executor, run_specs
from retrybench.runs.ray import RayMissing
from retrybench.runs.store import run_is_cached
from retrybench.sweep.reproduce import BOUNDARIES, Computed, compute_maps, wanted

if TYPE_CHECKING:
    from retrybench.report.meta import StepsCalibration
    from retrybench.report.real_engine import RealEngineSection
    from retrybench.report.sections import ReportContext

__all__ = ["Interrupted", "ReproduceError", "ReproduceOutcome", "ReproducePlan", "ReproduceRequest", "executor_for",
           "plan_reproduction", "reproduce", "run_block"]

BlockPlan = list[tuple[str, RunSpec]]  # (block, spec) in Table 1's order; blocks share runs


class ReproduceError(ValueError):
    """A request that cannot run (an unknown model or block, a live engine asked for the simulator's work)."""


@dataclass(frozen=True)
class ReproduceRequest:
    """What `retrybench reproduce` was asked: the models, the blocks (`all`, `table1`, names and
    `boundaries`, comma-separated), the runs per block (None: the paper's), whether to run the blocks at
    the margin's other engine speeds (None: only when all of those runs are cached), where the runs go
    (`engine` sim: `executor` local or ray; else live, one after another) and where the report goes."""

    out: Path
    models: tuple[str, ...] = PAPER_MODELS
    gpu: str = "h100"
    blocks: str = "all"
    runs: int | None = None
    unseen_seeds: bool = False
    boundaries: bool = True
    margins: bool | None = None
    engine: EngineChoice = field(default_factory=lambda: parse_engine("sim"))
    executor: str = "local"
    jobs: int | None = None
    address: str | None = None
    real_engine: Path | None = None
    command: str = "retrybench reproduce"


@dataclass(frozen=True)
class ReproducePlan:
    """A checked request: the block runs, the unseen seeds' (None: not asked), the block runs at the
    margin's other engine speeds (None: no margins), the models of the boundary maps (None: none) and what
    was left out, in words."""

    request: ReproduceRequest
    blocks: BlockPlan
    unseen: BlockPlan | None
    boundaries: tuple[str, ...] | None
    notes: tuple[str, ...] = ()
    margins: BlockPlan | None = None

    def specs(self) -> set[RunSpec]:
        return {spec for _, spec in [*self.blocks, *(self.unseen or []), *(self.margins or [])]}


@dataclass
class ReproduceOutcome:
    """What a reproduction gives the command to print: the runs' results (one per distinct spec), the
    report's context and page (None where jinja2 or matplotlib is missing), the maps, the wall time (and
    the part of it the margins' runs took)."""

    plan: ReproducePlan
    results: list[Result]
    unseen: list[Result] | None
    maps: Computed | None
    wall_s: float
    context: ReportContext | None = None
    page: Path | None = None
    at_speeds: list[Result] | None = None
    margins_s: float = 0.0

    @property
    def failed(self) -> bool:
        """Whether a run or a map's run failed (the command exits 1)."""
        section = self.context.get("boundaries") if self.context is not None else None
        maps_failed = section is not None and section["failed"] > 0
        runs = [*self.results, *(self.unseen or []), *(self.at_speeds or [])]
        return any(is_failed(r) for r in runs) or maps_failed

    def json_output(self) -> dict[str, object]:
        """`reproduce --json`: the run results, every paper figure scored, the robustness table and each
        claim's margin on each model (None where margins were not run)."""
        if self.context is None:
            return {"runs": self.results}
        return {"runs": self.results, "scores": self.context["scores"], "robustness": self.context["robustness"],
                "margins": self.context.get("margins")}


def plan_reproduction(request: ReproduceRequest) -> ReproducePlan:
    """The runs a request needs, every option checked before any run."""
    unknown = [m for m in request.models if m not in PAPER_MODELS]
    if unknown:
        raise ReproduceError(f"unknown model(s) {', '.join(unknown)}; the paper's: {', '.join(PAPER_MODELS)}")
    models = list(request.models)
    named = {"all": list(DEFAULT_BLOCKS), "table1": list(TABLE1)}
    names = [n for part in request.blocks.split(",") if (b := part.strip()) for n in named.get(b, [b])]
    names = [n for n in names if n != BOUNDARIES]  # maps, not a block
    notes: list[str] = []
    boundaries = tuple(models) if wanted(request.blocks, not request.boundaries) else None
    if boundaries is not None and request.engine.live:
        if BOUNDARIES in {part.strip() for part in request.blocks.split(",")}:
            raise ReproduceError("the boundary maps run on the simulated engine only")
        notes.append("boundary maps skipped: they run on the simulated engine only")
        boundaries = None
    try:
        blocks = blocks_plan(names, models, request.gpu, request.runs)
    except ValueError as error:
        raise ReproduceError(str(error)) from error
    if request.unseen_seeds and request.engine.live:
        raise ReproduceError("--unseen-seeds runs on the simulated engine only (550 more runs)")
    unseen = unseen_seeds_plan(models, request.gpu) if request.unseen_seeds else None
    margins = _margins_plan(request, blocks, notes)
    return ReproducePlan(request, blocks, unseen, boundaries, tuple(notes), margins)


def _margins_plan(request: ReproduceRequest, blocks: BlockPlan, notes: list[str]) -> BlockPlan | None:
    """Table 1's block runs at each other engine speed of the margin: asked (True), refused (False), or by
    default only when every one of them is cached (a note says how to run the rest)."""
    if request.margins is False or not blocks:
        return None
    if request.engine.live:
        if request.margins:
            raise ReproduceError("--margins runs on the simulated engine only (the engine made faster and slower)")
        return None
    # The claims read Table 1's blocks only: the blocks beyond the paper have no verdict to hold.
    plan = [(name, replace(spec, engine_speed=speed)) for speed in side_speeds() for name, spec in blocks
            if name in TABLE1]
    if not plan:
        return None
    if request.margins is None:
        specs = {spec for _, spec in plan}
        cached = sum(run_is_cached(spec) for spec in specs)
        if cached < len(specs):
            notes.append(f"margins skipped: {cached} of {len(specs)} runs at engine speeds "
                         f"{', '.join(map(speed_label, side_speeds()))} cached; --margins runs the rest")
            return None
    return plan


def executor_for(request: ReproduceRequest) -> Executor:
    """The request's executor: local or ray on the simulator, else the live engine's; ReproduceError where
    the options do not go together or Ray is missing."""
    try:
        return make_executor(request.executor, jobs=request.jobs, address=request.address, engine=request.engine)
    except (ValueError, RayMissing) as error:
        raise ReproduceError(str(error)) from error


def _run_blocks(plan: BlockPlan, executor: Executor, live: bool, display: Display,
                finished: set[RunSpec]) -> list[Result]:
    """Each distinct spec once (blocks share runs), progress counted in block runs; adds each spec whose
    run succeeded (and so is cached) to `finished`."""
    unique: dict[RunSpec, list[str]] = {}
    for name, spec in plan:
        unique.setdefault(spec, []).append(name)
    specs = list(unique)
    if not live:
        cached = sum(run_is_cached(spec) for spec in specs)
        display.note(f"{len(specs)} distinct runs: {cached} cached, {len(specs) - cached} to compute")

    def advance(spec: RunSpec, result: Result) -> None:
        blocks = unique[spec]
        display.advance(len(blocks), f"block {blocks[0]}")
        if is_failed(result):
            display.failed(f"{', '.join(blocks)}: {spec}: {result['error']}")
        else:
            finished.add(spec)

    display.start("starting", len(plan))
    try:
        return executor.run(executor.plan(specs), advance)
    finally:
        display.stop()


def reproduce(plan: ReproducePlan, display: Display | None = None,
              executor: Executor | None = None) -> ReproduceOutcome:
    """Run a checked plan (on `executor`, default the request's), then write the report to the request's
    `out`. Raises Interrupted on Ctrl-C, ReproduceError where the executor cannot be made."""
    display = display or SilentDisplay()
    request = plan.request
    executor = executor or executor_for(request)
    for note in plan.notes:
        display.note(note)
    finished: set[RunSpec] = set()
    started = time.perf_counter()
    try:
        results = _run_blocks(plan.blocks, executor, request.engine.live, display, finished)
        unseen = _run_blocks(plan.unseen, executor, request.engine.live, display, finished) \
            if plan.unseen is not None else None
        margins_started = time.perf_counter()
        at_speeds = _run_blocks(plan.margins, executor, request.engine.live, display, finished) \
            if plan.margins is not None else None
        margins_s = time.perf_counter() - margins_started
        maps = compute_maps(plan.boundaries, request.gpu, executor, display) if plan.boundaries is not None else None
    except KeyboardInterrupt:
        specs = plan.specs()
        done = len(finished) if request.engine.live else sum(run_is_cached(spec) for spec in specs)
        raise Interrupted(done, len(specs)) from None
    finally:
        executor.close()
    outcome = ReproduceOutcome(plan, results, unseen, maps, time.perf_counter() - started, at_speeds=at_speeds,
                               margins_s=margins_s)
    _report(outcome, display)
    return outcome


def _report(outcome: ReproduceOutcome, display: Display) -> None:
    """The report's context and page, where jinja2 and matplotlib are installed."""
    try:
        from retrybench.report import build_context, write_report
        from retrybench.report.boundaries import boundaries_section
        from retrybench.report.meta import gather
    except ImportError as error:  # jinja2 or matplotlib missing
        display.note(f"no HTML report ({error}); pip install jinja2 matplotlib for it")
        return
    plan, request = outcome.plan, outcome.plan.request
    engine = request.engine
    label = f"live engine at {engine}" if engine.live else "simulated vLLM-V1 engine (virtual time)"
    meta = gather(engine=label, wall_s=outcome.wall_s, command=request.command)
    meta["chat_at_steps"] = _chat_at_2k(plan.blocks, engine)
    context = build_context(outcome.results, meta, runs=request.runs, unseen=outcome.unseen,
                            at_speeds=outcome.at_speeds)
    if outcome.at_speeds is not None:
        display.note(f"margins: {len(outcome.at_speeds)} distinct runs at engine speeds "
                     f"{', '.join(map(speed_label, side_speeds()))} in {outcome.margins_s:.0f} s")
    context["real_engine"] = _real_engine_section(request.real_engine, request.out)
    if outcome.maps is not None:
        maps = outcome.maps
        context["boundaries"] = boundaries_section(maps.maps, wall_s=maps.wall_s, results=outcome.results)
        display.note(f"boundaries: {maps.runs} distinct runs ({maps.cached} cached) in {maps.wall_s:.0f} s")
    outcome.context = context
    outcome.page = write_report(request.out, context, outcome.results)


def _real_engine_section(given: Path | None, out: Path) -> RealEngineSection | None:
    """The report's Real engine section from `given`, else OUT/real-engine.json if there, else none."""
    from retrybench.report.real_engine import RESULT_FILE, real_engine_section

    path = given if given is not None else out / RESULT_FILE
    if not path.is_file():
        return None
    return real_engine_section(json.loads(path.read_text()))


def _chat_at_2k(plan: BlockPlan, engine: EngineChoice) -> list[StepsCalibration]:
    """C-hat of the tracing block's builds calibrated at 2,048-token steps, beside the 8,192-token C-hat
    its runs use (the simulated engine only; the paper calibrated at 8,192 only)."""
    if engine.live:
        return []
    builds = sorted({(s.model, s.gpu) for name, s in plan if name == "tracing"})
    return [{"model": model, "gpu": gpu, "max_batched_tokens": 2048,
             "chat": calibration_at_steps(model, gpu, 2048)["chat"], "chat_8192": calibration_for(model, gpu)["chat"]}
            for model, gpu in builds]



def run_block(name: str, model: str, executor: Executor, *, runs: int | None = None, gpu: str = "h100",
              display: Display | None = None) -> list[Result]:
    """`retrybench block`: every condition of one Table 1 block for each of its runs (None: the paper's) on
    `executor`, which is closed at the end; ReproduceError for a block or model it does not have."""
    display = display or SilentDisplay()
    try:
        specs = block_specs(name, model, runs, gpu)
    except ValueError as error:
        raise ReproduceError(str(error)) from error

    def advance(spec: RunSpec, result: Result) -> None:
        display.advance(1, f"{name} on {model}")
        if is_failed(result):
            display.failed(f"{spec}: {result['error']}")

    display.start(f"{name} on {model}", len(specs))
    try:
        return run_specs(executor, specs, advance)
    finally:
        display.stop()
        executor.close()
