"""The `retrybench` command line: calibrate, run, block, reproduce; the live stack (proxy, engine-server,
loadgen, make-trace); make-tiny-model (for a real vLLM on a CPU); doctor."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from retrybench import __version__
from retrybench.analysis.calibrate import STAGES
from retrybench.conditions.client_profiles import available_client_profiles, client_profile
from retrybench.conditions.config import ConfigError, available_conditions
from retrybench.control.router import ROUTER_POLICIES
from retrybench.engine.profiles import GPUS, MODELS
from retrybench.plan.blocks import (
    BLOCKS,
    DEFAULT_BLOCKS,
    PAPER_MODELS,
    TABLE1,
    block_specs,
    blocks_plan,
    unseen_seeds_plan,
)
from retrybench.plan.engine_choice import EngineChoice, EngineKind, parse_engine
from retrybench.plan.spec import RunSpec
from retrybench.records.results import Result, is_failed
from retrybench.runs.runner import (
    calibrate_one_live,
    calibration_at_steps,
    calibration_for,
    live_workdir,
    run_is_cached,
    run_many,
    run_many_live,
    run_one,
    run_one_live,
    run_traced,
)

if TYPE_CHECKING:
    from retrybench.sweep.reproduce import Computed

MODEL_CHOICE = click.Choice(sorted(MODELS))
GPU_CHOICE = click.Choice(sorted(GPUS))
console = Console(stderr=True)
TIME_SCALE_HELP = ("Wall seconds per model second: 1 is real time, 0.1 runs every clock, deadline and "
                   "policy timer ten times faster. Engine server, proxy and load generator must agree.")


def _engine(*allowed: EngineKind) -> Callable[[click.Context, click.Parameter, str], EngineChoice]:
    """The `--engine` callback of a command that drives `allowed`: the engine named, or a usage error."""
    def parse(ctx: click.Context, param: click.Parameter, value: str) -> EngineChoice:
        try:
            return parse_engine(value, allowed)
        except ValueError as error:
            raise click.BadParameter(str(error), ctx, param) from error

    return parse


SUMMARY_COLUMNS = ("recovered", "recovery_s", "hold_delivered_pct", "pulse_delivered_pct", "primary_timely_pct",
                   "created_x", "accepted_x", "completed_x", "retry_share_pct")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="retrybench")
def main() -> None:
    """Re-test 'Cancellation Is Not Enough' on a simulated vLLM-V1 engine (virtual time, CPU), or live
    through the overload-control proxy over real HTTP."""


@main.command()
@click.option("--model", type=MODEL_CHOICE, required=True)
@click.option("--gpu", type=GPU_CHOICE, default="h100", show_default=True)
@click.option("--mixed-prompts", is_flag=True, help="Half the calls get 3,000-token prompts (Section 4.2).")
@click.option("--no-cache", is_flag=True, help="Recompute even if a cached calibration exists.")
@click.option("--engine", default="sim", show_default=True, callback=_engine("sim"),
              help="sim, or the base URL of a running OpenAI-compatible engine (a real vLLM, say): the stages "
                   "then go to it live, through the proxy with cancellation off.")
@click.option("--time-scale", type=click.FloatRange(min=1e-3, max=1e3), default=1.0, show_default=True,
              help=TIME_SCALE_HELP + " Live only.")
@click.option("--token-scale", type=click.FloatRange(min=1e-3, max=1.0), default=1.0, show_default=True,
              help="Every prompt and reply length times this: the paper's workload for a slower engine.")
@click.option("--stages", type=click.IntRange(min=1, max=30), default=STAGES, show_default=True,
              help="Live only: stages to send at most (0.2 calls/s x 1.5^k); the first saturated one gives C-hat.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Live only: where the logs go (default: a new directory under the cache).")
def calibrate(model: str, gpu: str, mixed_prompts: bool, no_cache: bool, engine: EngineChoice, time_scale: float,
              token_scale: float, stages: int, workdir: Path | None) -> None:
    """Measure C-hat the paper's way (300-s stages, each 1.5x the last, until the queue grows):
    on the simulated engine, repeated on five independent traces and averaged; or once, live."""
    if engine.live:
        _calibrate_live(engine, model, gpu, mixed_prompts, time_scale, token_scale, stages, workdir)
        return
    result = calibration_for(model, gpu, mixed_prompts, use_cache=not no_cache, token_scale=token_scale)
    brief = {k: v for k, v in result.items() if k != "runs"}
    brief["runs"] = [{"seed": run["seed"], "chat": run["chat"], "saturated_stage_rate": run["saturated_stage_rate"],
                      "saturated_stage_growth_per_s": run["saturated_stage_growth_per_s"]} for run in result["runs"]]
    click.echo(json.dumps(brief, indent=1))


def _calibrate_live(engine: EngineChoice, model: str, gpu: str, mixed_prompts: bool, time_scale: float,
                    token_scale: float, stages: int, workdir: Path | None) -> None:
    if mixed_prompts:
        raise click.UsageError("--mixed-prompts is for the simulated engine only")
    workdir = workdir or live_workdir("calibrate-")
    console.print(f"calibrating {engine} live, up to {stages} stages of {300 * time_scale:g} s; logs in {workdir}")
    try:
        summary = calibrate_one_live(engine, model=model, gpu=gpu, workdir=workdir, time_scale=time_scale,
                                     token_scale=token_scale, stages=stages)
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    click.echo(json.dumps(summary, indent=1))


def _client_profile(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """The `--client` callback: a known profile (or a profile's TOML file), checked before any run."""
    if value is None:
        return None
    try:
        client_profile(value)
    except ConfigError as error:
        raise click.BadParameter(str(error), ctx, param) from error
    return value


@main.command()
@click.option("--condition", required=True, help=f"A Table 1 condition ({', '.join(available_conditions())}) "
              "or the path of a policy TOML file.")
@click.option("--client", "client", default=None, callback=_client_profile,
              help=f"A client profile ({', '.join(available_client_profiles())}; docs/clients.md) or the path of "
                   "a profile TOML file, in place of the condition's client (default: the condition's).")
@click.option("--model", type=MODEL_CHOICE, required=True)
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True, help="Trace seed.")
@click.option("--pulse-x", type=click.FloatRange(min=0, max=100), default=2.7, show_default=True,
              help="Pulse rate in multiples of C-hat.")
