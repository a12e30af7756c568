"""What the commands print: runs as a table or as JSON, a progress display, log lines on stderr.

rich is imported when something is shown, not when a command is declared: `run --json` never needs it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["console", "print_table", "show"]

SUMMARY_COLUMNS = ("recovered", "recovery_s", "hold_delivered_pct", "pulse_delivered_pct", "primary_timely_pct",
                   "created_x", "accepted_x", "completed_x", "retry_share_pct")
HEADERS = ("recovered", "recovery s", "hold %", "pulse %", "primary <=120 s %", "created xC", "accepted xC",
           "completed xC", "retry share %")


@cache
def console() -> Console:
    """The console on stderr: progress, log lines and verdicts, apart from a command's result on stdout."""
    from rich.console import Console

    return Console(stderr=True)


def show(results: Sequence[Mapping[str, Any]], as_json: bool) -> None:
    """Print the results (JSON or a table); exit 1 if any run failed, after showing every run."""
    if as_json:
        click.echo(json.dumps(results))
    else:
        print_table(results)
    if any("error" in r for r in results):
        sys.exit(1)


def _pulse(result: Mapping[str, Any]) -> str:
    """The pulse column: the paper's pulse_x, or a recorded workload's bursts as AT:DURATION:X (- for none)."""
    if "workload_file" not in result:
        return str(result["pulse_x"])
    return " ".join(":".join(f"{v:g}" for v in pulse) for pulse in result.get("pulses", ())) or "-"


def print_table(results: Sequence[Mapping[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("model", "condition", "seed", "pulse xC", *HEADERS, title="retrybench runs (simulated engine)")
    for r in results:
        if "error" in r:
            table.add_row(r["model"], r["condition"], str(r["seed"]), _pulse(r), f"FAILED: {r['error']}")
            continue
        table.add_row(r["model"], r["condition"], str(r["seed"]), _pulse(r),
                      *("-" if r.get(c) is None else str(r[c]) for c in SUMMARY_COLUMNS))
    Console(width=None if sys.stdout.isatty() else 200).print(table)
