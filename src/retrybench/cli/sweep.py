"""`retrybench sweep`: its options; the sweep itself is retrybench.sweep.service's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from retrybench.cli.display import console
from retrybench.cli.options import (
    SEEDS,
    Command,
    condition_option,
    engine_option,
    executor_options,
    gpu_option,
    jobs_option,
    model_option,
    option,
    out_option,
    seeds_counted,
    time_scale_option,
    workload_options,
)
from retrybench.cli.workload import workload_spec_fields

if TYPE_CHECKING:
    from retrybench.plan.engine_choice import EngineChoice
    from retrybench.traffic.recorded import Pulse

__all__ = ["sweep"]


@click.command(cls=Command, retired=[seeds_counted()])
@condition_option("conditions", several=True, required=True, listed=False,
                  help="Conditions (names in policies/ or TOML paths), repeated or comma-separated, each a panel "
                       "of the page.")
@click.option("--axis", "axis_texts", multiple=True, metavar="NAME=VALUES",
              help="Repeatable: NAME=V1,V2,... or NAME=START:STOP:STEP (STOP included). NAME is a run-spec field "
                   "(pulse_x, engine_cap, max_batched_tokens, token_scale, mixed_prompts, model, gpu, client; "
                   "with --workload, rate_x) or a "
                   "policy field over the condition's (proxy.defer_s, proxy.budget_ratio, client.attempt_timeout_s, "
                   "... any [proxy] or [client] field of a policy file).")
@option("seed", "seeds", type=SEEDS, default="1", show_default=True,
        help="Trace seeds of every point: 1,2,3 or 1-10 (reproduce's runs use 1, 2, ...).")
@model_option(help="The model, unless an axis varies it (default: the paper's primary model).", required=False,
              default=None)
@gpu_option(help="The GPU, unless an axis varies it.")
@click.option("--find", "find", default=None, metavar="AXIS",
              help="Bisect AXIS per cell (condition x other axes x seed) between its bounds, assuming the outcome "
                   "is monotone along it, instead of running every value.")
@click.option("--until", type=click.Choice(["not-recovered", "recovered"]), default="not-recovered",
              show_default=True, help="The outcome whose onset a boundary marks.")
@click.option("--resolution", default=None, help="--find's resolution along its axis (default: the axis' step).")
@out_option("Where sweep.json and index.html go.", required=True)
@executor_options
@jobs_option("Parallel processes, or a local Ray's CPUs (default: cores).")
@engine_option("sim", "engine-server",
               help="sim (the simulated engine, on --executor), engine-server (the engine model over HTTP, started "
                    "per run) or the base URL of a running OpenAI-compatible engine: the runs then go live through "
                    "the proxy, one after another, each condition under its own policy (no policy axes).")
@time_scale_option(help="Live runs only. Wall seconds per model second: 1 is real time, 0.1 runs every clock, "
                        "deadline and policy timer ten times faster.")
@workload_options
@click.pass_context
def sweep(ctx: click.Context, conditions: tuple[str, ...], axis_texts: tuple[str, ...], seeds: tuple[int, ...],
          model: str | None, gpu: str, find: str | None, until: str, resolution: str | None, out: Path, executor: str,
          address: str | None, jobs: int | None, engine: EngineChoice, time_scale: float, workload: Path | None,
          workload_format: str | None, rate_x: float | None, pulses: tuple[Pulse, ...]) -> None:
    """Map run parameters (axes) x conditions x seeds on the simulated engine or live, through the result
    cache (resumable, under any executor); write sweep.json and a page of phase diagrams (recovery and hold
    delivered per cell) with the critical value of the first numeric axis, or of --find's, per cell."""
    from retrybench.plan.blocks import PAPER_MODELS
    from retrybench.runs.display import RichDisplay
    from retrybench.sweep.service import INTERRUPTED, SweepError, plan_sweep, run_sweep, sweep_executor

    for name in ("model", "gpu", "rate_x"):
        given = ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        if given and any(t.partition("=")[0].strip() == name for t in axis_texts):
            raise click.UsageError(f"--{name.replace('_', '-')} and --axis {name} both given: keep one")
    recorded = workload_spec_fields(workload, workload_format, rate_x, pulses, gpus=(gpu,), engine=engine)
    try:
        planned = plan_sweep(conditions=",".join(conditions), axes=axis_texts, seeds=seeds,
                             model=model or PAPER_MODELS[0], gpu=gpu, find=find, resolution=resolution, until=until,
                             recorded=recorded)
        chosen = sweep_executor(executor, jobs=jobs, address=address, engine=engine, time_scale=time_scale)
        outcome = run_sweep(planned, chosen, out=out, command=" ".join(["retrybench", *sys.argv[1:]]),
                            display=RichDisplay(console()))
    except SweepError as error:
        raise click.UsageError(str(error)) from error
    except KeyboardInterrupt:
        console().print(INTERRUPTED, soft_wrap=True)
        sys.exit(130)
    for line in outcome.lines():
        console().print(line, soft_wrap=True)
    if outcome.failed:
        sys.exit(1)