@click.option("--max-batched-tokens", type=click.IntRange(min=16), default=8192, show_default=True)
@click.option("--gpu", type=GPU_CHOICE, default="h100", show_default=True)
@click.option("--mixed-prompts", is_flag=True)
@click.option("--engine-cap", type=click.IntRange(min=1), default=None, help="vLLM's --max-num-queued-reqs.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--no-cache", is_flag=True, help="Recompute even if a cached result exists (live runs too).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              default=None, help="Also write the engine's event trace (JSONL) and the run log beside it.")
@click.option("--engine", default="sim", show_default=True, callback=_engine("sim", "engine-server"),
              help="sim (virtual time), engine-server (the engine model over HTTP, started here) or the base "
                   "URL of a running OpenAI-compatible engine; the last two run live through the proxy.")
@click.option("--time-scale", type=click.FloatRange(min=1e-3, max=1e3), default=1.0, show_default=True,
              help=TIME_SCALE_HELP + " Live runs only.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Live runs: where the logs go (default: the run's directory under the cache).")
@click.option("--token-scale", type=click.FloatRange(min=1e-3, max=1.0), default=1.0, show_default=True,
              help="Every prompt and reply length times this (with --gpu cpu --model tiny-llama: 0.1, the "
                   "workload that profile was fitted on).")
def run(condition: str, client: str | None, model: str, seed: int, pulse_x: float, max_batched_tokens: int, gpu: str,
        mixed_prompts: bool, engine_cap: int | None, as_json: bool, no_cache: bool, trace_path: Path | None,
        engine: EngineChoice, time_scale: float, workdir: Path | None, token_scale: float) -> None:
    """One paper run: the trace under one condition, on the simulated engine or live."""
    if engine.kind == "url" and time_scale != 1.0 and gpu != "cpu":
        raise click.UsageError("an external engine runs in real time: --time-scale applies to engine-server only "
                               "(and to a real vLLM on a CPU with --gpu cpu, whose profile is at time scale 0.1)")
    spec = RunSpec(model=model, condition=condition, seed=seed, gpu=gpu, pulse_x=pulse_x,
                   max_batched_tokens=max_batched_tokens, mixed_prompts=mixed_prompts, engine_cap=engine_cap,
                   trace=True, token_scale=token_scale, client=client)
    result: Mapping[str, Any]
    try:
        if engine.live:
            console.print(f"live run: {condition}, {947 * time_scale:.0f}+ s wall; logs in {workdir or 'the cache'}")
            result = run_one_live(spec, engine, time_scale=time_scale, workdir=workdir, use_cache=not no_cache)
        elif trace_path is None:
            result = run_one(spec, use_cache=not no_cache)
        else:
            result = run_traced(spec, trace_path)
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    if as_json:
        click.echo(json.dumps(result))
    else:
        _print_table([result])


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)


def _run_with_progress(specs: list[RunSpec], jobs: int | None, label: str) -> list[Result]:
    with _progress() as progress:
        task = progress.add_task(label, total=len(specs))

        def advance(spec: RunSpec, result: Result) -> None:
            progress.advance(task)
            if is_failed(result):
                console.print(f"[red]run failed[/red] {spec}: {result['error']}")

        return run_many(specs, jobs=jobs, progress=advance)


