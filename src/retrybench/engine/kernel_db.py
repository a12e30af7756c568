"""Build a kernel table (engine/kernel_table.py) from NVIDIA's database of measured vLLM kernel latencies.

`aiconfigurator-core` (the `kernels` extra) compiles a model, given as a directory holding its
config.json, against one GPU system's measurements, then prices any op of the model's context
(prefill) or generation (decode) phase at a shape. One call costs microseconds here, but the
simulator times tens of thousands of steps a run, so the table samples the database once on grids
fine enough that reading between their points stays within a fraction of a percent of asking it
(tests/engine/test_kernel_tables.py checks that against the database itself).

Op positions are the database's op lists for dense decoder models (LlamaForCausalLM and its kin):
the token-wise ops are every op but attention and the LM head; tensor parallelism is 1, so the
all-reduce and pipeline ops cost nothing.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from retrybench.engine.kernel_table import KernelTable, Provenance, Shapes

__all__ = ["BACKEND", "DatabaseSteps", "KernelDatabaseMissing", "breakpoints", "build_kernel_table", "database_gpus",
           "database_version", "model_config", "short_gpu_name"]

BACKEND = "vllm"
PACKAGE = "aiconfigurator-core"
INSTALL_HINT = "pip install 'retrybench[kernels]'"

# The ops of the database's dense-decoder op lists, by name (context_*/generation_* prefix removed).
ATTENTION = "attention"
LOGITS = "logits_gemm"

MAX_TOKENS = 16_384  # token-wise ops: up to twice the paper's step budget; beyond, the last slope
MAX_ROWS = 1_024  # the LM head's rows (sampled executions)
MAX_PREFILL = 16_384  # one chunk's new tokens
MAX_CONTEXT = 131_072  # prefixes and decode contexts: the longest context the table reads exactly


class KernelDatabaseMissing(RuntimeError):
    """The `kernels` extra is not installed, or does not cover the GPU asked for."""


TOLERANCE = 0.001  # a grid keeps the points that linear reading between its others would miss by more
DECODE_TOLERANCE = 0.003


def breakpoints(xs: Sequence[int], ys: Sequence[float], tolerance: float = TOLERANCE) -> list[int]:
    """The positions of (xs, ys) that a piecewise-linear curve needs to stay within `tolerance` (relative)
    of every point: the database's own measured shapes and the tile-size steps between them, found by
    sampling densely and making each segment as long as the line through its ends holds (found by
    doubling, then bisection)."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    kept, start, last = [0], 0, len(xs) - 1
    while start < last:
        good, step = start + 1, 1
        while good + step <= last and _holds(x, y, start, good + step, tolerance):
            good, step = good + step, step * 2
        bad = min(good + step, last + 1)
        while bad - good > 1:
            middle = (good + bad) // 2
            if _holds(x, y, start, middle, tolerance):
                good = middle
            else:
                bad = middle
        kept.append(good)
        start = good
    return kept


def _holds(x: np.ndarray, y: np.ndarray, start: int, end: int, tolerance: float) -> bool:
    """Whether the line from point `start` to point `end` stays within `tolerance` of those between."""
    span = slice(start, end + 1)
    line = y[start] + (x[span] - x[start]) * (y[end] - y[start]) / (x[end] - x[start])
    return bool(np.all(np.abs(line - y[span]) <= tolerance * np.maximum(np.abs(y[span]), 1e-9)))


def _sample_axis(points: Sequence[int], curves: Iterable[Sequence[float]],
                 tolerance: float = TOLERANCE) -> tuple[int, ...]:
    """The points of a dense axis that every curve along it needs (the union of their breakpoints)."""
    kept: set[int] = set()
    for curve in curves:
        kept.update(points[i] for i in breakpoints(points, curve, tolerance))
    return tuple(sorted(kept))


def _dense(upto: int, *, start: int = 1, step_after: int = 4096, step: int = 16) -> list[int]:
    """Every integer to `step_after`, then every `step`-th to `upto` (and `upto`)."""
    points = list(range(start, min(upto, step_after) + 1))
    points += list(range(step_after + step, upto, step))
    if points[-1] != upto:
        points.append(upto)
    return points


# Where the 2-D grids are sampled densely along one axis to find the other's breakpoints.
PROBE_PREFIXES = (0, 2_048, 12_288)
PROBE_QUERIES = (16, 1_024, 8_192)
PROBE_CONTEXTS = (1_024, 4_096, 12_288, 24_576)
PROBE_BATCHES = (1, 8, 32, 128, 256)


