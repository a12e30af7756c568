"""Helpers around the runs: `retrybench make-trace` (a trace for loadgen) and `doctor` (what runs here)."""

from __future__ import annotations

from pathlib import Path

import click

from retrybench.cli.display import console
from retrybench.cli.options import Argument, Command, as_argument, gpu_option, model_option, seed_option

__all__ = ["doctor", "make_trace"]


@click.command("make-trace", cls=Command, retired=[as_argument("--out", "TRACE_FILE")])
@click.argument("trace_file", cls=Argument, metavar="TRACE_FILE", type=click.Path(dir_okay=False, path_type=Path),
                help="Where to write the trace (retrybench-trace/1, JSON).")
@model_option(help="The model whose C-hat sets the trace's rates.")
@gpu_option()
@seed_option("Trace seed.")
@click.option("--pulse-x", type=click.FloatRange(min=0, max=100), default=2.7, show_default=True,
              help="Pulse rate in multiples of C-hat.")
@click.option("--mixed-prompts", is_flag=True, help="Half the calls get 3,000-token prompts (Section 4.2).")
def make_trace(trace_file: Path, model: str, gpu: str, seed: int, pulse_x: float, mixed_prompts: bool) -> None:
    """Write the paper's trace (base, pulse, hold) to TRACE_FILE for `loadgen` to replay."""
    from retrybench.calibration.store import calibration_for
    from retrybench.conditions.config import WorkloadSpec
    from retrybench.traffic.workload import generate_trace, save_trace

    chat = float(calibration_for(model, gpu, mixed_prompts)["chat"])
    trace = generate_trace(WorkloadSpec(chat_calls_per_s=chat, pulse_rate_x=pulse_x, mixed_prompts=mixed_prompts),
                           seed)
    save_trace(trace, trace_file)
    console().print(f"{len(trace.calls)} calls over {trace.end_s:.0f} s (C-hat {chat:.3f}/s) -> {trace_file}")


@click.command(cls=Command)
def doctor() -> None:
    """Which engines can run on this machine, with versions; for each that cannot, why and the fix."""
    from rich.console import Console
    from rich.table import Table

    from retrybench.cli.doctor import Probe, diagnose

    table = Table(title="engines on this machine")
    for column in ("engine", "runs", "version", "why not", "fix"):
        table.add_column(column, overflow="fold")
    for engine in diagnose(Probe.of_this_machine()):
        table.add_row(engine.name, "yes" if engine.available else "no", engine.version,
                      engine.why_not or engine.note, engine.fix)
    Console().print(table)
