"""GPU and model profiles: KV capacity and the time of one engine step, from published figures.

A step's time is a roofline plus fixed costs:

    t = fixed_s + per_seq_s * seqs
        + max(GEMM FLOPs / (peak * compute_eff) + attention FLOPs / (peak * attention_eff),
              bytes / (bandwidth * memory_eff))

GEMM FLOPs count the linear layers for every scheduled token and the LM head for each token
sampled; attention FLOPs count causal attention over each token's context (its kernels run at a
lower fraction of peak than GEMMs, hence a constant of its own); bytes count the weights once per
step and every scheduled execution's KV context.

Fitted numbers (scripts/fit_profiles.py), from the paper's calibration figures alone (Section 3.2):
the GPU's fixed step cost and memory efficiency with Qwen2.5-7B's GEMM efficiency (to its C-hat,
median TTFT and E2E at 1.52 calls/s), then each other model's GEMM efficiency (to its C-hat): GEMM
efficiency differs with matrix shapes. per_seq_s and attention_eff are priors, not fitted.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from retrybench.config import EngineConfig

__all__ = ["GPUS", "MODELS", "EngineProfile", "GpuSpec", "ModelSpec", "StepCosts", "fitted_profiles", "profile_for"]

GIB = 1024**3


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    name: str
    memory_bytes: float  # what the driver reports as total memory
    bandwidth_bytes_per_s: float
    bf16_flops_per_s: float  # dense
    # What vLLM's platform sets on its own: the CPU build uses 128-token blocks, runs one batch at a
    # time and takes its KV cache size from VLLM_CPU_KVCACHE_SPACE instead of memory profiling.
    block_size: int = 16
    async_scheduling: bool = True
    kv_cache_bytes: float | None = None

    def engine_defaults(self) -> EngineConfig:
        """vLLM's engine arguments on this platform (the paper's, with the platform's own settings)."""
        return EngineConfig(block_size=self.block_size, async_scheduling=self.async_scheduling)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Architecture figures from each model's published config.json (bf16 weights)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype_bytes: int = 2

    @property
    def layer_params(self) -> int:
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        attention = self.hidden * q_out + 2 * self.hidden * kv_out + q_out * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp)

    @property
    def params(self) -> int:
        return self.layer_params + 2 * self.vocab * self.hidden  # untied embedding and LM head

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attention_flops_per_token_pair(self) -> int:
        """QK^T and PV for one query token against one context token, over all layers."""
        return 4 * self.layers * self.heads * self.head_dim


GPUS: dict[str, GpuSpec] = {
    # NVIDIA H100 SXM5 80 GB HBM3: 81,559 MiB reported, 3.35 TB/s, 989 TFLOP/s dense BF16.
    "h100": GpuSpec(name="NVIDIA H100 80GB HBM3 (SXM)", memory_bytes=81_559 * 1024**2,
                    bandwidth_bytes_per_s=3.35e12, bf16_flops_per_s=989.4e12),
    # NVIDIA H200 SXM 141 GB HBM3e: 143,771 MiB reported, 4.8 TB/s, same compute as H100.
    "h200": GpuSpec(name="NVIDIA H200 (SXM)", memory_bytes=143_771 * 1024**2,
                    bandwidth_bytes_per_s=4.8e12, bf16_flops_per_s=989.4e12),
    # vLLM's CPU build on a 2-core x86 machine with VLLM_CPU_KVCACHE_SPACE=2 (the real-engine tests'),
    # seen at time scale 0.1: its clocks are trace seconds, so the peaks are a tenth of the nominal
    # wall-clock ones (2 cores x 2 AVX-512 FMA units x 32 bf16 lanes x 2 x ~2 GHz; one DDR channel).
    # The fitted efficiencies absorb what the nominal figures miss (scripts/fit_profiles.py --gpu cpu).
    "cpu": GpuSpec(name="CPU, 2 cores (vLLM CPU build), time scale 0.1", memory_bytes=24 * GIB,
                   bandwidth_bytes_per_s=2e9, bf16_flops_per_s=0.05e12, block_size=128, async_scheduling=False,
                   kv_cache_bytes=2 * GIB),
}

MODELS: dict[str, ModelSpec] = {
    "qwen2.5-7b-instruct": ModelSpec(name="Qwen/Qwen2.5-7B-Instruct", layers=28, hidden=3584,
                                     intermediate=18944, heads=28, kv_heads=4, head_dim=128,
                                     vocab=152_064),
    "qwen3-14b": ModelSpec(name="Qwen/Qwen3-14B", layers=40, hidden=5120, intermediate=17408,
                           heads=40, kv_heads=8, head_dim=128, vocab=151_936),
    "llama-3.1-8b-instruct": ModelSpec(name="meta-llama/Llama-3.1-8B-Instruct", layers=32,
                                       hidden=4096, intermediate=14336, heads=32, kv_heads=8,
                                       head_dim=128, vocab=128_256),
    # `retrybench make-tiny-model`'s default: what the real-engine tests serve on a CPU.
    "tiny-llama": ModelSpec(name="retrybench tiny Llama (random weights)", layers=2, hidden=256, intermediate=512,
                            heads=4, kv_heads=4, head_dim=64, vocab=32_000),
}