@main.command()
@click.argument("name", type=click.Choice(sorted(BLOCKS)))
@click.option("--model", type=MODEL_CHOICE, required=True)
@click.option("--runs", type=click.IntRange(min=1), default=None, help="Runs (traces); default: the paper's.")
@click.option("--gpu", type=GPU_CHOICE, default="h100", show_default=True)
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Parallel processes (default: cores).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of run results.")
def block(name: str, model: str, runs: int | None, gpu: str, jobs: int | None, as_json: bool) -> None:
    """Every condition of one Table 1 block, for each of its runs."""
    try:
        specs = block_specs(name, model, runs, gpu)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    _show(_run_with_progress(specs, jobs, f"{name} on {model}"), as_json)


PAPER_GPUS = ("h100", "h200")  # the GPUs the paper's models have fitted profiles for


def _runs_option(value: str) -> int | None:
    if value == "paper":
        return None
    try:
        runs = int(value)
    except ValueError:
        runs = 0
    if runs < 1:
        raise click.BadParameter(f"must be 'paper' or a whole number >= 1, got {value!r}")
    return runs


def _run_plan(plan: list[tuple[str, RunSpec]], jobs: int | None, engine: EngineChoice,
              finished: set[RunSpec]) -> list[Result]:
    """Each distinct spec once (blocks share runs), in parallel on the simulator or one at a time live,
    with a progress display counted in block runs: done of total, current block, elapsed, ETA. Adds each
    spec whose run succeeded (and so is cached) to `finished`."""
    unique: dict[RunSpec, list[str]] = {}
    for name, spec in plan:
        unique.setdefault(spec, []).append(name)
    specs = list(unique)
    if not engine.live:
        cached = sum(run_is_cached(spec) for spec in specs)
        console.print(f"{len(specs)} distinct runs: {cached} cached, {len(specs) - cached} to compute")
    with _progress() as progress:
        task = progress.add_task("starting", total=len(plan))

        def advance(spec: RunSpec, result: Result) -> None:
            blocks = unique[spec]
            progress.update(task, advance=len(blocks), description=f"block {blocks[0]}")
            if is_failed(result):
                console.print(f"[red]run failed[/red] {', '.join(blocks)}: {spec}: {result['error']}")
            else:
                finished.add(spec)

        if not engine.live:
            return run_many(specs, jobs=jobs, progress=advance)
        return run_many_live(specs, engine, progress=advance)


@main.command()
@click.option("--engine", default="sim", show_default=True, callback=_engine("sim"),
              help="sim (the simulated engine, in parallel on every core), or the base URL of a running "
                   "OpenAI-compatible engine: each run then goes live through the proxy, in real time (947+ s), "
                   "one at a time.")
@click.option("--gpu", type=click.Choice(PAPER_GPUS), default="h100", show_default=True,
              help="The GPU profile of the simulated engine.")
@click.option("--models", default=",".join(PAPER_MODELS), show_default=True, help="Comma-separated models.")
@click.option("--runs", "runs_text", default="paper", show_default=True,
              help="paper (the paper's run counts: 137 runs) or N runs of every block on every model.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("retrybench-report"),
              show_default=True, help="Where the report (index.html) and each run's summary JSON go.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Parallel processes (default: cores).")
@click.option("--unseen-seeds", is_flag=True,
              help="Also replay every block on the ten unseen seeds (101-110; about 550 more simulations) and "
                   "report, per claim and model, on how many of them it held.")
@click.option("--json", "as_json", is_flag=True,
              help="Also print a JSON object: the run results (runs), every paper figure scored (scores) and, "
                   "with --unseen-seeds, the robustness table (robustness).")
@click.option("--real-engine", "real_engine", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="A compare-real-engine result for the report's Real engine section "
                                 "(default: OUT/real-engine.json when there).")
@click.option("--blocks", "blocks_text", default="all", show_default=True,
              help=f"Comma-separated blocks ({', '.join(BLOCKS)}); table1: Table 1's alone; all: Table 1's and "
                   "those beyond the paper but replicas (216 runs, 4-5 min on 2 cores: add it by name, "
                   "e.g. all,replicas). boundaries: the boundary maps beyond the paper (part of all).")
@click.option("--no-boundaries", is_flag=True,
              help="Skip the boundary maps (critical pulse per condition and model, deferral W x pulse, engine "
                   "cap Q x pulse; a few hundred bisection runs) that --blocks all computes.")
def reproduce(engine: EngineChoice, gpu: str, models: str, runs_text: str, out: Path, jobs: int | None,
              unseen_seeds: bool, as_json: bool, real_engine: Path | None, blocks_text: str,
              no_boundaries: bool) -> None:
    """Every block of Table 1 (the paper's 137 runs by default), then the HTML reproducibility report:
    per finding the paper's claim and figures, this run's, and a verdict. Resumable: results are cached
    by spec and code version, so an interrupted reproduction picks up where it stopped; Ctrl-C stops the
    runs, says how many are cached and exits with status 130."""
    chosen = [m.strip() for m in models.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in PAPER_MODELS]
    if unknown:
        raise click.UsageError(f"unknown model(s) {', '.join(unknown)}; the paper's: {', '.join(PAPER_MODELS)}")
    runs = _runs_option(runs_text)
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


