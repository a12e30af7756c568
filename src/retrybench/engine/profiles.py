"""GPU and model profiles: KV capacity and the time of one engine step.

Two step models price a step (`EngineProfile.step_model`):

- `kernels`, the default wherever NVIDIA's database of measured vLLM kernel latencies has the GPU:
  every kernel's time read from the model's kernel table on that GPU (engine/kernel_steps.py,
  engine/kernel_table.py), plus the host's fixed and per-sequence costs, the only fitted part;
- `roofline`, kept for comparison and for vLLM's CPU build (which the database does not cover): the
  rooflines and priors below.

A forward pass runs its kernels one after the other on one stream, so a step's time is the sum of
its phases, each bound by its own roofline (compute against memory), plus host costs:

    t = fixed_s + per_seq_s * seqs
        + linear(tokens)            the layers' projections and MLP, over every scheduled token
        + elementwise(tokens)       norms, rotary embedding, activation, residual adds
        + lm_head(sampled)          the LM head, over the one row each sampling execution keeps
        + attention(prefill chunks) + attention(decodes), each
              max(attention FLOPs / (peak * attention_eff), KV bytes read / (bandwidth * memory_eff))

Linear layers (and the LM head) cost what a measured profile says, not one efficiency: vLLM runs
them as cuBLAS GEMMs, whose time at n tokens is the roofline max(FLOPs / peak, weights / bandwidth)
times a measured ratio r(n): about 1.3 where the weight read or the FLOPs bind, up to 2.2 at the
knee between them (n near peak / bandwidth, 256-768 tokens on an H100). r(n) comes from Vidur's
H100 operator profile of Llama-2-7B (microsoft/vidur, data/profiling/compute/h100/meta-llama/
Llama-2-7b-hf/mlp.csv, medians of attn_pre_proj + attn_post_proj + mlp_up_proj + mlp_down_proj,
tensor parallel 1; h100_llama2_7b_layer_ms.csv here), read at the token count with the same
arithmetic intensity relative to the GPU's ridge point, and flat beyond its 4,096 tokens (the
per-token cost is flat from about 1,024 up). Each model's `linear_scale` is its shapes' departure
from Llama-2-7B's (prior 1). The elementwise ops are memory-bound: the same profile's per-token
cost from 1,024 tokens up (0.09 us a token a layer), scaled by hidden and intermediate size and by
bandwidth; their per-kernel floors at small steps are launch costs that vLLM's CUDA graphs remove.

Prefill and decode attention are two phases, not one roofline over the mixed batch: attention
kernels specialise their work for each phase and do not overlap a prefill's FLOPs with the decodes'
KV reads (POD-Attention, Kamath et al., ASPLOS 2025, arXiv 2410.18038, measured that fusing the two
on each multiprocessor would speed hybrid-batch attention up by 28% on average, up to 59%: the
overlap today's kernels leave out). So a decode riding in a prefill step pays its own KV read.

The roofline's fitted numbers (scripts/fit_profiles.py), from the paper's calibration figures alone
(Section 3.2): the GPU's fixed step cost and memory efficiency (of KV reads) with Qwen2.5-7B's
linear_scale (to its C-hat, median TTFT and E2E at 1.52 calls/s), then each other model's linear_scale
(to its C-hat). per_seq_s and attention_eff are priors (see fitted.toml). The kernels model's host
costs are fitted to Qwen2.5-7B's three figures alone (`fit_profiles.py --step-model kernels`).
"""

from __future__ import annotations

import bisect
import json
import tomllib
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from itertools import accumulate
from typing import NotRequired, TypedDict, cast

from retrybench.conditions.config import EngineConfig
from retrybench.engine.gpus import GIB, GPUS, GpuSpec
from retrybench.engine.kernel_steps import ChunkList, StepTimer, kernel_step_timer
from retrybench.engine.kernel_store import kernel_table
from retrybench.engine.layer_table import LayerTable, layer_table
from retrybench.engine.model_registry import is_config_model, model_spec
from retrybench.engine.models import MODELS, ModelSpec

__all__ = ["GPUS", "MODELS", "STEP_MODELS", "EngineProfile", "GpuSpec", "ModelSpec", "StepCosts",
           "default_step_model", "elementwise_s_per_token", "fitted_profiles", "gemm_roofline_ratios", "gemm_seconds",
           "kernel_host_costs", "profile_for"]

STEP_MODELS = ("kernels", "roofline")


@dataclass(frozen=True, kw_only=True)
class StepCosts:
    """The fitted constants of one GPU (see scripts/fit_profiles.py)."""

    fixed_s: float
    per_seq_s: float
    linear_scale: float  # this model's GEMM time relative to the measured profile (1: as Llama-2-7B's)
    attention_eff: float
    memory_eff: float  # of KV reads