@dataclass(frozen=True, kw_only=True)
class StepCosts:
    """The fitted constants of one GPU (see scripts/fit_profiles.py)."""

    fixed_s: float
    per_seq_s: float
    compute_eff: float  # of GEMMs
    attention_eff: float
    memory_eff: float


@cache
def _fitted() -> dict[str, Any]:
    text = (resources.files("retrybench") / "engine" / "fitted.toml").read_text()
    return tomllib.loads(text)


def fitted_profiles() -> list[tuple[str, str]]:
    """The (GPU, model) pairs with fitted constants: the paper's models on the GPUs, the tiny Llama on
    the CPU build."""
    return [(gpu, model) for gpu, table in _fitted()["gpu"].items() for model in table["compute_eff"]]


def fitted_costs(gpu: str, model: str) -> StepCosts:
    if (gpu, model) not in fitted_profiles():
        raise ValueError(f"no fitted step costs for {model} on {gpu}; fitted: "
                         + ", ".join(f"{m} on {g}" for g, m in fitted_profiles()))
    table = _fitted()["gpu"][gpu]
    return StepCosts(fixed_s=float(table["fixed_s"]), per_seq_s=float(table["per_seq_s"]),
                     compute_eff=float(table["compute_eff"][model]),
                     attention_eff=float(table["attention_eff"]), memory_eff=float(table["memory_eff"]))


def _non_kv_bytes(model: ModelSpec, engine: EngineConfig) -> float:
    """What vLLM's memory profiling reserves beside the weights before sizing the KV cache.

    The profile run's activation peak at max_num_batched_tokens (the MLP's gate/up output and a
    few hidden-size buffers in bf16), the sampler's fp32 logits for max_num_seqs, and the CUDA
    context, NCCL and CUDA-graph pools (about 1.5 GiB on these GPUs).
    """
    tokens = engine.max_num_batched_tokens
    activations = tokens * (4 * model.intermediate + 8 * model.hidden) * model.dtype_bytes
    logits = 2 * engine.max_num_seqs * model.vocab * 4
    return activations + logits + 1.5 * GIB


@dataclass(frozen=True, kw_only=True)
class EngineProfile:
    """One engine build: GPU x model x engine arguments, with its step-time model."""

    gpu_key: str
    model_key: str
    gpu: GpuSpec
    model: ModelSpec
    engine: EngineConfig
    costs: StepCosts

    @property
    def kv_blocks(self) -> int:
        if self.gpu.kv_cache_bytes is not None:
            free = self.gpu.kv_cache_bytes
        else:
            budget = self.gpu.memory_bytes * self.engine.gpu_memory_utilization
            free = budget - self.model.weight_bytes - _non_kv_bytes(self.model, self.engine)
        per_block = self.engine.block_size * self.model.kv_bytes_per_token
        blocks = int(free // per_block)
        if blocks < 1:
            raise ValueError(f"{self.model.name} does not fit on {self.gpu.name} at this utilization")
        return blocks

    def step_time_s(self, *, seqs: int, tokens: int, sampled: int, attention_pairs: float,
                    context_tokens: int) -> float:
        """Time of one step.

        tokens: tokens computed this step (prefill chunks + one per decode); sampled: executions
        that sample a token; attention_pairs: sum over computed tokens of their context length;
        context_tokens: KV tokens read, summed over the step's executions.
        """
        return self.step_timer()(seqs, tokens, sampled, attention_pairs, context_tokens)

    def step_timer(self) -> Callable[[int, int, int, float, int], float]:
        """`step_time_s` with this profile's constants worked out once: the simulator times every
        step, and the constants (derived properties) cost more to recompute than the formula.
        Arguments are positional: (seqs, tokens, sampled, attention_pairs, context_tokens)."""
        model = self.model
        costs = self.costs
        peak = self.gpu.bf16_flops_per_s
        gemm_per_token = 2.0 * model.layer_params
        gemm_per_sample = 2.0 * model.vocab * model.hidden
        attention_per_pair = model.attention_flops_per_token_pair
        weight_bytes = model.weight_bytes
        kv_bytes_per_token = model.kv_bytes_per_token
        gemm_flops_per_s = peak * costs.compute_eff
        attention_flops_per_s = peak * costs.attention_eff
        bytes_per_s = self.gpu.bandwidth_bytes_per_s * costs.memory_eff
        fixed_s = costs.fixed_s
        per_seq_s = costs.per_seq_s

        def step_time_s(seqs: int, tokens: int, sampled: int, attention_pairs: float, context_tokens: int) -> float:
            gemm = gemm_per_token * tokens + gemm_per_sample * sampled
            attention = attention_per_pair * attention_pairs
            data = weight_bytes + kv_bytes_per_token * context_tokens
            compute_s = gemm / gemm_flops_per_s + attention / attention_flops_per_s
            memory_s = data / bytes_per_s
            return fixed_s + per_seq_s * seqs + (compute_s if compute_s >= memory_s else memory_s)

        return step_time_s


def profile_for(model: str, gpu: str = "h100", engine: EngineConfig | None = None,
                costs: StepCosts | None = None) -> EngineProfile:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    return EngineProfile(gpu_key=gpu, model_key=model, gpu=GPUS[gpu], model=MODELS[model],
                         engine=engine or GPUS[gpu].engine_defaults(), costs=costs or fitted_costs(gpu, model))