def _interrupted(plan: list[tuple[str, RunSpec]], finished: set[RunSpec], engine: EngineChoice) -> NoReturn:
    """Ctrl-C: the workers are stopped by now; say how many runs are cached and how to resume, exit 130.
    On the simulator the cache itself is counted, which also holds the runs of earlier attempts."""
    specs = {spec for _, spec in plan}
    done = len(finished) if engine.live else sum(run_is_cached(spec) for spec in specs)
    console.print(f"interrupted: {done} of {len(specs)} distinct runs finished and are cached; run the same "
                  "command again to resume from there", soft_wrap=True)
    sys.exit(130)


def _reproduce(plan: list[tuple[str, RunSpec]], unseen_plan: list[tuple[str, RunSpec]] | None,
               finished: set[RunSpec], *, engine: EngineChoice, jobs: int | None, runs: int | None, out: Path,
               as_json: bool, real_engine: Path | None, boundaries: list[str] | None = None,
               gpu: str = "h100") -> None:
    """reproduce's work once its options are checked: the runs, the boundary maps on `boundaries`' models
    (None: none), then the report."""
    import time

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
        console.print(f"[yellow]no HTML report[/yellow] ({error}); pip install jinja2 matplotlib for it")
        _show(results, as_json)
        return
    label = f"live engine at {engine}" if engine.live else "simulated vLLM-V1 engine (virtual time)"
    meta = {**gather(engine=label, wall_s=wall_s, command=command), "chat_at_steps": _chat_at_2k(plan, engine)}
    context = build_context(results, meta, runs=runs, unseen=unseen)
    context["real_engine"] = _real_engine_section(real_engine, out)
    if maps is not None:
        from retrybench.report.boundaries import boundaries_section

        context["boundaries"] = boundaries_section(maps.maps, wall_s=maps.wall_s, results=results)
        console.print(f"boundaries: {maps.runs} distinct runs ({maps.cached} cached) in {maps.wall_s:.0f} s")
    page = write_report(out, context, results)
    _print_verdicts(context)
    console.print(f"{len(plan)} runs ({len(results)} distinct) in {wall_s:.0f} s; report: {page}")
    if as_json:
        click.echo(json.dumps({"runs": results, "scores": context["scores"], "robustness": context["robustness"]}))
    maps_failed = maps is not None and context["boundaries"]["failed"] > 0
    if any(is_failed(r) for r in [*results, *(unseen or [])]) or maps_failed:
        sys.exit(1)


def _boundaries_wanted(blocks_text: str, no_boundaries: bool, engine: EngineChoice) -> bool:
    """Whether to compute the boundary maps: with --blocks all or boundaries, on the simulated engine."""
    from retrybench.sweep.reproduce import BOUNDARIES, wanted

    if not wanted(blocks_text, no_boundaries):
        return False
    if engine.live:
        if BOUNDARIES in {part.strip() for part in blocks_text.split(",")}:
            raise click.UsageError("the boundary maps run on the simulated engine only")
        console.print("boundary maps skipped: they run on the simulated engine only")
        return False
    return True


def _boundary_maps(models: list[str], gpu: str, jobs: int | None) -> Computed | None:
    """The boundary maps, or None where the report's packages are missing."""
    try:
        from retrybench.sweep.reproduce import compute_boundaries
    except ImportError as error:  # jinja2 or matplotlib: no report to show them in
        console.print(f"[yellow]no boundary maps[/yellow] ({error})")
        return None
    return compute_boundaries(models, gpu, jobs, _progress(), console)


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
    if engine.live:
        return []
    builds = sorted({(s.model, s.gpu) for name, s in plan if name == "tracing"})
    return [{"model": model, "gpu": gpu, "max_batched_tokens": 2048,
             "chat": calibration_at_steps(model, gpu, 2048)["chat"], "chat_8192": calibration_for(model, gpu)["chat"]}
            for model, gpu in builds]


def _print_verdicts(context: dict[str, Any]) -> None:
    table = Table("finding", "verdict", "checks held", "paper figures: within / near / off", title="reproduction")
    for row in context["summary"]:
        scores = row["scores"]
        table.add_row(row["title"], row["verdict"], f"{row['passed']} of {row['checks']}",
                      f"{scores['within']} / {scores['near']} / {scores['off']}")
    console.print(table)
    total = context["scores"]["tally"]
    console.print(f"paper figures: {total['within']} of {total['scored']} within the paper's band, "
                  f"{total['near']} near, {total['off']} off")
    if context["robustness"] is not None:
        weak = [f"{r['claim']} on {r['model']} ({r['held']} of {r['evaluated']})"
                for r in context["robustness"]["rows"] if r["robust"] == "not robust"]
        listed = ": " + "; ".join(weak) if weak else ""
        console.print(f"unseen seeds: {len(weak)} claim-model pairs not robust{listed}")