class _FittedGpu(TypedDict):
    """One GPU's table in fitted.toml: StepCosts' constants, per model its linear_scale, and the layer
    table measured on it where there is one."""

    fixed_s: float
    per_seq_s: float
    attention_eff: float
    memory_eff: float
    linear_scale: dict[str, float]
    layer_profile: NotRequired[str]


class _FittedHost(TypedDict):
    """One GPU's host costs under the `kernels` step model (its kernels are measured, not fitted)."""

    fixed_s: float
    per_seq_s: float


class _Fitted(TypedDict):
    gpu: dict[str, _FittedGpu]
    kernels: dict[str, _FittedHost]


@cache
def _fitted() -> _Fitted:
    text = (resources.files("retrybench") / "engine" / "fitted.toml").read_text()
    return cast(_Fitted, tomllib.loads(text))  # the shape scripts/fit_profiles.py writes


def fitted_profiles() -> list[tuple[str, str]]:
    """The (GPU, model) pairs with fitted constants: the paper's models on the GPUs, the tiny Llama on
    the CPU build."""
    return [(gpu, model) for gpu, table in _fitted()["gpu"].items() for model in table["linear_scale"]]


def kernel_host_costs(gpu: str) -> tuple[StepCosts, str]:
    """The host costs of the `kernels` step model on `gpu` and the GPU they were fitted on: the H100's
    where `gpu` has none of its own (the paper's figures are the H100's). The efficiencies and the GEMM
    scale are not read by that model, so they are 1."""
    hosts = _fitted()["kernels"]
    source = gpu if gpu in hosts else "h100"
    host = hosts[source]
    return StepCosts(fixed_s=float(host["fixed_s"]), per_seq_s=float(host["per_seq_s"]), linear_scale=1.0,
                     attention_eff=1.0, memory_eff=1.0), source


