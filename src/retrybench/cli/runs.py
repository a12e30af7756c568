"""`retrybench calibrate`, `run` and `block`: C-hat, one paper run, one Table 1 block."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from retrybench.cli.display import console, print_table, show
from retrybench.cli.options import (
    Argument,
    Command,
    LazyChoice,
    client_option,
    condition_option,
    engine_option,
    executor_options,
    gpu_memory_utilization_option,
    gpu_option,
    jobs_option,
    json_option,
    max_num_batched_tokens_option,
    max_num_queued_reqs_option,
    model_option,
    out_option,
    renamed,
    runs_option,
    seed_option,
    step_model_option,
    time_scale_option,
    token_scale_option,
    workload_options,
)
from retrybench.cli.workload import workload_spec_fields

if TYPE_CHECKING:
    from retrybench.plan.engine_choice import EngineChoice
    from retrybench.traffic.recorded import Pulse

__all__ = ["block", "calibrate", "run"]

MIXED_PROMPTS_HELP = "Half the calls get 3,000-token prompts (Section 4.2)."


def check_engine(model: str, gpu: str, step_model: str | None, gpu_memory_utilization: float) -> None:
    """A usage error, before any run, where the model cannot be served on the GPU: it does not fit, its
    step model has no constants for it, or its kernels need the database (the `kernels` extra)."""
    from dataclasses import replace

    from retrybench.engine.kernel_db import KernelDatabaseMissing
    from retrybench.engine.profiles import GPUS, profile_for

    try:
        engine = replace(GPUS[gpu].engine_defaults(), gpu_memory_utilization=gpu_memory_utilization)
        profile = profile_for(model, gpu, engine, step_model=step_model)
        profile.kv_blocks  # noqa: B018 - raises where the model leaves no KV cache
        profile.step_timer()  # builds the model's kernel table here where it is not packaged or cached
    except (ValueError, KernelDatabaseMissing) as error:
        raise click.UsageError(str(error)) from error


def _block_names() -> list[str]:
    from retrybench.plan.blocks import BLOCKS

    return sorted(BLOCKS)


@click.command(cls=Command, retired=[renamed("out", "--workdir")])
@model_option()
@gpu_option()
@click.option("--mixed-prompts", is_flag=True, help=MIXED_PROMPTS_HELP)
@click.option("--no-cache", is_flag=True, help="Recompute even if a cached calibration exists.")
@engine_option("sim", help="sim, or the base URL of a running OpenAI-compatible engine (a real vLLM, say): the "
                           "stages then go to it live, through the proxy with cancellation off.")
@time_scale_option(help="Live only. Wall seconds per model second: 1 is real time, 0.1 runs every clock, deadline "
                        "and policy timer ten times faster.")
@token_scale_option("Every prompt and reply length times this: the paper's workload for a slower engine.")
@step_model_option()
@gpu_memory_utilization_option()
@click.option("--stages", type=click.IntRange(min=1, max=30), default=None,
              help="Live only: stages to send at most (0.2 calls/s x 1.5^k); the first saturated one gives C-hat "
                   "(default: as many as the simulated calibration sends).")
@out_option("Live only: where the logs go (default: a new directory under the cache).", "workdir", default=None)
def calibrate(model: str, gpu: str, mixed_prompts: bool, no_cache: bool, engine: EngineChoice, time_scale: float,
              token_scale: float, step_model: str | None, gpu_memory_utilization: float, stages: int | None,
              workdir: Path | None) -> None:
    """Measure C-hat the paper's way (300-s stages, each 1.5x the last, until the queue grows):
    on the simulated engine, repeated on five independent traces and averaged; or once, live.
    Prints the calibration as JSON."""
    if engine.live:
        from retrybench.calibration.stages import STAGES

        _calibrate_live(engine, model, gpu, mixed_prompts, time_scale, token_scale, stages or STAGES, workdir)
        return
    from retrybench.calibration.store import calibration_for

    check_engine(model, gpu, step_model, gpu_memory_utilization)
    result = calibration_for(model, gpu, mixed_prompts, use_cache=not no_cache, token_scale=token_scale,
                             step_model=step_model, gpu_memory_utilization=gpu_memory_utilization)
    brief = {k: v for k, v in result.items() if k != "runs"}
    brief["runs"] = [{"seed": run["seed"], "chat": run["chat"], "saturated_stage_rate": run["saturated_stage_rate"],
                      "saturated_stage_growth_per_s": run["saturated_stage_growth_per_s"]} for run in result["runs"]]
    click.echo(json.dumps(brief, indent=1))


def _calibrate_live(engine: EngineChoice, model: str, gpu: str, mixed_prompts: bool, time_scale: float,
                    token_scale: float, stages: int, workdir: Path | None) -> None:
    from retrybench.calibration.live import calibrate_engine
    from retrybench.runs.store import live_workdir

    if mixed_prompts:
        raise click.UsageError("--mixed-prompts is for the simulated engine only")
    workdir = workdir or live_workdir("calibrate-")
    console().print(f"calibrating {engine} live, up to {stages} stages of {300 * time_scale:g} s; logs in {workdir}")
    try:
        summary = calibrate_engine(engine, model=model, gpu=gpu, workdir=workdir, time_scale=time_scale,
                                     token_scale=token_scale, stages=stages)
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    click.echo(json.dumps(summary, indent=1))


@click.command(cls=Command, retired=[renamed("max-num-batched-tokens", "--max-batched-tokens"),
                                     renamed("max-num-queued-reqs", "--engine-cap"), renamed("out", "--workdir")])
@condition_option(required=True)
@client_option()
@model_option()
@seed_option("Trace seed.")
@click.option("--pulse-x", type=click.FloatRange(min=0, max=100), default=2.7, show_default=True,
              help="Pulse rate in multiples of C-hat.")
@max_num_batched_tokens_option("The engine's token budget per scheduler step (vLLM's --max-num-batched-tokens).")
@gpu_option()
@click.option("--mixed-prompts", is_flag=True, help=MIXED_PROMPTS_HELP)
@max_num_queued_reqs_option("The engine's queue cap, as vLLM's --max-num-queued-reqs (default: the condition's).")
@json_option("Print the run's summary as one JSON object instead of the table.")
@click.option("--no-cache", is_flag=True, help="Recompute even if a cached result exists (live runs too).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              default=None, help="Also write the engine's event trace (JSONL) and the run log beside it.")
@engine_option("sim", "engine-server",
               help="sim (virtual time), engine-server (the engine model over HTTP, started here) or the base URL of "
                    "a running OpenAI-compatible engine; the last two run live through the proxy.")
@time_scale_option(help="Live runs only. Wall seconds per model second: 1 is real time, 0.1 runs every clock, "
                        "deadline and policy timer ten times faster.")
@out_option("Live runs: where the logs go (default: the run's directory under the cache).", "workdir", default=None)
@token_scale_option("Every prompt and reply length times this (with --gpu cpu --model tiny-llama: 0.1, the "
                    "workload that profile was fitted on).")
@step_model_option()
@gpu_memory_utilization_option()
@workload_options
def run(condition: str, client: str | None, model: str, seed: int, pulse_x: float, max_num_batched_tokens: int,
        gpu: str, mixed_prompts: bool, max_num_queued_reqs: int | None, as_json: bool, no_cache: bool,
        trace_path: Path | None, engine: EngineChoice, time_scale: float, workdir: Path | None,
        token_scale: float, step_model: str | None, gpu_memory_utilization: float, workload: Path | None,
        workload_format: str | None, rate_x: float | None, pulses: tuple[Pulse, ...]) -> None:
    """One paper run: the trace under one condition, on the simulated engine or live."""
    from retrybench.calibration.store import chat_for
    from retrybench.conditions.config import ConfigError
    from retrybench.plan.spec import RunSpec
    from retrybench.runs.executors import run_one
    from retrybench.runs.live import run_one_live
    from retrybench.runs.simulate import run_traced

    if engine.kind == "url" and time_scale != 1.0 and gpu != "cpu":
        raise click.UsageError("an external engine runs in real time: --time-scale applies to engine-server only "
                               "(and to a real vLLM on a CPU with --gpu cpu, whose profile is at time scale 0.1)")
    pulse_x_source = click.get_current_context().get_parameter_source("pulse_x")
    pulse_x_given = pulse_x_source is not click.core.ParameterSource.DEFAULT
    if workload is not None and pulse_x_given:
        raise click.UsageError("--pulse-x is the paper's pulse: over --workload, give --pulse AT:DURATION:X")
    recorded = workload_spec_fields(workload, workload_format, rate_x, pulses, gpus=(gpu,), engine=engine)
    check_engine(model, gpu, step_model, gpu_memory_utilization)
    result: Mapping[str, Any]
    try:
        spec = RunSpec(model=model, condition=condition, seed=seed, gpu=gpu, pulse_x=pulse_x,
                       max_batched_tokens=max_num_batched_tokens, mixed_prompts=mixed_prompts,
                       engine_cap=max_num_queued_reqs, trace=True, token_scale=token_scale, client=client,
                       step_model=step_model, gpu_memory_utilization=gpu_memory_utilization, **recorded)
        if engine.live:
            console().print(f"live run: {condition}, {947 * time_scale:.0f}+ s wall; logs in {workdir or 'the cache'}")
            result = run_one_live(spec, engine, time_scale=time_scale, workdir=workdir, use_cache=not no_cache)
        elif trace_path is None:
            result = run_one(spec, use_cache=not no_cache)
        else:
            result = run_traced(spec, chat_for(spec), trace_path).record()
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    if as_json:
        click.echo(json.dumps(result))
    else:
        print_table([result])


@click.command(cls=Command)
@click.argument("name", cls=Argument, metavar="NAME", type=LazyChoice(_block_names),
                help="The block (Table 1's and those beyond the paper).")
@model_option()
@runs_option("Runs (traces) of the block: paper (the paper's count) or N.")
@gpu_option()
@executor_options
@jobs_option("Parallel processes, or a local Ray's CPUs (default: cores).")
@json_option("Print the run results as one JSON list instead of the table.")
def block(name: str, model: str, runs: int | None, gpu: str, executor: str, address: str | None, jobs: int | None,
          as_json: bool) -> None:
    """Every condition of one Table 1 block, for each of its runs."""
    from retrybench.runs.display import RichDisplay
    from retrybench.runs.executors import make_executor
    from retrybench.runs.ray import RayMissing
    from retrybench.runs.reproduce import run_block

    try:
        chosen = make_executor(executor, jobs=jobs, address=address)
        results = run_block(name, model, chosen, runs=runs, gpu=gpu, display=RichDisplay(console()))
    except (ValueError, RayMissing) as error:  # ReproduceError is a ValueError
        raise click.UsageError(str(error)) from error
    show(results, as_json)
