"""Measured per-layer costs by token count: the table the step-time model reads its GEMM and
elementwise costs from (engine/profiles.py).

A table holds, per token count, the milliseconds one decoder layer spends in its linear layers
(QKV, output, gate-up and down projections), in its hidden-sized elementwise ops (norms, residual
adds) and in the MLP's activation. Its header names the GPU's peak and bandwidth and the layer
shapes it was measured with, since the step-time model reads it relative to that GPU's roofline and
scales it to other shapes. Two sources:

- Vidur's H100 operator profile of Llama-2-7B (`h100_llama2_7b_layer_ms.csv`, packaged), the prior
  the fitted constants were fitted over;
- `scripts/profile_steps.py` on the user's own GPU (any model's shapes): `layer_table_from_steps`
  turns its CSV into a table, which `scripts/fit_profiles.py --layer-profile` fits over instead.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

__all__ = ["LINEAR_PHASES", "LayerTable", "format_layer_table", "layer_table", "layer_table_from_steps",
           "load_layer_table", "parse_layer_table"]

COLUMNS = ("tokens", "linear_ms", "hidden_elementwise_ms", "mlp_activation_ms")
HEADER_KEYS = ("peak_flops", "bandwidth", "hidden", "intermediate", "layer_params", "dtype_bytes")
# The phases of scripts/profile_steps.py that make up one layer's linear layers.
LINEAR_PHASES = ("linear_qkv", "linear_out", "linear_gate_up", "linear_down")
ELEMENTWISE_PHASES = {"elementwise_hidden": "hidden_elementwise_ms", "mlp_activation": "mlp_activation_ms"}


@dataclass(frozen=True, kw_only=True)
class LayerTable:
    """Per-layer milliseconds by token count, with the GPU and layer shapes they were measured on."""

    rows: tuple[tuple[int, float, float, float], ...]  # (tokens, linear, hidden elementwise, activation) ms
    peak_flops: float  # the measuring GPU's dense bf16 FLOP/s
    bandwidth: float  # its memory bandwidth, bytes/s
    hidden: int
    intermediate: int
    layer_params: int  # one layer's linear-layer weights
    dtype_bytes: int  # of a weight: 2 in bf16 (GPUs), 4 in float32 (profile_steps.py on a CPU)

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("a layer table needs at least one row")
        tokens = [row[0] for row in self.rows]
        if tokens != sorted(set(tokens)) or tokens[0] < 1:
            raise ValueError(f"a layer table's token counts must be positive and increasing, got {tokens}")
        if not all(math.isfinite(v) and v > 0 for row in self.rows for v in row[1:]):
            raise ValueError("a layer table's times must be positive and finite")
        if min(self.peak_flops, self.bandwidth, self.hidden, self.intermediate, self.layer_params,
               self.dtype_bytes) <= 0:
            raise ValueError("a layer table's GPU figures and shapes must be positive")


def parse_layer_table(text: str) -> LayerTable:
    """A table from its CSV: `# key = value` header lines (HEADER_KEYS), then the COLUMNS."""
    header: dict[str, float] = {}
    body = []
    for line in text.splitlines():
        if line.startswith("#"):
            key, sep, value = line[1:].partition("=")
            if sep and key.strip() in HEADER_KEYS:
                header[key.strip()] = float(value)
        elif line.strip():
            body.append(line)
    missing = [key for key in HEADER_KEYS if key not in header]
    if missing:
        raise ValueError(f"the layer table's header lacks {', '.join(missing)} (lines '# key = value')")
    rows = tuple((int(row["tokens"]), float(row["linear_ms"]), float(row["hidden_elementwise_ms"]),
                  float(row["mlp_activation_ms"])) for row in csv.DictReader(body))
    return LayerTable(rows=rows, peak_flops=header["peak_flops"], bandwidth=header["bandwidth"],
                      hidden=int(header["hidden"]), intermediate=int(header["intermediate"]),
                      layer_params=int(header["layer_params"]), dtype_bytes=int(header["dtype_bytes"]))


def format_layer_table(table: LayerTable, comments: Iterable[str] = ()) -> str:
    """The CSV `parse_layer_table` reads, with free comment lines first."""
    lines = [f"# {comment}" for comment in comments]
    lines += [f"# peak_flops = {table.peak_flops:.6g}", f"# bandwidth = {table.bandwidth:.6g}",
              f"# hidden = {table.hidden}", f"# intermediate = {table.intermediate}",
              f"# layer_params = {table.layer_params}", f"# dtype_bytes = {table.dtype_bytes}", ",".join(COLUMNS)]
    lines += [",".join([str(row[0]), *(f"{ms:.6g}" for ms in row[1:])]) for row in table.rows]
    return "\n".join(lines) + "\n"


@cache
def load_layer_table(name: str) -> LayerTable:
    """A packaged table, by its file name in retrybench/engine."""
    return parse_layer_table((resources.files("retrybench") / "engine" / name).read_text())


def layer_table(profile: str | LayerTable) -> LayerTable:
    """A GPU's `layer_profile`: a packaged table's name, or a table given whole (a fit's candidate)."""
    return profile if isinstance(profile, LayerTable) else load_layer_table(profile)


def layer_table_from_steps(rows: Iterable[Mapping[str, str]], *, peak_flops: float, bandwidth: float,
                           hidden: int, intermediate: int, layer_params: int, dtype_bytes: int) -> LayerTable:
    """A table from `scripts/profile_steps.py`'s CSV rows: per token count, the four linear phases
    summed and the two elementwise phases, at every token count that all six were timed at. The
    GPU's figures are the measuring GPU's (the CSV names its device, not its peaks)."""
    seconds: dict[str, dict[int, float]] = {}
    for row in rows:
        seconds.setdefault(row["phase"], {})[int(row["tokens"])] = float(row["seconds"])
    needed = (*LINEAR_PHASES, *ELEMENTWISE_PHASES)
    missing = [phase for phase in needed if phase not in seconds]
    if missing:
        raise ValueError(f"the step profile has no {', '.join(missing)} rows: rerun scripts/profile_steps.py")
    counts = sorted(set.intersection(*(set(seconds[phase]) for phase in needed)))
    if not counts:
        raise ValueError("the step profile's phases share no token count")
    table_rows = tuple((n, 1e3 * sum(seconds[phase][n] for phase in LINEAR_PHASES),
                        1e3 * seconds["elementwise_hidden"][n], 1e3 * seconds["mlp_activation"][n]) for n in counts)
    return LayerTable(rows=table_rows, peak_flops=peak_flops, bandwidth=bandwidth, hidden=hidden,
                      intermediate=intermediate, layer_params=layer_params, dtype_bytes=dtype_bytes)
