"""`retrybench assess`: which control keeps one deployment up; the assessment is retrybench.assess's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from retrybench.cli.display import console
from retrybench.cli.options import (
    SEEDS,
    Command,
    client_option,
    condition_option,
    gpu_option,
    jobs_option,
    json_option,
    model_option,
    option,
    out_option,
    token_scale_option,
    workload_options,
)
from retrybench.cli.workload import workload_spec_fields

if TYPE_CHECKING:
    from retrybench.assess.run import AssessOutcome
    from retrybench.traffic.recorded import Pulse

__all__ = ["assess"]


@click.command(cls=Command)
@model_option()
@gpu_option()
@click.option("--pulse-x", type=click.FloatRange(min=0, min_open=True, max=100), default=2.7, show_default=True,
              help="On the paper's trace: its pulse, in multiples of C-hat (the paper's 2.7 by default).")
@workload_options
@client_option()
@token_scale_option("Every prompt and reply length times this, on the paper's trace (with --gpu cpu --model "
                    "tiny-llama: 0.1, the workload that profile was fitted on).")
@option("seed", "seeds", type=SEEDS, default="1-2", show_default=True,
        help="Trace seeds: every control runs on each (1,2,3 or 1-3); a control keeps the setup up only if it "
             "recovered on all of them.")
@condition_option("conditions", several=True, listed=False, default=(),
                  help="Only these controls (Table 1's conditions and the retention policies; default: all of them).")
@click.option("--also", "also", multiple=True, type=click.Choice(["deadlines", "rejection"]),
              help="Assess the controls of a block beyond the paper too: 'deadlines' (the proxy acting on each call's "
                   "deadline, docs/deadlines.md), 'rejection' (refusal answers and circuit breakers, "
                   "docs/rejection.md); repeatable. A stacked client (--client with a [[layer]] profile, "
                   "docs/stacks.md) needs no option.")
@out_option("Where assess.json and index.html go.", default=Path("assess-report"), show_default=True)
@jobs_option("Parallel processes (default: cores).")
@click.option("--no-boundaries", is_flag=True,
              help="Skip the critical burst search (the largest burst each control survives, by bisection: a few "
                   "runs per control and seed).")
@json_option("Print assess.json's document instead of the table and verdict; the page is written all the same.")
def assess(model: str, gpu: str, pulse_x: float, workload: Path | None, workload_format: str | None,
           rate_x: float | None, pulses: tuple[Pulse, ...], client: str | None, token_scale: float,
           seeds: tuple[int, ...], conditions: tuple[str, ...], also: tuple[str, ...], out: Path, jobs: int | None,
           no_boundaries: bool, as_json: bool) -> None:
    """Which control keeps this deployment up: C-hat, then every control of Table 1 and the retention
    policies at your burst (--workload with --pulse, or --pulse-x on the paper's trace), and the largest
    burst each survives; writes OUT/index.html and OUT/assess.json. Resumable: runs are cached by spec and
    code version, so a rerun computes only what is missing; Ctrl-C says how many are cached and exits with
    status 130."""
    from retrybench.assess.page import write_outputs
    from retrybench.assess.plan import AssessSetup
    from retrybench.assess.run import AssessError, AssessRequest, Interrupted
    from retrybench.assess.run import assess as run_assessment
    from retrybench.conditions.config import ConfigError
    from retrybench.plan.engine_choice import parse_engine
    from retrybench.runs.display import RichDisplay
    from retrybench.runs.executors import make_executor

    recorded = workload_spec_fields(workload, workload_format, rate_x, pulses, gpus=(gpu,), engine=parse_engine("sim"))
    if recorded and token_scale != 1.0:
        raise click.UsageError("--token-scale changes the paper's trace: a recorded workload's lengths are the file's")
    if recorded and click.get_current_context().get_parameter_source("pulse_x") is not ParameterSource.DEFAULT:
        raise click.UsageError("--pulse-x is the paper's pulse: over --workload, give --pulse AT:DURATION:X")
    setup = AssessSetup(model=model, gpu=gpu, token_scale=token_scale, client=client, recorded=recorded, seeds=seeds,
                        pulse_x=pulse_x, also=tuple(dict.fromkeys(also)))
    request = AssessRequest(setup=setup, conditions=conditions, boundaries=not no_boundaries,
                            command=" ".join(["retrybench", *sys.argv[1:]]))
    try:
        outcome = run_assessment(request, make_executor("local", jobs=jobs), RichDisplay(console()))
    except (AssessError, ConfigError) as error:
        raise click.UsageError(str(error)) from error
    except Interrupted as stop:
        console().print(str(stop), soft_wrap=True)
        sys.exit(130)
    data, page = write_outputs(outcome, out)
    if as_json:
        click.echo(data.read_text())
    else:
        _print(outcome)
    console().print(f"{len(outcome.results)} runs at the burst, {outcome.search_runs} for the critical burst, in "
                    f"{outcome.wall_s:.0f} s; page: {page}; data: {data}", soft_wrap=True)
    if outcome.failed:
        sys.exit(1)


def _print(outcome: AssessOutcome) -> None:
    """The per-control table, then the verdict paragraph."""
    from rich import box
    from rich.table import Table

    def show(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    chat = f", C-hat {outcome.chat:.4g} calls/s" if outcome.chat is not None else ""
    table = Table(title=f"assess: {outcome.burst}{chat}", box=box.SIMPLE_HEAD, padding=(0, 0),
                  show_edge=False)
    table.add_column("control", no_wrap=True)
    for header in ("keeps\nit up", "recov.\nruns", "recov.\ns", "burst\n%", "hold\n%", "created\nxC", "largest\nburst"):
        table.add_column(header, no_wrap=True)
    for o in outcome.outcomes:
        table.add_row(o.control, "yes" if o.keeps_up else "no", f"{o.recovered_runs}/{o.runs}",
                      show(o.recovery_s, ".0f"), show(o.pulse_delivered_pct, ".1f"), show(o.hold_delivered_pct, ".1f"),
                      show(o.created_x, ".2f"), o.limit.short() if o.limit else "-")
    console().print(table)
    console().print(outcome.verdict, soft_wrap=True)