@main.command()
@click.option("--upstream", "upstreams", required=True, multiple=True,
              help="The engine's base URL, e.g. http://127.0.0.1:8001. Repeat it for several engine replicas: "
                   "--route then picks one per execution.")
@click.option("--route", type=click.Choice(ROUTER_POLICIES), default=None,
              help="How executions are spread over several --upstream (default round-robin): round-robin, "
                   "least-outstanding (fewest streams open from this proxy), key-affine (rendezvous hashing "
                   "of the call key: every attempt of a call to the same replica) or prefix-affine (vLLM's "
                   "and SGLang's cache-aware policy). Refused with one --upstream. docs/replicas.md.")
@click.option("--prefix-tokens", type=click.IntRange(min=0), default=2000, show_default=True,
              help="The shared system prompt's length in tokens, as --route prefix-affine describes prompts.")
@click.option("--policy", "policy_name", default="no-control", show_default=True,
              help=f"A Table 1 condition ({', '.join(available_conditions())}) or a policy TOML file.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--max-body-bytes", type=click.IntRange(min=1024), default=4 << 20, show_default=True)
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write every decision as JSONL (for run logs and conformance replay).")
@click.option("--time-scale", type=click.FloatRange(min=1e-3, max=1e3), default=1.0, show_default=True,
              help=TIME_SCALE_HELP)
@click.option("--retain-s", type=click.FloatRange(min=0), default=None,
              help="Keep each completed response this many seconds for retries of its call that arrive "
                   "late (overrides the policy's retain_s; 0 keeps nothing).")
@click.option("--retain-max-bytes", type=click.IntRange(min=0), default=None,
              help="The most bytes all retained responses may hold (the oldest go first).")
@click.option("--upstream-connect-timeout", "connect_timeout_s", type=click.FloatRange(min=0), default=10.0,
              show_default=True, help="Seconds to open a connection to the engine, else 504 (0: no limit).")
@click.option("--upstream-idle-timeout", "idle_timeout_s", type=click.FloatRange(min=0), default=1800.0,
              show_default=True,
              help="Seconds an execution may go without progress from the engine (a response head, a whole "
                   "chunk) before it fails with 504, or an SSE error event mid-stream (0: no limit). Scaled by "
                   "--time-scale. Long on purpose: under overload an engine legitimately sends nothing for "
                   "minutes while a request waits in its queue (vLLM sends a stream's head, then nothing until "
                   "the first token), and a live paper run lasts 947 s.")
@click.option("--max-executions", type=click.IntRange(min=1), default=50_000, show_default=True,
              help="Executions the proxy holds at once (queued or streaming); past it an attempt gets a 503 "
                   "naming the limit.")
@click.option("--max-subscribers", type=click.IntRange(min=1), default=1_000, show_default=True,
              help="Attempts attached to one execution; past it a retry gets a 503 naming the limit.")
@click.option("--max-replay-bytes", type=click.IntRange(min=0), default=64 << 20, show_default=True,
              help="An execution's output kept for retries to attach; past it no retry attaches (503) and "
                   "nothing of it is retained.")
def proxy(upstreams: tuple[str, ...], route: str | None, prefix_tokens: int, policy_name: str, host: str,
          port: int, max_body_bytes: int, log_path: Path | None, time_scale: float, retain_s: float | None,
          retain_max_bytes: int | None, connect_timeout_s: float, idle_timeout_s: float, max_executions: int,
          max_subscribers: int, max_replay_bytes: int) -> None:
    """Serve the overload-control proxy in front of an OpenAI-compatible engine (or several replicas)."""
    from dataclasses import replace

    from retrybench.conditions.config import load_condition
    from retrybench.proxy.proxy_server import ProxySettings, serve_forever

    try:
        policy = load_condition(policy_name).proxy
        if retain_s is not None:
            policy = replace(policy, retain_s=retain_s)
        if retain_max_bytes is not None:
            policy = replace(policy, retain_max_bytes=retain_max_bytes)
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    if route is not None and len(upstreams) == 1:
        raise click.UsageError(f"--route {route} needs several --upstream: one upstream takes every execution")
    try:
        settings = ProxySettings(upstream=upstreams[0], more_upstreams=upstreams[1:], route=route or "round-robin",
                                 prefix_tokens=prefix_tokens, policy=policy, max_body_bytes=max_body_bytes,
                                 log_path=log_path, time_scale=time_scale,
                                 upstream_connect_timeout_s=connect_timeout_s or None,
                                 upstream_idle_timeout_s=idle_timeout_s or None, max_executions=max_executions,
                                 max_subscribers=max_subscribers, max_replay_bytes=max_replay_bytes)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    serve_forever(settings, host, port)


@main.command("engine-server")
@click.option("--model", type=MODEL_CHOICE, required=True)
@click.option("--gpu", type=GPU_CHOICE, default="h100", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8001, show_default=True)
@click.option("--time-scale", type=click.FloatRange(min=1e-3, max=1e3), default=1.0, show_default=True,
              help=TIME_SCALE_HELP)
