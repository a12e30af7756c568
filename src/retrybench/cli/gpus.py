"""`retrybench gpus`: the GPUs `--gpu` takes, from the packaged registry (no kernel database needed)."""

from __future__ import annotations

import json
import sys

import click

from retrybench.cli.options import Command, json_option

__all__ = ["gpus"]


@click.command(cls=Command)
@json_option("Print the GPUs as one JSON list instead of the table.")
def gpus(as_json: bool) -> None:
    """The GPUs a simulated engine runs on: memory, bandwidth, the kernel database's system and the vLLM
    version its kernels were measured with, and whose fitted host costs its steps add."""
    from retrybench.engine.gpu_listing import gpu_rows

    rows = gpu_rows()
    if as_json:
        click.echo(json.dumps(rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("--gpu", "name", "memory GiB", "bandwidth TB/s", "bf16 TFLOP/s", "kernel data", "host costs",
                  title="GPUs of the simulated engine")
    for r in rows:
        data = f"{r['kernel_system']} (vLLM {r['vllm']})" if r["kernel_system"] else "none: roofline"
        host = "-" if r["host_costs_from"] is None else (
            "own" if r["host_costs_from"] == r["gpu"] else f"{r['host_costs_from']}'s")
        table.add_row(r["gpu"], r["name"], f"{r['memory_gib']:g}", f"{r['bandwidth_tb_per_s']:g}",
                      f"{r['bf16_tflops']:g}", data, host)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