def model_config(shapes: Shapes) -> dict[str, Any]:
    """The config.json the database compiles a model from: the fields its dense-decoder path reads."""
    return {"architectures": [shapes["architecture"]], "hidden_size": shapes["hidden"],
            "intermediate_size": shapes["intermediate"], "num_hidden_layers": shapes["layers"],
            "num_attention_heads": shapes["heads"], "num_key_value_heads": shapes["kv_heads"],
            "head_dim": shapes["head_dim"], "vocab_size": shapes["vocab"], "max_position_embeddings": MAX_CONTEXT,
            "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def database_version() -> str:
    """The installed package's version, or KernelDatabaseMissing naming how to install it."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError as error:
        raise KernelDatabaseMissing(f"pricing steps from measured kernels needs {PACKAGE}: {INSTALL_HINT}") from error


@contextmanager
def _quiet() -> Iterator[None]:
    """The database logs a line per fallback table it loads; a build prints its own summary instead."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _engine(shapes: Shapes, system: str, backend_version: str) -> Any:
    from aiconfigurator_core.sdk.engine import EngineHandle

    with tempfile.TemporaryDirectory(prefix="retrybench-model-") as directory:
        (Path(directory) / "config.json").write_text(json.dumps(model_config(shapes)))
        return EngineHandle.compile(directory, system, BACKEND, backend_version=backend_version, tp_size=1,
                                    gemm_quant_mode="bfloat16", kvcache_quant_mode="bfloat16",
                                    fmha_quant_mode="bfloat16")


def _op_positions(engine: Any) -> tuple[list[int], int, int]:
    """(token-wise op positions, attention's, the LM head's) in the context op list, by name."""
    names: list[str] = []
    while True:  # the op list's length is not exposed: ask position by position until it ends
        try:
            op = engine.evaluate_context_ops([len(names)], batch_size=1, s=16)[0]
        except ValueError:
            break
        names.append(str(op[0]).removeprefix("context_"))
    if ATTENTION not in names or LOGITS not in names:
        raise KernelDatabaseMissing(f"the database's op list for this model lacks attention or the LM head: {names}")
    attention, logits = names.index(ATTENTION), names.index(LOGITS)
    return [i for i in range(len(names)) if i not in (attention, logits)], attention, logits


def build_kernel_table(shapes: Shapes, system: str, backend_version: str) -> KernelTable:
    """Sample the database for one model on one GPU system (a few seconds)."""
    version = database_version()
    with _quiet():
        try:
            engine = _engine(shapes, system, backend_version)
        except Exception as error:  # the database names what it cannot price (architecture, system, version)
            raise KernelDatabaseMissing(f"the kernel database cannot price {shapes['architecture']} on {system} "
                                        f"(vLLM {backend_version}): {error}") from error
        token_ops, attention, logits = _op_positions(engine)
        sources: dict[str, set[str]] = {"tokens": set(), "logits": set(), "prefill": set(), "decode": set()}

        def priced(family: str, values: Iterable[Sequence[Any]]) -> float:
            total = 0.0
            for op in values:
                total += float(op[1])
                sources[family].add(str(op[3]))
            return total

        def tokens(n: int) -> float:
            return priced("tokens", engine.evaluate_context_ops(token_ops, batch_size=1, s=n))

        def head(m: int) -> float:
            return priced("logits", engine.evaluate_generation_ops([logits], batch_size=m, s=1))

        def prefill(q: int, p: int) -> float:
            return priced("prefill", engine.evaluate_context_ops([attention], batch_size=1, s=q, prefix=p))

        def decode(b: int, s: int) -> float:
            return priced("decode", engine.evaluate_generation_ops([attention], batch_size=b, s=s))

        token_points, row_points = list(range(1, MAX_TOKENS + 1)), list(range(1, MAX_ROWS + 1))
        query_points, context_points = _dense(MAX_PREFILL), _dense(MAX_CONTEXT, step_after=2048, step=256)
        prefix_points = [0, *context_points]
        token_grid = _sample_axis(token_points, [[tokens(n) for n in token_points]])
        row_grid = _sample_axis(row_points, [[head(m) for m in row_points]])
        q_grid = _sample_axis(query_points, [[prefill(q, p) for q in query_points] for p in PROBE_PREFIXES])
        p_grid = _sample_axis(prefix_points, [[prefill(q, p) for p in prefix_points] for q in PROBE_QUERIES])
        # Decode attention is the one slow query (about 0.2 ms) and a smooth curve: a looser fit keeps it few.
        b_grid = _sample_axis(row_points, [[decode(b, s) for b in row_points] for s in PROBE_CONTEXTS],
                              DECODE_TOLERANCE)
        s_grid = _sample_axis(context_points, [[decode(b, s) for s in context_points] for b in PROBE_BATCHES],
                              DECODE_TOLERANCE)
        tokens_ms = [tokens(n) for n in token_grid]
        logits_ms = [head(m) for m in row_grid]
        prefill_ms = [[prefill(q, p) for p in p_grid] for q in q_grid]
        decode_ms = [[decode(b, s) for s in s_grid] for b in b_grid]
    provenance = Provenance(package=f"{PACKAGE} {version}", system=system, backend=BACKEND,
                            backend_version=backend_version,
                            sources={family: sorted(seen) for family, seen in sources.items()})
    return KernelTable(provenance=provenance, shapes=shapes, tokens=token_grid, tokens_ms=tuple(tokens_ms),
                       logits_rows=row_grid, logits_ms=tuple(logits_ms), prefill_q=q_grid, prefill_prefix=p_grid,
                       prefill_ms=tuple(tuple(row) for row in prefill_ms), decode_batch=b_grid,
                       decode_context=s_grid, decode_ms=tuple(tuple(row) for row in decode_ms))


class DatabaseSteps:
    """The database asked directly for one step's kernel time (no table): what the tables are checked
    against. A step is its prefill chunks (new tokens, prefix) and its decodes' contexts."""

    def __init__(self, shapes: Shapes, system: str, backend_version: str) -> None:
        with _quiet():
            self._engine = _engine(shapes, system, backend_version)
            self._token_ops, self._attention, self._logits = _op_positions(self._engine)

    def step_ms(self, chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int], sampled: int) -> float:
        engine = self._engine
        tokens = sum(q for q, _p in chunks) + len(decode_contexts)
        with _quiet():
            total = sum(float(op[1]) for op in engine.evaluate_context_ops(self._token_ops, batch_size=1, s=tokens))
            if sampled:
                total += float(engine.evaluate_generation_ops([self._logits], batch_size=sampled, s=1)[0][1])
            for q, p in chunks:
                total += float(engine.evaluate_context_ops([self._attention], batch_size=1, s=q, prefix=p)[0][1])
            if decode_contexts:
                mean = round(sum(decode_contexts) / len(decode_contexts))
                total += float(engine.evaluate_generation_ops([self._attention], batch_size=len(decode_contexts),
                                                              s=mean)[0][1])
        return total

    def prefill_step_ms(self, tokens: int) -> float:
        """The database's own sum for a step that prefills `tokens` new tokens of one execution."""
        with _quiet():
            return float(self._engine.mixed_step_latency(tokens, 0, tokens, 2, 0))

    def decode_step_ms(self, decodes: int, context: int) -> float:
        """The database's own sum for a step of `decodes` decodes at `context` tokens."""
        with _quiet():
            return float(self._engine.decode_step_latency(decodes, context, 2))


