"""`retrybench sweep`: the command's options; its body is retrybench.sweep.cli."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from retrybench.cli.display import console, progress
from retrybench.cli.options import (
    SEEDS,
    Command,
    condition_option,
    gpu_option,
    jobs_option,
    model_option,
    option,
    out_option,
    seeds_counted,
)

__all__ = ["sweep"]


@click.command(cls=Command, retired=[seeds_counted()])
@condition_option("conditions", several=True, required=True, listed=False,
                  help="Conditions (names in policies/ or TOML paths), repeated or comma-separated, each a panel "
                       "of the page.")
@click.option("--axis", "axis_texts", multiple=True, metavar="NAME=VALUES",
              help="Repeatable: NAME=V1,V2,... or NAME=START:STOP:STEP (STOP included). NAME is a run-spec field "
                   "(pulse_x, engine_cap, max_batched_tokens, token_scale, mixed_prompts, model, gpu, client) or a "
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
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: a process pool on this machine; ray: one Ray task per run (pip install 'retrybench[ray]').")
@click.option("--address", default=None, help="--executor ray: a running cluster's address (default: a local Ray).")
@jobs_option("Parallel processes, or a local Ray's CPUs (default: cores).")
@click.pass_context
def sweep(ctx: click.Context, conditions: tuple[str, ...], axis_texts: tuple[str, ...], seeds: tuple[int, ...],
          model: str | None, gpu: str, find: str | None, until: str, resolution: str | None, out: Path, executor: str,
          address: str | None, jobs: int | None) -> None:
    """Map run parameters (axes) x conditions x seeds on the simulated engine, through the result cache
    (resumable, under either executor); write sweep.json and a page of phase diagrams (recovery and hold
    delivered per cell) with the critical value of the first numeric axis, or of --find's, per cell."""
    from retrybench.plan.blocks import PAPER_MODELS
    from retrybench.sweep.cli import SweepOptions, run_sweep

    for name in ("model", "gpu"):
        given = ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        if given and any(t.partition("=")[0].strip() == name for t in axis_texts):
            raise click.UsageError(f"--{name} and --axis {name} both given: keep one")
    options = SweepOptions(conditions=",".join(conditions), axes=axis_texts, seeds=seeds,
                           model=model or PAPER_MODELS[0], gpu=gpu, find=find, until=until, resolution=resolution,
                           out=out, executor=executor, address=address, jobs=jobs,
                           command=" ".join(["retrybench", *sys.argv[1:]]))
    run_sweep(options, progress(), console())
