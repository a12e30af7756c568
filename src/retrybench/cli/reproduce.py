"""`retrybench reproduce`: every block of Table 1 and beyond, the boundary maps, then the HTML report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from retrybench.cli.display import console, progress, show
from retrybench.cli.options import (
    CommaList,
    Command,
    engine_option,
    flat,
    gpu_option,
    jobs_option,
    json_option,
    option,
    out_option,
    renamed,
    runs_option,
)

if TYPE_CHECKING:
    from retrybench.plan.engine_choice import EngineChoice
    from retrybench.plan.spec import RunSpec
    from retrybench.records.results import Result
    from retrybench.sweep.reproduce import Computed

__all__ = ["reproduce"]

PAPER_GPUS = ("h100", "h200")  # the GPUs the paper's models have fitted profiles for


@click.command(cls=Command, retired=[renamed("model", "--models"), renamed("block", "--blocks")])
@engine_option("sim", help="sim (the simulated engine, in parallel on every core), or the base URL of a running "
                           "OpenAI-compatible engine: each run then goes live through the proxy, in real time "
                           "(947+ s), one at a time.")
@gpu_option(type=click.Choice(PAPER_GPUS))
@option("model", "models", type=CommaList(), multiple=True, callback=flat, metavar="MODEL[,MODEL...]",
        help="The paper's models to run, repeated or comma-separated (default: all three of them).")
@runs_option("paper (the paper's run counts: 137 runs) or N runs of every block on every model.")
@out_option("Where the report (index.html) and each run's summary JSON go.", default=Path("retrybench-report"),
            show_default=True)
@jobs_option()
@click.option("--unseen-seeds", is_flag=True,
              help="Also replay every block on the ten unseen seeds (101-110; about 550 more simulations) and "
                   "report, per claim and model, on how many of them it held.")
@json_option("Print one JSON object instead of the verdict table: the run results (runs), every paper figure "
             "scored (scores) and, with --unseen-seeds, the robustness table (robustness). The report is "
             "written all the same.")
@click.option("--real-engine", "real_engine", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="A compare-real-engine result for the report's Real engine section "
                                 "(default: OUT/real-engine.json when there).")
@option("block", "blocks", type=CommaList(), multiple=True, callback=flat, default=("all",), show_default=True,
        metavar="BLOCK[,BLOCK...]",
        help="Blocks, repeated or comma-separated: block names (`retrybench block --help` lists them); table1: Table "
             "1's alone; all: Table 1's and those beyond the paper but replicas (216 runs, 4-5 min on 2 cores: add "
             "it by name, e.g. all,replicas); boundaries: the boundary maps beyond the paper (part of all).")
@click.option("--no-boundaries", is_flag=True,
              help="Skip the boundary maps (critical pulse per condition and model, deferral W x pulse, engine "
                   "cap Q x pulse; a few hundred bisection runs) that --block all computes.")
def reproduce(engine: EngineChoice, gpu: str, models: tuple[str, ...], runs: int | None, out: Path, jobs: int | None,
              unseen_seeds: bool, as_json: bool, real_engine: Path | None, blocks: tuple[str, ...],
              no_boundaries: bool) -> None:
    """Every block of Table 1 (the paper's 137 runs by default), then the HTML reproducibility report:
    per finding the paper's claim and figures, this run's, and a verdict. Resumable: results are cached
    by spec and code version, so an interrupted reproduction picks up where it stopped; Ctrl-C stops the
    runs, says how many are cached and exits with status 130."""
    from retrybench.plan.blocks import DEFAULT_BLOCKS, PAPER_MODELS, TABLE1, blocks_plan, unseen_seeds_plan

    chosen = list(models) or list(PAPER_MODELS)
    unknown = [m for m in chosen if m not in PAPER_MODELS]
    if unknown:
        raise click.UsageError(f"unknown model(s) {', '.join(unknown)}; the paper's: {', '.join(PAPER_MODELS)}")
    blocks_text = ",".join(blocks)
    named = {"all": list(DEFAULT_BLOCKS), "table1": list(TABLE1)}
    names = [n for part in blocks_text.split(",") if (b := part.strip()) for n in named.get(b, [b])]
    boundaries = chosen if _boundaries_wanted(blocks_text, no_boundaries, engine) else None
    names = [n for n in names if n != "boundaries"]  # sweep.reproduce.BOUNDARIES: maps, not a block
    try:
        plan = blocks_plan(names, chosen, gpu, runs)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    if unseen_seeds and engine.live:
        raise click.UsageError("--unseen-seeds runs on the simulated engine only (550 more runs)")
    unseen_plan = unseen_seeds_plan(chosen, gpu) if unseen_seeds else None
    finished: set[RunSpec] = set()
    try:
        _reproduce(plan, unseen_plan, finished, engine=engine, jobs=jobs, runs=runs, out=out, as_json=as_json,
                   real_engine=real_engine, boundaries=boundaries, gpu=gpu)
    except KeyboardInterrupt:
        _interrupted([*plan, *(unseen_plan or [])], finished, engine)


def _run_plan(plan: list[tuple[str, RunSpec]], jobs: int | None, engine: EngineChoice,
              finished: set[RunSpec]) -> list[Result]:
    """Each distinct spec once (blocks share runs), in parallel on the simulator or one at a time live,
    with a progress display counted in block runs: done of total, current block, elapsed, ETA. Adds each
    spec whose run succeeded (and so is cached) to `finished`."""
    from retrybench.records.results import is_failed
    from retrybench.runs.runner import run_is_cached, run_many, run_many_live

    unique: dict[RunSpec, list[str]] = {}
    for name, spec in plan:
        unique.setdefault(spec, []).append(name)
    specs = list(unique)
    if not engine.live:
        cached = sum(run_is_cached(spec) for spec in specs)
        console().print(f"{len(specs)} distinct runs: {cached} cached, {len(specs) - cached} to compute")
    with progress() as shown:
        task = shown.add_task("starting", total=len(plan))

        def advance(spec: RunSpec, result: Result) -> None:
            blocks = unique[spec]
            shown.update(task, advance=len(blocks), description=f"block {blocks[0]}")
            if is_failed(result):
                console().print(f"[red]run failed[/red] {', '.join(blocks)}: {spec}: {result['error']}")
            else:
                finished.add(spec)

        if not engine.live:
            return run_many(specs, jobs=jobs, progress=advance)
        return run_many_live(specs, engine, progress=advance)


def _interrupted(plan: list[tuple[str, RunSpec]], finished: set[RunSpec], engine: EngineChoice) -> NoReturn:
    """Ctrl-C: the workers are stopped by now; say how many runs are cached and how to resume, exit 130.
    On the simulator the cache itself is counted, which also holds the runs of earlier attempts."""
    from retrybench.runs.runner import run_is_cached

    specs = {spec for _, spec in plan}
    done = len(finished) if engine.live else sum(run_is_cached(spec) for spec in specs)
    console().print(f"interrupted: {done} of {len(specs)} distinct runs finished and are cached; run the same "
                    "command again to resume from there", soft_wrap=True)
    sys.exit(130)


def _reproduce(plan: list[tuple[str, RunSpec]], unseen_plan: list[tuple[str, RunSpec]] | None,
               finished: set[RunSpec], *, engine: EngineChoice, jobs: int | None, runs: int | None, out: Path,
               as_json: bool, real_engine: Path | None, boundaries: list[str] | None = None,
               gpu: str = "h100") -> None:
    """reproduce's work once its options are checked: the runs, the boundary maps on `boundaries`' models
    (None: none), then the report."""
    import time

    from retrybench.records.results import is_failed

    started = time.perf_counter()
    results = _run_plan(plan, jobs, engine, finished)
    unseen = _run_plan(unseen_plan, jobs, engine, finished) if unseen_plan is not None else None
    maps = _boundary_maps(boundaries, gpu, jobs) if boundaries is not None else None
    wall_s = time.perf_counter() - started
    command = " ".join(["retrybench", *sys.argv[1:]])
    try:
        from retrybench.report import build_context, write_report
        from retrybench.report.meta import gather
    except ImportError as error:  # jinja2 or matplotlib missing
        console().print(f"[yellow]no HTML report[/yellow] ({error}); pip install jinja2 matplotlib for it")
        show(results, as_json)
        return
    label = f"live engine at {engine}" if engine.live else "simulated vLLM-V1 engine (virtual time)"
    meta = {**gather(engine=label, wall_s=wall_s, command=command), "chat_at_steps": _chat_at_2k(plan, engine)}
    context = build_context(results, meta, runs=runs, unseen=unseen)
    context["real_engine"] = _real_engine_section(real_engine, out)
    if maps is not None:
        from retrybench.report.boundaries import boundaries_section

        context["boundaries"] = boundaries_section(maps.maps, wall_s=maps.wall_s, results=results)
        console().print(f"boundaries: {maps.runs} distinct runs ({maps.cached} cached) in {maps.wall_s:.0f} s")
    page = write_report(out, context, results)
    if as_json:
        click.echo(json.dumps({"runs": results, "scores": context["scores"], "robustness": context["robustness"]}))
    else:
        _print_verdicts(context)
    console().print(f"{len(plan)} runs ({len(results)} distinct) in {wall_s:.0f} s; report: {page}")
    maps_failed = maps is not None and context["boundaries"]["failed"] > 0
    if any(is_failed(r) for r in [*results, *(unseen or [])]) or maps_failed:
        sys.exit(1)


def _boundaries_wanted(blocks_text: str, no_boundaries: bool, engine: EngineChoice) -> bool:
    """Whether to compute the boundary maps: with --block all or boundaries, on the simulated engine."""
    from retrybench.sweep.reproduce import BOUNDARIES, wanted

    if not wanted(blocks_text, no_boundaries):
        return False
    if engine.live:
        if BOUNDARIES in {part.strip() for part in blocks_text.split(",")}:
            raise click.UsageError("the boundary maps run on the simulated engine only")
        console().print("boundary maps skipped: they run on the simulated engine only")
        return False
    return True


def _boundary_maps(models: list[str], gpu: str, jobs: int | None) -> Computed | None:
    """The boundary maps, or None where the report's packages are missing."""
    try:
        from retrybench.sweep.reproduce import compute_boundaries
    except ImportError as error:  # jinja2 or matplotlib: no report to show them in
        console().print(f"[yellow]no boundary maps[/yellow] ({error})")
        return None
    return compute_boundaries(models, gpu, jobs, progress(), console())


def _real_engine_section(given: Path | None, out: Path) -> dict[str, Any] | None:
    """The report's Real engine section from `given`, else OUT/real-engine.json if there, else none."""
    from retrybench.report.real_engine import RESULT_FILE, real_engine_section

    path = given if given is not None else out / RESULT_FILE
    if not path.is_file():
        return None
    return real_engine_section(json.loads(path.read_text()))


def _chat_at_2k(plan: list[tuple[str, RunSpec]], engine: EngineChoice) -> list[dict[str, Any]]:
    """C-hat of the tracing block's builds calibrated at 2,048-token steps, beside the 8,192-token C-hat
    its runs use (the simulated engine only; the paper calibrated at 8,192 only)."""
    from retrybench.runs.runner import calibration_at_steps, calibration_for

    if engine.live:
        return []
    builds = sorted({(s.model, s.gpu) for name, s in plan if name == "tracing"})
    return [{"model": model, "gpu": gpu, "max_batched_tokens": 2048,
             "chat": calibration_at_steps(model, gpu, 2048)["chat"], "chat_8192": calibration_for(model, gpu)["chat"]}
            for model, gpu in builds]


def _print_verdicts(context: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table("finding", "verdict", "checks held", "paper figures: within / near / off", title="reproduction")
    for row in context["summary"]:
        scores = row["scores"]
        table.add_row(row["title"], row["verdict"], f"{row['passed']} of {row['checks']}",
                      f"{scores['within']} / {scores['near']} / {scores['off']}")
    console().print(table)
    total = context["scores"]["tally"]
    console().print(f"paper figures: {total['within']} of {total['scored']} within the paper's band, "
                    f"{total['near']} near, {total['off']} off")
    if context["robustness"] is not None:
        weak = [f"{r['claim']} on {r['model']} ({r['held']} of {r['evaluated']})"
                for r in context["robustness"]["rows"] if r["robust"] == "not robust"]
        listed = ": " + "; ".join(weak) if weak else ""
        console().print(f"unseen seeds: {len(weak)} claim-model pairs not robust{listed}")
