"""Measured kernel costs of one model on one GPU, by step shape: the tables the `kernels` step model
prices every engine step from (engine/profiles.py).

A table holds, from NVIDIA's database of vLLM kernel latencies (`aiconfigurator-core`, measured with
vLLM's own kernels), the milliseconds of:

- the token-wise ops (the four GEMMs of every layer, norms, residual adds, the MLP's activation,
  the embedding) at n tokens in the step, on a grid of n;
- the LM head at m sampled rows;
- the attention of one prefill chunk of q new tokens after p tokens already in the KV cache (its
  prefix), on a (q, p) grid;
- the attention of b decodes at context s each, on a (b, s) grid.

Between grid points it is read linearly (bilinearly on the 2-D grids), beyond the grid's ends by the
last interval's slope. Its header names where it came from (package version, GPU system, vLLM data
version) and the model shapes it priced, so a stale or foreign table is recognised
(engine/kernel_store.py). Building one needs the `kernels` extra (engine/kernel_db.py); reading one
does not.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypedDict, cast

__all__ = ["DENSE_ROWS", "DENSE_TOKENS", "FORMAT", "KernelTable", "Provenance", "Shapes", "format_kernel_table",
           "interpolate", "interpolate_2d", "parse_kernel_table"]

FORMAT = 1
DENSE_TOKENS = 16_384  # token counts the simulator reads from a list; beyond, from the grid
DENSE_ROWS = 1_024


class Shapes(TypedDict):
    """What a model's kernels depend on (from its config.json)."""

    architecture: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


class Provenance(TypedDict):
    """Where a table's numbers come from."""

    package: str  # "aiconfigurator-core 0.12.0"
    system: str  # the database's GPU system, "h100_sxm"
    backend: str  # "vllm"
    backend_version: str  # the vLLM version the kernels were measured with
    sources: dict[str, list[str]]  # per op family, the database's provenance tiers seen (silicon, empirical, ...)


@dataclass(frozen=True, kw_only=True)
class KernelTable:
    """Milliseconds by step shape (see the module docstring)."""

    provenance: Provenance
    shapes: Shapes
    tokens: tuple[int, ...]
    tokens_ms: tuple[float, ...]
    logits_rows: tuple[int, ...]
    logits_ms: tuple[float, ...]
    prefill_q: tuple[int, ...]
    prefill_prefix: tuple[int, ...]
    prefill_ms: tuple[tuple[float, ...], ...]  # [q index][prefix index]
    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    decode_ms: tuple[tuple[float, ...], ...]  # [batch index][context index]

    def __post_init__(self) -> None:
        _check_grid("tokens", self.tokens, minimum=1)
        _check_values("tokens", self.tokens_ms, len(self.tokens))
        _check_grid("logits_rows", self.logits_rows, minimum=1)
        _check_values("logits_rows", self.logits_ms, len(self.logits_rows))
        _check_grid_2d("prefill", self.prefill_q, self.prefill_prefix, self.prefill_ms)
        _check_grid_2d("decode", self.decode_batch, self.decode_context, self.decode_ms)

    def tokens_s(self, n: float) -> float:
        """Seconds of the token-wise ops at n tokens."""
        return 1e-3 * interpolate(self.tokens, self.tokens_ms, n)

    def logits_s(self, rows: float) -> float:
        """Seconds of the LM head over `rows` sampled rows."""
        return 1e-3 * interpolate(self.logits_rows, self.logits_ms, rows)

    def prefill_attention_s(self, new: float, prefix: float) -> float:
        """Seconds of one prefill chunk's attention: `new` tokens after `prefix` cached ones."""
        return 1e-3 * interpolate_2d(self.prefill_q, self.prefill_prefix, self.prefill_ms, new, prefix)

    def decode_attention_s(self, decodes: float, context: float) -> float:
        """Seconds of `decodes` decodes' attention at `context` tokens each."""
        return 1e-3 * interpolate_2d(self.decode_batch, self.decode_context, self.decode_ms, decodes, context)

    # What the simulator reads per step, worked out once per table (runs and calibrations share a table).

    @cached_property
    def dense_tokens_s(self) -> tuple[float, ...]:
        """`tokens_s` for 0..DENSE_TOKENS tokens (0 costs nothing), read by index. As the database has them:
        where a GEMM's kernel or tile size changes, one more token can cost up to 7% less (4,097 tokens
        against 4,096 for Qwen3-14B on the H100), and the step follows."""
        return (0.0, *(self.tokens_s(n) for n in range(1, DENSE_TOKENS + 1)))

    @cached_property
    def dense_logits_s(self) -> tuple[float, ...]:
        """`logits_s` for 0..DENSE_ROWS rows."""
        return (0.0, *(self.logits_s(n) for n in range(1, DENSE_ROWS + 1)))

    @cached_property
    def prefill_memo_s(self) -> dict[tuple[int, int], float]:
        """`prefill_attention_s` by (new, prefix), filled as shapes are asked for: a run repeats few."""
        return {}

    @cached_property
    def decode_rows_s(self) -> dict[int, list[float]]:
        """Per decode count, the decode-attention seconds along the context grid, filled as counts are asked
        for (reading a row linearly is the bilinear reading at that count)."""
        return {}

    def decode_row_s(self, decodes: int) -> list[float]:
        row = self.decode_rows_s.get(decodes)
        if row is None:
            i, share = _bracket(self.decode_batch, decodes)
            low, high = self.decode_ms[i], self.decode_ms[i + 1]
            row = self.decode_rows_s[decodes] = [1e-3 * max(0.0, a + share * (b - a))
                                                 for a, b in zip(low, high, strict=True)]
        return row