def fitted_costs(gpu: str, model: str) -> StepCosts:
    """The roofline step model's fitted constants for a model on a GPU."""
    if (gpu, model) not in fitted_profiles():
        raise ValueError(f"no fitted step costs for {model} on {gpu}; fitted: "
                         + ", ".join(f"{m} on {g}" for g, m in fitted_profiles()))
    table = _fitted()["gpu"][gpu]
    return StepCosts(fixed_s=float(table["fixed_s"]), per_seq_s=float(table["per_seq_s"]),
                     linear_scale=float(table["linear_scale"][model]),
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
    step_model: str = "roofline"  # STEP_MODELS: how a step's kernels are priced
    # The GPU whose fitted host costs the `kernels` model reads: another than gpu_key where this GPU has none
    # of its own (kernel_host_costs); None under the roofline.
    host_costs_from: str | None = None

    def __post_init__(self) -> None:
        if self.step_model not in STEP_MODELS:
            raise ValueError(f"unknown step model {self.step_model!r}; known: {', '.join(STEP_MODELS)}")
        if self.step_model == "kernels" and self.gpu.kernel_system is None:
            raise ValueError(f"the kernel database has no {self.gpu.name}: its steps are priced by the roofline "
                             "(--step-model roofline)")

    @property
    def kv_blocks(self) -> int:
        if self.gpu.kv_cache_bytes is not None:
            free = self.gpu.kv_cache_bytes
        else:
            free = self.kv_budget_bytes - self.model.weight_bytes - _non_kv_bytes(self.model, self.engine)
        per_block = self.engine.block_size * self.model.kv_bytes_per_token
        blocks = int(free // per_block)
        if blocks < 1:
            raise ValueError(self.fit_message())
        return blocks

    @property
    def kv_budget_bytes(self) -> float:
        """What vLLM may use of the GPU's memory: --gpu-memory-utilization of it."""
        return self.gpu.memory_bytes * self.engine.gpu_memory_utilization

    def fit_message(self) -> str:
        """Why the model leaves no KV cache on the GPU, in the figures vLLM's memory profiling weighs."""
        utilization = self.engine.gpu_memory_utilization
        return (f"{self.model.name} does not fit on {self.gpu.name}: weights {self.model.weight_bytes / GIB:.1f} GiB "
                f"+ reserve {_non_kv_bytes(self.model, self.engine) / GIB:.1f} GiB (activations at "
                f"{self.engine.max_num_batched_tokens} batched tokens, logits, CUDA context and graphs) leave less "
                f"than one KV block ({self.engine.block_size} tokens, "
                f"{self.engine.block_size * self.model.kv_bytes_per_token / 2**20:.1f} MiB) of the budget "
                f"{self.kv_budget_bytes / GIB:.1f} GiB ({utilization:g} x {self.gpu.memory_bytes / GIB:.1f} GiB, "
                "--gpu-memory-utilization)")

    def step_time_s(self, *, seqs: int, tokens: int, sampled: int, attention_pairs: float,
                    context_tokens: int, decode_context_tokens: int = 0, chunks: ChunkList = ()) -> float:
        """Time of one step.

        tokens: tokens computed this step (prefill chunks + one per decode); sampled: executions
        that sample a token; attention_pairs: sum over computed tokens of their context length;
        context_tokens: KV tokens read, summed over the step's executions; decode_context_tokens:
        the part of both that belongs to decodes (one query token each); chunks: (new tokens, prefix)
        of each prefill chunk and slow-path decode (the `kernels` model prices each; the roofline reads
        the sums above).
        """
        return self.step_timer()(seqs, tokens, sampled, attention_pairs, context_tokens, decode_context_tokens,
                                 chunks)

    def step_timer(self) -> StepTimer:
        """`step_time_s` with this profile's constants worked out once: the simulator times every
        step, and the constants (derived properties) cost more to recompute than the formula.
        Arguments are positional: (seqs, tokens, sampled, attention_pairs, context_tokens,
        decode_context_tokens, chunks)."""
        if self.step_model == "kernels":
            gpu = self.gpu
            assert gpu.kernel_system is not None and gpu.kernel_vllm is not None  # __post_init__ checked
            shapes = json.dumps(self.model.shapes, sort_keys=True)
            return kernel_step_timer(kernel_table(shapes, gpu.kernel_system, gpu.kernel_vllm),
                                     fixed_s=self.costs.fixed_s, per_seq_s=self.costs.per_seq_s)
        return self._roofline_timer()

    def _roofline_timer(self) -> StepTimer:
        """The roofline step model (see the module docstring)."""
        model, gpu, costs = self.model, self.gpu, self.costs
        peak, bandwidth = gpu.bf16_flops_per_s, gpu.bandwidth_bytes_per_s
        ratio = gemm_roofline_ratios(gpu.layer_profile, peak / bandwidth)
        last = len(ratio) - 1
        scale = costs.linear_scale
        # Roofline seconds of the layers' GEMMs per token and for their weight read; the same for the LM head.
        layer_flop_s = scale * 2.0 * model.layer_params / peak
        # The measured profile holds the weight read's own efficiency (its ratio at small steps); without
        # one (the CPU build), the weights are read at the fitted memory efficiency, as the KV cache is.
        read_bandwidth = bandwidth / scale if gpu.layer_profile else bandwidth * costs.memory_eff
        layer_read_s = model.layer_params * model.dtype_bytes / read_bandwidth
        head_flop_s = scale * 2.0 * model.lm_head_params / peak
        head_read_s = model.lm_head_params * model.dtype_bytes / read_bandwidth
        elementwise_s = model.layers * elementwise_s_per_token(gpu.layer_profile, model.hidden, model.intermediate,
                                                               bandwidth)
        attention_s_per_pair = model.attention_flops_per_token_pair / (peak * costs.attention_eff)
        kv_s_per_token = model.kv_bytes_per_token / (bandwidth * costs.memory_eff)
        fixed_s, per_seq_s = costs.fixed_s, costs.per_seq_s

        linear_s = gemm_seconds(ratio, layer_flop_s, layer_read_s)
        head_s = gemm_seconds(ratio, head_flop_s, head_read_s)
        past_last = ratio[last]

        def step_time_s(seqs: int, tokens: int, sampled: int, attention_pairs: float, context_tokens: int,
                        decode_context_tokens: int, chunks: ChunkList = ()) -> float:
            linear = linear_s[tokens] if tokens <= last else past_last * layer_flop_s * tokens
            head = 0.0
            if sampled:
                head = head_s[sampled] if sampled <= last else past_last * head_flop_s * sampled
            prefill_flops = attention_s_per_pair * (attention_pairs - decode_context_tokens)
            prefill_kv = kv_s_per_token * (context_tokens - decode_context_tokens)
            decode_flops = attention_s_per_pair * decode_context_tokens
            decode_kv = kv_s_per_token * decode_context_tokens
            return (fixed_s + per_seq_s * seqs + linear + head + elementwise_s * tokens
                    + (prefill_flops if prefill_flops > prefill_kv else prefill_kv)
                    + (decode_flops if decode_flops > decode_kv else decode_kv))

        return step_time_s


ELEMENTWISE_FROM_TOKENS = 1024  # where the per-token cost of the elementwise ops has flattened
RATIO_TOKENS = 16_384  # ratios are tabulated per token count up to this; beyond, the last holds


@cache
def gemm_seconds(ratio: tuple[float, ...], flop_s: float, read_s: float) -> tuple[float, ...]:
    """Seconds of a GEMM for 0..RATIO_TOKENS tokens: the measured ratio times the roofline (`flop_s` a token,
    at least `read_s` for the weights). A step is never slower than a larger one (it could be padded to
    it); interpolating the ratio between profile rows, times a roofline that grows past the ridge, can
    dip by up to 0.02% of the weight read, so each is capped by the larger steps' (a suffix minimum)."""
    roofline = (r * max(flop_s * n, read_s) for n, r in enumerate(ratio))
    return tuple(accumulate(reversed(tuple(roofline)), min))[::-1]


@cache
def gemm_roofline_ratios(profile: str | LayerTable | None, ridge_tokens: float) -> tuple[float, ...]:
    """Measured GEMM time over its roofline time, for 0..RATIO_TOKENS tokens on a GPU whose ridge point
    (peak FLOPs / bandwidth: the token count where a GEMM's FLOPs and weight read take as long) is
    `ridge_tokens`. The layer table (`profile`, see engine/layer_table.py) is read at the same share of
    its own GPU's ridge point; linear between its rows, flat beyond its ends. Without one, the plain
    roofline (1)."""
    if profile is None:
        return (1.0,) * (RATIO_TOKENS + 1)
    table = layer_table(profile)
    tokens = [row[0] for row in table.rows]
    # A step is never slower than the next larger measured one: it could be padded to it (vLLM pads
    # to its CUDA-graph sizes). The suffix minimum also irons out single medians' tile-size noise.
    measured = list(accumulate((row[1] * 1e-3 for row in reversed(table.rows)), min))[::-1]
    weight_read_s = table.dtype_bytes * table.layer_params / table.bandwidth
    roofline = [max(2.0 * table.layer_params * n / table.peak_flops, weight_read_s) for n in tokens]
    ratios = [m / r for m, r in zip(measured, roofline, strict=True)]
    to_profiled = (table.peak_flops / table.bandwidth) / ridge_tokens

    def at(n: int) -> float:
        x = max(n, 1) * to_profiled
        i = bisect.bisect_left(tokens, x)
        if i == 0:
            return ratios[0]
        if i == len(tokens):
            return ratios[-1]
        share = (x - tokens[i - 1]) / (tokens[i] - tokens[i - 1])
        return ratios[i - 1] + share * (ratios[i] - ratios[i - 1])

    return tuple(at(n) for n in range(RATIO_TOKENS + 1))


def elementwise_s_per_token(profile: str | LayerTable | None, hidden: int, intermediate: int,
                            bandwidth: float) -> float:
    """Seconds a token a layer of the memory-bound elementwise ops (norms, rotary, residual adds scale
    with the hidden size, the MLP's activation with its intermediate size), from the table's rows of
    ELEMENTWISE_FROM_TOKENS tokens and more (its largest row where it has none), at this GPU's
    bandwidth. Without a table, none."""
    if profile is None:
        return 0.0
    table = layer_table(profile)
    rows = [row for row in table.rows if row[0] >= ELEMENTWISE_FROM_TOKENS] or [table.rows[-1]]
    hidden_s = sum(row[2] * 1e-3 / row[0] for row in rows) / len(rows)
    activation_s = sum(row[3] * 1e-3 / row[0] for row in rows) / len(rows)
    per_token = hidden_s * hidden / table.hidden + activation_s * intermediate / table.intermediate
    return per_token * table.bandwidth / bandwidth


def default_step_model(gpu: str) -> str:
    """`kernels` where the kernel database has the GPU, else `roofline`."""
    return "kernels" if GPUS[gpu].kernel_system is not None else "roofline"


def profile_for(model: str, gpu: str = "h100", engine: EngineConfig | None = None,
                costs: StepCosts | None = None, step_model: str | None = None) -> EngineProfile:
    """The engine profile of `model` (a paper model's name or a registered config's key, see
    engine/model_registry.py) on `gpu`, its steps priced by `step_model` (default: kernels where the
    database has the GPU) with that model's fitted constants unless `costs` are given."""
    spec_of_model = model_spec(model)
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    spec = GPUS[gpu]
    table = _fitted()["gpu"].get(gpu)
    measured = table.get("layer_profile") if table is not None else None
    if measured is not None:  # a table measured on this GPU (scripts/fit_profiles.py --layer-profile)
        spec = replace(spec, layer_profile=str(measured))
    chosen = step_model or default_step_model(gpu)
    if chosen == "roofline" and is_config_model(model):
        raise ValueError(f"the roofline step model has fitted constants for the paper's models only; {model} "
                         f"({spec_of_model.name}) is priced by its measured kernels (--step-model kernels) on a GPU "
                         "of the kernel database")
    host_from = None
    if chosen == "kernels":
        host, host_from = kernel_host_costs(gpu)
        costs = costs or host
    elif costs is None:
        costs = fitted_costs(gpu, model)
    return EngineProfile(gpu_key=gpu, model_key=model, gpu=spec, model=spec_of_model,
                         engine=engine or spec.engine_defaults(), costs=costs, step_model=chosen,
                         host_costs_from=host_from)