@click.option("--max-num-queued-reqs", type=click.IntRange(min=1), default=None,
              help="vLLM's queue cap: refuse with 503 when waiting + running would exceed it.")
@click.option("--stream-interval", type=click.IntRange(min=1), default=1, show_default=True,
              help="Output tokens per streamed chunk (vLLM's --stream-interval).")
@click.option("--sync-scheduling", is_flag=True, help="One batch in flight (vLLM's CPU platform).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the scheduler trace as JSONL.")
def engine_server(model: str, gpu: str, host: str, port: int, time_scale: float, max_num_queued_reqs: int | None,
                  stream_interval: int, sync_scheduling: bool, trace_path: Path | None) -> None:
    """Serve the simulated engine over HTTP in wall-clock time (vLLM's API subset: CPU stand-in)."""
    from retrybench.engine_server.engine_server import EngineServerSettings, serve_forever

    settings = EngineServerSettings(model=model, gpu=gpu, time_scale=time_scale,
                                    max_num_queued_reqs=max_num_queued_reqs, stream_interval=stream_interval,
                                    async_scheduling=not sync_scheduling, trace_path=trace_path)
    serve_forever(settings, host, port)


@main.command("compare-real-engine")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where real-engine.json, the engine's log and every live run's logs go.")
@click.option("--calibrations", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--conditions", default=None,
              help="Comma-separated conditions (default: retries-on-cancel-on, retries-off-cancel-on, coalescing, "
                   "deferred-cancellation, retry-budget).")
@click.option("--loads", default=None,
              help="Capacity-curve loads in multiples of C-hat (default 0.5,0.75,1,1.25,1.5; none: no curve).")
@click.option("--stage-s", type=click.FloatRange(min=10), default=300.0, show_default=True,
              help="Trace seconds of each calibration stage.")
@click.option("--curve-stage-s", type=click.FloatRange(min=10), default=120.0, show_default=True,
              help="Trace seconds of each capacity-curve stage and speed probe.")
@click.option("--first-stage", type=click.IntRange(min=0), default=2, show_default=True,
              help="The first calibration's first stage: 0.2 x 1.5^N calls/s.")
@click.option("--time-scale", type=click.FloatRange(min=0.001), default=0.1, show_default=True)
@click.option("--engine-url", default=None,
              help="An engine already running (then nothing is pinned); default: start vLLM with a tiny model.")
@click.option("--no-pin", is_flag=True, help="Leave the engine and this process on every CPU.")
@click.option("--run-when-refused", is_flag=True,
              help="Go on when the calibrations spread too far (every verdict is then 'refused').")
@click.option("--runtime", type=click.Choice(["process", "container"]), default="process", show_default=True,
              help="Run vLLM and each run's proxy as processes, or as the containers of the images "
                   "scripts/build_image.py builds (on one Docker network, pinned the same way).")
@click.option("--vllm-image", default=None, help="--runtime container: the vLLM image (default: this checkout's).")
@click.option("--proxy-image", default=None, help="--runtime container: the proxy image (default: this checkout's).")
def compare_real_engine(out: Path, calibrations: int, conditions: str | None, loads: str | None, stage_s: float,
                        curve_stage_s: float, first_stage: int, time_scale: float, engine_url: str | None,
                        no_pin: bool, run_when_refused: bool, runtime: str, vllm_image: str | None,
                        proxy_image: str | None) -> None:
    """The simulator against a real vLLM (CPU build, tiny model, scaled trace): pinned CPUs, repeated
    calibrations, the capacity curve and the scaled diagnostic, verdicts only where the engine held its
    speed. Writes OUT/real-engine.json; `retrybench reproduce --out OUT` then shows it."""
    from retrybench.realvllm.compare_real import CONDITIONS, CURVE_LOADS, RESULT_FILE, CompareSettings
    from retrybench.realvllm.compare_real import compare_real_engine as run_comparison

    chosen = tuple(c.strip() for c in conditions.split(",")) if conditions else tuple(CONDITIONS)
    unknown = [c for c in chosen if c not in available_conditions()]
    if unknown:
        raise click.UsageError(f"unknown condition(s) {', '.join(unknown)}")
    if runtime == "container" and engine_url is not None:
        raise click.UsageError("--engine-url names an engine already running: --runtime container starts its own")
    curve = CURVE_LOADS if loads is None else () if loads.strip() == "none" else tuple(
        float(x) for x in loads.split(","))
    settings = CompareSettings(out=out, calibrations=calibrations, conditions=chosen, curve_loads=curve,
                               runtime="container" if runtime == "container" else "process",
                               vllm_image=vllm_image, proxy_image=proxy_image,
                               stage_s=stage_s, curve_stage_s=curve_stage_s, probe_s=curve_stage_s,
                               first_stage=first_stage, time_scale=time_scale, pin=not no_pin,
                               run_when_refused=run_when_refused, log=lambda line: console.print(line))
    record = run_comparison(settings, engine_url=engine_url)
    statuses = [f"{row['condition']}: {row['verdict']['status']}" for row in record.get("conditions", [])
                if "verdict" in row]
    summary = "; ".join(statuses) or record["band"]["refusal"]
    console.print(f"{summary}; {out / RESULT_FILE} in {record['wall_s']:.0f} s")


