"""Time the phases of one transformer layer of a model on this machine's accelerator (or its CPU), with
random weights: a step-cost table measured on real hardware, for the engine model's priors.

A forward pass runs its phases one after another, so each is timed on its own: the linear layers (QKV,
output, gate-up and down projections) and the elementwise ops (residual adds and RMSNorms, the MLP's
activation) at prefill token counts, prefill attention over a chunk, decode attention of a batch at
several context lengths (a read of the KV cache), and the LM head. Each row of the CSV gives the phase,
its shape, the median seconds over repetitions, and the FLOPs and bytes it moves, so that a fit can read
an efficiency per token count instead of assuming one. Needs PyTorch only (no vLLM); CUDA in bf16 where
present, else the CPU in float32. PyTorch runs the elementwise ops as separate kernels where vLLM fuses
them, so those rows are an upper bound.

`scripts/fit_profiles.py --layer-profile CSV` fits the step-cost constants over this table (its linear
and elementwise rows) instead of the packaged H100 profile.

    python scripts/profile_steps.py --model qwen2.5-7b-instruct --out h200-qwen2.5-7b.csv
    python scripts/profile_steps.py --model tiny-llama --quick --out tiny.csv     # seconds, on a CPU
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from retrybench.engine.profiles import MODELS, ModelSpec  # noqa: E402  (after the path above)

FIELDS = ("device", "dtype", "model", "phase", "tokens", "batch", "context", "seconds", "flops", "bytes")
PREFILL_TOKENS = (1, 16, 64, 256, 512, 1024, 2048, 4096, 8192)
DECODE_BATCHES = (1, 8, 32, 128, 256)
CONTEXTS = (1024, 4096, 12288)
QUICK = {"prefill": (16, 64, 256), "batches": (1, 8), "contexts": (256,)}


def _timer(device: torch.device) -> Callable[[Callable[[], Any], int], float]:
    """Median seconds of `fn` over `reps` runs after two warm-ups, synchronised on the device."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed(fn: Callable[[], Any], reps: int) -> float:
        for _ in range(2):
            fn()
        sync()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return timed


def _linears(m: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of one decoder layer."""
    qkv = (m.heads + 2 * m.kv_heads) * m.head_dim
    return {"linear_qkv": (m.hidden, qkv), "linear_out": (m.heads * m.head_dim, m.hidden),
            "linear_gate_up": (m.hidden, 2 * m.intermediate), "linear_down": (m.intermediate, m.hidden)}


def profile(m: ModelSpec, key: str, device: torch.device, dtype: torch.dtype, quick: bool,
            reps: int) -> Iterator[dict[str, Any]]:
    """The rows of the table, one phase and shape at a time."""
    timed = _timer(device)
    size = torch.finfo(dtype).bits // 8
    base = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "dtype": str(dtype).removeprefix("torch."), "model": key}
    prefill = QUICK["prefill"] if quick else PREFILL_TOKENS
    for name, (n_in, n_out) in _linears(m).items():
        weight = torch.randn(n_out, n_in, device=device, dtype=dtype)
        for tokens in prefill:
            x = torch.randn(tokens, n_in, device=device, dtype=dtype)
            seconds = timed(lambda x=x, w=weight: F.linear(x, w), reps)
            yield {**base, "phase": name, "tokens": tokens, "batch": 1, "context": 0, "seconds": seconds,
                   "flops": 2 * tokens * n_in * n_out, "bytes": size * (n_in * n_out + tokens * (n_in + n_out))}
    norm_weight = torch.ones(m.hidden, device=device, dtype=dtype)
    for tokens in prefill:  # per layer: a residual add and an RMSNorm before attention and again before the MLP
        x = torch.randn(tokens, m.hidden, device=device, dtype=dtype)
        residual = torch.randn(tokens, m.hidden, device=device, dtype=dtype)

        def hidden_ops(x: torch.Tensor = x, residual: torch.Tensor = residual) -> None:
            for _ in range(2):
                F.rms_norm(x + residual, (m.hidden,), norm_weight, 1e-6)

        yield {**base, "phase": "elementwise_hidden", "tokens": tokens, "batch": 1, "context": 0,
               "seconds": timed(hidden_ops, reps), "flops": 2 * 5 * tokens * m.hidden,
               "bytes": size * 2 * 5 * tokens * m.hidden}
    for tokens in prefill:  # the MLP's activation: SiLU of the gate times the up projection
        gate_up = torch.randn(tokens, 2 * m.intermediate, device=device, dtype=dtype)
        seconds = timed(lambda g=gate_up: F.silu(g[:, :m.intermediate]) * g[:, m.intermediate:], reps)
        yield {**base, "phase": "mlp_activation", "tokens": tokens, "batch": 1, "context": 0, "seconds": seconds,
               "flops": 5 * tokens * m.intermediate, "bytes": size * 3 * tokens * m.intermediate}
    for tokens in prefill:  # a prompt chunk attending to itself (no earlier context)
        q = torch.randn(1, m.heads, tokens, m.head_dim, device=device, dtype=dtype)
        kv = torch.randn(1, m.heads, tokens, m.head_dim, device=device, dtype=dtype)
        seconds = timed(lambda q=q, kv=kv: F.scaled_dot_product_attention(q, kv, kv, is_causal=True), reps)
        yield {**base, "phase": "attention_prefill", "tokens": tokens, "batch": 1, "context": tokens,
               "seconds": seconds, "flops": 2 * m.heads * m.head_dim * tokens * tokens,
               "bytes": size * 3 * m.heads * tokens * m.head_dim}
    for batch in QUICK["batches"] if quick else DECODE_BATCHES:
        for context in QUICK["contexts"] if quick else CONTEXTS:
            q = torch.randn(batch, m.heads, 1, m.head_dim, device=device, dtype=dtype)
            kv = torch.randn(batch, m.heads, context, m.head_dim, device=device, dtype=dtype)
            seconds = timed(lambda q=q, kv=kv: F.scaled_dot_product_attention(q, kv, kv), reps)
            yield {**base, "phase": "attention_decode", "tokens": batch, "batch": batch, "context": context,
                   "seconds": seconds, "flops": 4 * batch * m.heads * m.head_dim * context,
                   "bytes": size * 2 * batch * m.kv_heads * context * m.head_dim}
    head = torch.randn(m.vocab, m.hidden, device=device, dtype=dtype)
    for batch in QUICK["batches"] if quick else DECODE_BATCHES:  # one row per sequence: its last token
        x = torch.randn(batch, m.hidden, device=device, dtype=dtype)
        seconds = timed(lambda x=x: F.linear(x, head), reps)
        yield {**base, "phase": "lm_head", "tokens": batch, "batch": batch, "context": 0, "seconds": seconds,
               "flops": 2 * batch * m.hidden * m.vocab, "bytes": size * m.hidden * m.vocab}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    parser.add_argument("--quick", action="store_true", help="a few small shapes (a CPU smoke run)")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per shape (median kept)")
    parser.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if present)")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = list(profile(MODELS[args.model], args.model, device, dtype, args.quick, args.reps))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows on {rows[0]['device']} ({rows[0]['dtype']}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