def _check_grid(name: str, grid: Sequence[int], *, minimum: int) -> None:
    if len(grid) < 2 or list(grid) != sorted(set(grid)) or grid[0] < minimum:
        raise ValueError(f"the kernel table's {name} grid must hold at least two increasing points "
                         f"from {minimum}, got {list(grid)[:8]}")


def _check_grid_2d(name: str, rows: Sequence[int], cols: Sequence[int], values: Sequence[Sequence[float]]) -> None:
    _check_grid(f"{name} rows", rows, minimum=1)
    _check_grid(f"{name} columns", cols, minimum=0)
    if len(values) != len(rows):
        raise ValueError(f"the kernel table's {name} grid has {len(values)} rows for {len(rows)} points")
    for row in values:
        _check_values(name, row, len(cols))


def _check_values(name: str, values: Sequence[float], size: int) -> None:
    if len(values) != size:
        raise ValueError(f"the kernel table's {name} has {len(values)} values for {size} grid points")
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"the kernel table's {name} times must be finite and non-negative")


def _bracket(grid: Sequence[int], x: float) -> tuple[int, float]:
    """The interval of `grid` that x falls in (the first or last beyond its ends) and x's share of it."""
    i = bisect.bisect_right(grid, x) - 1
    i = min(max(i, 0), len(grid) - 2)
    lo, hi = grid[i], grid[i + 1]
    return i, (x - lo) / (hi - lo)


def interpolate(grid: Sequence[int], values: Sequence[float], x: float) -> float:
    """values read at x: linear between grid points, the end interval's slope beyond the ends (never below 0)."""
    i, share = _bracket(grid, x)
    return max(0.0, values[i] + share * (values[i + 1] - values[i]))


def interpolate_2d(rows: Sequence[int], cols: Sequence[int], values: Sequence[Sequence[float]],
                   x: float, y: float) -> float:
    """values[row][col] read bilinearly at (x, y), extended linearly beyond the grid (never below 0)."""
    i, sx = _bracket(rows, x)
    j, sy = _bracket(cols, y)
    low, high = values[i], values[i + 1]
    at_low = low[j] + sy * (low[j + 1] - low[j])
    at_high = high[j] + sy * (high[j + 1] - high[j])
    return max(0.0, at_low + sx * (at_high - at_low))


def _rounded(values: Sequence[float]) -> list[float]:
    return [float(f"{v:.6g}") for v in values]


def format_kernel_table(table: KernelTable) -> str:
    """The JSON file `parse_kernel_table` reads, its header first (times to 6 significant digits)."""
    data = {"format": FORMAT, "provenance": table.provenance, "shapes": table.shapes,
            "tokens": list(table.tokens), "tokens_ms": _rounded(table.tokens_ms),
            "logits_rows": list(table.logits_rows), "logits_ms": _rounded(table.logits_ms),
            "prefill_q": list(table.prefill_q), "prefill_prefix": list(table.prefill_prefix),
            "prefill_ms": [_rounded(row) for row in table.prefill_ms],
            "decode_batch": list(table.decode_batch), "decode_context": list(table.decode_context),
            "decode_ms": [_rounded(row) for row in table.decode_ms]}
    return json.dumps(data, indent=1) + "\n"


def parse_kernel_table(text: str, source: str = "kernel table") -> KernelTable:
    """A table from its JSON, refusing another format's or a damaged one with `source` named."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{source} is not JSON: {error}") from error
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise ValueError(f"{source} has format {found!r}; this retrybench reads format {FORMAT}")
    try:
        return KernelTable(
            provenance=cast(Provenance, data["provenance"]), shapes=cast(Shapes, data["shapes"]),
            tokens=_ints(data["tokens"]), tokens_ms=_floats(data["tokens_ms"]),
            logits_rows=_ints(data["logits_rows"]), logits_ms=_floats(data["logits_ms"]),
            prefill_q=_ints(data["prefill_q"]), prefill_prefix=_ints(data["prefill_prefix"]),
            prefill_ms=tuple(_floats(row) for row in data["prefill_ms"]),
            decode_batch=_ints(data["decode_batch"]), decode_context=_ints(data["decode_context"]),
            decode_ms=tuple(_floats(row) for row in data["decode_ms"]))
    except (KeyError, TypeError) as error:
        raise ValueError(f"{source} lacks or mistypes {error}") from error


def _ints(values: Sequence[object]) -> tuple[int, ...]:
    return tuple(int(cast(int, v)) for v in values)


def _floats(values: Sequence[object]) -> tuple[float, ...]:
    return tuple(float(cast(float, v)) for v in values)