@main.command("make-trace")
@click.option("--model", type=MODEL_CHOICE, required=True, help="Its C-hat sets the trace's rates.")
@click.option("--gpu", type=GPU_CHOICE, default="h100", show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--pulse-x", type=click.FloatRange(min=0, max=100), default=2.7, show_default=True)
@click.option("--mixed-prompts", is_flag=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def make_trace(model: str, gpu: str, seed: int, pulse_x: float, mixed_prompts: bool, out: Path) -> None:
    """Write the paper's trace (base, pulse, hold) for `loadgen` to replay."""
    from retrybench.conditions.config import WorkloadSpec
    from retrybench.traffic.workload import generate_trace, save_trace

    chat = float(calibration_for(model, gpu, mixed_prompts)["chat"])
    trace = generate_trace(WorkloadSpec(chat_calls_per_s=chat, pulse_rate_x=pulse_x, mixed_prompts=mixed_prompts),
                           seed)
    save_trace(trace, out)
    console.print(f"{len(trace.calls)} calls over {trace.end_s:.0f} s (C-hat {chat:.3f}/s) -> {out}")


@main.command("make-tiny-model")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--hidden", type=click.IntRange(min=8), default=256, show_default=True)
@click.option("--vocab", type=click.IntRange(min=30_100), default=32_000, show_default=True,
              help="At least the workload's token ids (below 30,000) plus the special tokens.")
@click.option("--max-positions", type=click.IntRange(min=256), default=32_768, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
def make_tiny_model(directory: Path, layers: int, hidden: int, vocab: int, max_positions: int, seed: int) -> None:
    """Write a tiny Llama with random weights and a word-level tokenizer for `vllm serve DIRECTORY`
    (no download, no torch): the real-engine tests measure scheduling, not text."""
    from retrybench.realvllm.tinymodel import TinyLlama
    from retrybench.realvllm.tinymodel import make_tiny_model as make

    try:
        shape = TinyLlama(layers=layers, hidden=hidden, intermediate=2 * hidden, vocab=vocab,
                          max_positions=max_positions, seed=seed)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    if directory.exists() and any(directory.iterdir()) and not (directory / "config.json").exists():
        raise click.UsageError(f"{directory} holds other files; give an empty or new directory")
    make(directory, shape)
    console.print(f"tiny Llama ({layers} layers, hidden {hidden}, vocabulary {vocab}) -> {directory}")


@main.command()
@click.option("--trace", "trace_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="A saved trace (retrybench-trace/1).")
@click.option("--target", required=True, help="Base URL of the proxy or engine, e.g. http://127.0.0.1:8000.")
@click.option("--condition", default="retries-on-cancel-on", show_default=True,
              help="The Table 1 condition (or TOML file) whose client policy to use.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seeds the retry jitter.")
@click.option("--time-scale", type=click.FloatRange(min=1e-3, max=1e3), default=1.0, show_default=True,
              help=TIME_SCALE_HELP)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the attempts as a run log (JSON, written atomically).")
@click.option("--driver", type=click.Choice(["builtin", "openai-sdk"]), default="builtin", show_default=True,
              help="builtin: the project's retrying client decides every retry; openai-sdk: each call goes "
                   "through the official openai SDK, which retries on its own (real time only; the policy "
                   "gives it only its timeout and retry count).")
def loadgen(trace_file: Path, target: str, condition: str, seed: int, time_scale: float, out: Path,
            driver: str) -> None:
    """Replay a trace open-loop against TARGET with a retrying client."""
    from retrybench.conditions.config import load_condition
    from retrybench.loadgen.loadgen import LoadgenSettings, run_loadgen
    from retrybench.traffic.workload import load_trace

    try:
        client = load_condition(condition).client
        trace = load_trace(trace_file)
    except (ConfigError, ValueError) as error:
        raise click.UsageError(str(error)) from error
    if driver == "openai-sdk":
        if time_scale != 1.0:
            raise click.UsageError("--driver openai-sdk runs in real time: the SDK sleeps its backoff on the wall "
                                   "clock (leave --time-scale at 1)")
        from retrybench.loadgen.sdk_driver import MissingSdk, SdkLoadSettings, run_sdk_loadgen

        try:
            sdk = run_sdk_loadgen(trace, SdkLoadSettings(target=target, client=client), out)
        except MissingSdk as error:
            raise click.ClickException(str(error)) from error
        console.print(f"{len(sdk.calls)} calls, {len(sdk.attempts)} attempts through the openai SDK")
        return
    settings = LoadgenSettings(target=target, client=client, seed=seed, time_scale=time_scale)
    result = run_loadgen(trace, settings, out)
    lateness = result.meta["send_lateness"]
    console.print(f"{len(result.calls)} calls, {len(result.attempts)} attempts; send lateness "
                  f"p50 {lateness['p50_ms']:.3f} ms, p99 {lateness['p99_ms']:.3f} ms")


@main.command()
def doctor() -> None:
    """Which engines can run on this machine, with versions; for each that cannot, why and the fix."""
    from retrybench.cli.doctor import Probe, diagnose

    table = Table(title="engines on this machine")
    for column in ("engine", "runs", "version", "why not", "fix"):
        table.add_column(column, overflow="fold")
    for engine in diagnose(Probe.of_this_machine()):
        table.add_row(engine.name, "yes" if engine.available else "no", engine.version,
                      engine.why_not or engine.note, engine.fix)
    Console().print(table)


@main.command()
@click.option("--condition", "conditions_text", required=True,
              help="Comma-separated conditions (names in policies/ or TOML paths), each a panel of the page.")
@click.option("--axis", "axis_texts", multiple=True, metavar="NAME=VALUES",
              help="Repeatable: NAME=V1,V2,... or NAME=START:STOP:STEP (STOP included). NAME is a run-spec field "
                   "(pulse_x, engine_cap, max_batched_tokens, token_scale, mixed_prompts, model, gpu, client) or a "
                   "policy field over the condition's (proxy.defer_s, proxy.budget_ratio, client.attempt_timeout_s, "
                   "... any [proxy] or [client] field of a policy file).")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs per point, on trace seeds 1..N (the seeds reproduce's runs use).")
@click.option("--model", type=MODEL_CHOICE, default=PAPER_MODELS[0], show_default=True,
              help="The model, unless an axis varies it.")
@click.option("--gpu", type=GPU_CHOICE, default="h100", show_default=True, help="The GPU, unless an axis varies it.")
@click.option("--find", "find", default=None, metavar="AXIS",
              help="Bisect AXIS per cell (condition x other axes x seed) between its bounds, assuming the outcome "
                   "is monotone along it, instead of running every value.")
@click.option("--until", type=click.Choice(["not-recovered", "recovered"]), default="not-recovered",
              show_default=True, help="The outcome whose onset a boundary marks.")
@click.option("--resolution", default=None, help="--find's resolution along its axis (default: the axis' step).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where sweep.json and index.html go.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: a process pool on this machine; ray: one Ray task per run (pip install 'retrybench[ray]').")
@click.option("--address", default=None, help="--executor ray: a running cluster's address (default: a local Ray).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel processes, or a local Ray's CPUs (default: cores).")
@click.pass_context
def sweep(ctx: click.Context, conditions_text: str, axis_texts: tuple[str, ...], seeds: int, model: str, gpu: str,
          find: str | None, until: str, resolution: str | None, out: Path, executor: str, address: str | None,
          jobs: int | None) -> None:
    """Map run parameters (axes) x conditions x seeds on the simulated engine, through the result cache
    (resumable, under either executor); write sweep.json and a page of phase diagrams (recovery and hold
    delivered per cell) with the critical value of the first numeric axis, or of --find's, per cell."""
    from retrybench.sweep.cli import SweepOptions, run_sweep

    for name in ("model", "gpu"):
        given = ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        if given and any(t.partition("=")[0].strip() == name for t in axis_texts):
            raise click.UsageError(f"--{name} and --axis {name} both given: keep one")
    options = SweepOptions(conditions=conditions_text, axes=axis_texts, seeds=seeds, model=model, gpu=gpu, find=find,
                           until=until, resolution=resolution, out=out, executor=executor, address=address, jobs=jobs,
                           command=" ".join(["retrybench", *sys.argv[1:]]))
    run_sweep(options, _progress(), console)


def _show(results: Sequence[Mapping[str, Any]], as_json: bool) -> None:
    """Print the results (JSON or a table); exit 1 if any run failed, after showing every run."""
    if as_json:
        click.echo(json.dumps(results))
    else:
        _print_table(results)
    if any("error" in r for r in results):
        sys.exit(1)


HEADERS = ("recovered", "recovery s", "hold %", "pulse %", "primary <=120 s %", "created xC", "accepted xC",
           "completed xC", "retry share %")


def _print_table(results: Sequence[Mapping[str, Any]]) -> None:
    table = Table("model", "condition", "seed", "pulse xC", *HEADERS, title="retrybench runs (simulated engine)")
    for r in results:
        if "error" in r:
            table.add_row(r["model"], r["condition"], str(r["seed"]), str(r["pulse_x"]), f"FAILED: {r['error']}")
            continue
        table.add_row(r["model"], r["condition"], str(r["seed"]), str(r["pulse_x"]),
                      *("-" if r.get(c) is None else str(r[c]) for c in SUMMARY_COLUMNS))
    Console(width=None if sys.stdout.isatty() else 200).print(table)


if __name__ == "__main__":
    main()