def database_gpus() -> dict[str, dict[str, Any]]:
    """Every GPU system the installed database has vLLM kernel data for, by the short name a user types
    (`a100_sxm` -> `a100`, `rtx_pro_6000_server` -> `rtx-pro-6000`): its memory, bandwidth and dense bf16
    FLOP/s from the system's YAML, and the newest vLLM version with both GEMM and attention data.
    What scripts/build_gpu_registry.py writes to engine/gpus.toml."""
    database_version()
    import yaml  # type: ignore[import-untyped]  # the database's own dependency
    from aiconfigurator_core import __file__ as package_init

    systems = Path(package_init).parent / "systems"
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(systems.glob("*.yaml")):
        text = yaml.safe_load(path.read_text())
        if not isinstance(text, dict) or "gpu" not in text or "data_dir" not in text:
            continue
        data = systems / str(text["data_dir"])
        versions = [set(_versions(data / family / BACKEND)) for family in ("gemm", "attention")]
        common = sorted(versions[0] & versions[1], key=lambda v: tuple(int(p) for p in v.split(".")))
        if not common:
            continue
        gpu = text["gpu"]
        system = path.stem
        found[short_gpu_name(system)] = {"system": system, "vllm": common[-1], "memory_bytes": int(gpu["mem_capacity"]),
                                         "bandwidth_bytes_per_s": float(gpu["mem_bw"]),
                                         "bf16_flops_per_s": float(gpu["bfloat16_tc_flops"])}
    return found


def _versions(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []


def short_gpu_name(system: str) -> str:
    """The name a user types for a database system: its form factor's suffix dropped, dashes for underscores."""
    for suffix in ("_sxm", "_server"):
        system = system.removesuffix(suffix)
    return system.replace("_", "-")
