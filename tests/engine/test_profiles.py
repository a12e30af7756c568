"""GPU x model profiles: architecture figures, KV capacity, and the step-time model's monotonicity."""

from __future__ import annotations

import dataclasses
from typing import TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrybench.conditions.config import EngineConfig
from retrybench.engine.profiles import (
    GPUS,
    MODELS,
    RATIO_TOKENS,
    EngineProfile,
    ModelSpec,
    StepCosts,
    elementwise_s_per_token,
    fitted_profiles,
    gemm_roofline_ratios,
    profile_for,
)
from retrybench.plan.blocks import PAPER_MODELS

QWEN7, LLAMA8, QWEN14 = "qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "qwen3-14b"


def roofline_profile(model: str, gpu: str = "h100", engine: EngineConfig | None = None) -> EngineProfile:
    """The roofline step model's profile: the formula these tests check (the kernels model's are in
    test_kernel_tables.py)."""
    return profile_for(model, gpu, engine, step_model="roofline")


@pytest.mark.parametrize(("model", "expected"), [
    (QWEN7, 2 * 28 * 4 * 128 * 2),  # 57,344 bytes: K and V, 28 layers, 4 KV heads of 128, bf16
    (LLAMA8, 2 * 32 * 8 * 128 * 2),  # 131,072
    (QWEN14, 2 * 40 * 8 * 128 * 2),  # 163,840
])
def test_kv_bytes_per_token_from_the_architecture(model: str, expected: int) -> None:
    assert MODELS[model].kv_bytes_per_token == expected
    assert {QWEN7: 57_344, LLAMA8: 131_072, QWEN14: 163_840}[model] == expected


@pytest.mark.parametrize(("model", "published"), [(QWEN7, 7.62e9), (LLAMA8, 8.03e9), (QWEN14, 14.77e9)])
def test_parameter_counts_match_the_published_sizes(model: str, published: float) -> None:
    spec = MODELS[model]
    assert spec.params == pytest.approx(published, rel=0.02)
    assert spec.weight_bytes == 2 * spec.params  # bf16
    assert spec.layer_params < spec.params


def test_attention_flops_per_token_pair() -> None:
    spec = MODELS[QWEN7]
    assert spec.attention_flops_per_token_pair == 4 * 28 * 28 * 128


@pytest.mark.parametrize("model", PAPER_MODELS)
def test_kv_blocks_positive_and_larger_on_h200(model: str) -> None:
    h100 = profile_for(model, "h100")
    h200 = profile_for(model, "h200")
    assert h100.kv_blocks > 0
    assert h200.kv_blocks > h100.kv_blocks
    for prof in (h100, h200):
        # Physically consistent: weights plus the KV cache fit in the memory vLLM may use,
        # and the KV cache takes most of what the weights leave.
        kv_bytes = prof.kv_blocks * prof.engine.block_size * prof.model.kv_bytes_per_token
        budget = prof.gpu.memory_bytes * prof.engine.gpu_memory_utilization
        assert prof.model.weight_bytes + kv_bytes <= budget
        assert kv_bytes >= 0.8 * (budget - prof.model.weight_bytes) - 3 * 1024**3


def test_qwen7b_on_h100_holds_about_a_million_tokens() -> None:
    prof = profile_for(QWEN7, "h100")
    tokens = prof.kv_blocks * prof.engine.block_size
    assert 0.8e6 < tokens < 1.2e6


def test_kv_blocks_follow_the_engine_arguments() -> None:
    base = profile_for(QWEN7)
    more_memory = profile_for(QWEN7, engine=EngineConfig(gpu_memory_utilization=0.95))
    bigger_batches = profile_for(QWEN7, engine=EngineConfig(max_num_batched_tokens=32_768))
    bigger_blocks = profile_for(QWEN7, engine=EngineConfig(block_size=32))
    assert more_memory.kv_blocks > base.kv_blocks
    assert bigger_batches.kv_blocks < base.kv_blocks  # a larger activation peak is reserved
    assert bigger_blocks.kv_blocks == pytest.approx(base.kv_blocks / 2, abs=1)


def test_model_that_does_not_fit_raises() -> None:
    prof = profile_for(QWEN14, engine=EngineConfig(gpu_memory_utilization=0.1))
    with pytest.raises(ValueError, match="does not fit"):
        _ = prof.kv_blocks


def test_unknown_model_or_gpu() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        profile_for("gpt-5")
    with pytest.raises(ValueError, match="unknown GPU"):
        profile_for(QWEN7, "mi300x")


def test_profile_keeps_its_keys() -> None:
    prof = roofline_profile(LLAMA8, "h200")
    assert (prof.gpu_key, prof.model_key) == ("h200", LLAMA8)
    assert prof.gpu is GPUS["h200"]
    assert prof.model is MODELS[LLAMA8]
    assert prof.engine == EngineConfig()


# -- step time --------------------------------------------------------------------------------------


def step(prof: EngineProfile, *, seqs: int = 1, tokens: int = 1, sampled: int = 1,
         attention_pairs: float = 1.0, context_tokens: int = 1, decode_context_tokens: int = 0) -> float:
    return prof.step_time_s(seqs=seqs, tokens=tokens, sampled=sampled, attention_pairs=attention_pairs,
                            context_tokens=context_tokens, decode_context_tokens=decode_context_tokens)


def weight_read_s(prof: EngineProfile) -> float:
    """The layers' and the LM head's weights at the GPU's full nominal bandwidth."""
    model = prof.model
    return (model.layer_params + model.lm_head_params) * model.dtype_bytes / prof.gpu.bandwidth_bytes_per_s


def test_a_small_decode_step_reads_the_weights_once() -> None:
    prof = roofline_profile(QWEN7)
    t = step(prof)
    ratio = gemm_roofline_ratios(prof.gpu.layer_profile, prof.gpu.bf16_flops_per_s / prof.gpu.bandwidth_bytes_per_s)
    # A one-token step is bound by the weight read, at the measured share of the bandwidth (r(1) ~ 1.25).
    expected = ratio[1] * prof.costs.linear_scale * weight_read_s(prof)
    assert t > expected
    assert t == pytest.approx(expected + prof.costs.fixed_s + prof.costs.per_seq_s, rel=2e-3)
    assert 3e-3 < t < 10e-3  # a few milliseconds per decode step, as vLLM shows for a 7B model


def test_a_full_prefill_step_is_compute_bound_and_slower() -> None:
    prof = roofline_profile(QWEN7)
    n = 8192
    prefill = step(prof, tokens=n, attention_pairs=n * (n + 1) / 2, context_tokens=n)
    decode = step(prof)
    assert prefill > 10 * decode
    compute = 2.0 * prof.model.layer_params * n / prof.gpu.bf16_flops_per_s
    assert prefill > compute / 0.8  # GEMMs reach about three quarters of peak, never all of it


def test_the_linear_layers_reproduce_the_measured_profile_for_the_profiled_shapes() -> None:
    """A model with Llama-2-7B's layer shapes on the H100, at linear_scale 1, costs per layer what
    the profile measured (where the measured times grow with the token count)."""
    llama2 = ModelSpec(name="Llama-2-7B", layers=1, hidden=4096, intermediate=11008, heads=32, kv_heads=32,
                       head_dim=128, vocab=1)
    costs = StepCosts(fixed_s=0.0, per_seq_s=0.0, linear_scale=1.0, attention_eff=1e9, memory_eff=1e9)
    prof = EngineProfile(gpu_key="h100", model_key="llama2", gpu=GPUS["h100"], model=llama2,
                         engine=EngineConfig(), costs=costs)
    elementwise = elementwise_s_per_token(prof.gpu.layer_profile, 4096, 11008, prof.gpu.bandwidth_bytes_per_s)
    for tokens, measured_ms in ((1, 0.151), (512, 0.3285), (2048, 1.087), (4096, 2.205)):
        linear = step(prof, tokens=tokens, sampled=0, attention_pairs=0, context_tokens=0) - elementwise * tokens
        assert linear * 1e3 == pytest.approx(measured_ms, rel=0.02), tokens


def test_linear_layers_cost_the_same_per_token_from_a_thousand_tokens_up() -> None:
    """What the measured profile shows (and chunked-prefill measurements confirm): 2,048-token steps do
    not make a prompt's GEMMs cheaper than 8,192-token steps."""
    prof = roofline_profile(QWEN7)
    per_token = {n: step(prof, tokens=n, sampled=0, attention_pairs=0, context_tokens=0) / n for n in (2048, 8192)}
    assert per_token[2048] == pytest.approx(per_token[8192], rel=0.05)


def test_a_decode_riding_a_prefill_step_pays_its_own_kv_read() -> None:
    """Prefill and decode attention do not overlap: 75 decodes at a 12,000-token context add their KV
    read to a 2,048-token prefill step, as much as the prefill attention could have hidden."""
    prof = roofline_profile(QWEN7)
    chunk, context, decodes = 2048, 6000, 75
    prefill = step(prof, seqs=1, tokens=chunk, sampled=0, attention_pairs=chunk * context, context_tokens=context)
    decode_context = decodes * 12_000
    mixed = step(prof, seqs=1 + decodes, tokens=chunk + decodes, sampled=decodes,
                 attention_pairs=chunk * context + decode_context, context_tokens=context + decode_context,
                 decode_context_tokens=decode_context)
    kv_read = decode_context * prof.model.kv_bytes_per_token / (prof.gpu.bandwidth_bytes_per_s * prof.costs.memory_eff)
    assert mixed - prefill > kv_read


class StepArgs(TypedDict, total=False):
    tokens: int
    attention_pairs: float
    context_tokens: int


def test_h200_steps_are_not_slower() -> None:
    cases: tuple[StepArgs, ...] = ({}, {"tokens": 8192, "attention_pairs": 8192 * 4096.0, "context_tokens": 8192})
    for kwargs in cases:
        assert step(roofline_profile(QWEN7, "h200"), **kwargs) <= step(roofline_profile(QWEN7, "h100"), **kwargs)


@settings(max_examples=200, deadline=None, database=None)
@given(
    profile=st.sampled_from(fitted_profiles()),
    seqs=st.integers(1, 256),
    tokens=st.integers(1, 16_384),
    extra_tokens=st.integers(0, 8192),
    sampled=st.integers(0, 256),
    extra_sampled=st.integers(0, 256),
    pairs=st.floats(0, 1e9),
    extra_pairs=st.floats(0, 1e9),
    context=st.integers(0, 2_000_000),
    extra_context=st.integers(0, 2_000_000),
    decode_share=st.floats(0, 1),
)
def test_step_time_is_positive_and_monotone(profile: tuple[str, str], seqs: int, tokens: int, extra_tokens: int,
                                            sampled: int, extra_sampled: int, pairs: float, extra_pairs: float,
                                            context: int, extra_context: int, decode_share: float) -> None:
    gpu, model = profile
    prof = roofline_profile(model, gpu)
    decode = int(min(context, pairs) * decode_share)
    args = {"seqs": seqs, "tokens": tokens, "sampled": sampled, "attention_pairs": pairs, "context_tokens": context,
            "decode_context_tokens": decode}
    base = prof.step_time_s(**args)  # type: ignore[arg-type]
    assert base > 0
    for key, extra in (("tokens", extra_tokens), ("sampled", extra_sampled), ("attention_pairs", extra_pairs),
                       ("context_tokens", extra_context)):
        assert prof.step_time_s(**{**args, key: args[key] + extra}) >= base, key  # type: ignore[arg-type]
    assert prof.step_time_s(**{**args, "seqs": seqs + 1}) > base  # type: ignore[arg-type]


@pytest.mark.parametrize("profile", fitted_profiles(), ids="-".join)
def test_a_larger_step_is_never_faster_at_any_token_count(profile: tuple[str, str]) -> None:
    """Every token count and sampled count up to past the ratio table, exhaustively: the property test
    above samples them and once in a while finds a count where an interpolated ratio dipped."""
    gpu, model = profile
    timer = roofline_profile(model, gpu).step_timer()
    for varied in ("tokens", "sampled"):
        times = [timer(1, n if varied == "tokens" else 1, n if varied == "sampled" else 1, 0.0, 0, 0)
                 for n in range(1, RATIO_TOKENS + 64)]
        dips = [n + 1 for n in range(1, len(times)) if times[n] < times[n - 1]]
        assert not dips, f"{gpu}/{model}: one more {varied} takes less time at {dips[:5]}"


def test_step_time_strictly_grows_once_compute_bound() -> None:
    prof = roofline_profile(QWEN7)
    times = [step(prof, tokens=n, attention_pairs=n * (n + 1) / 2, context_tokens=n)
             for n in (2048, 4096, 8192, 16384)]
    assert times == sorted(times)
    assert len(set(times)) == len(times)


def test_step_time_strictly_grows_with_context_when_memory_bound() -> None:
    prof = roofline_profile(QWEN7)
    times = [step(prof, seqs=64, tokens=64, sampled=64, attention_pairs=64 * c, context_tokens=64 * c,
                  decode_context_tokens=64 * c) for c in (1000, 4000, 16_000)]
    assert times[0] < times[1] < times[2]


def test_custom_costs() -> None:
    prof = profile_for("tiny-llama", "cpu")  # the plain roofline: no measured GEMM profile
    free = dataclasses.replace(prof, costs=StepCosts(fixed_s=1.0, per_seq_s=0.5, linear_scale=1e-9,
                                                     attention_eff=1e9, memory_eff=1e9))
    assert step(free, seqs=2) == pytest.approx(2.0, rel=1e-6)


def test_the_cpu_build_holds_the_kv_cache_vllm_reports() -> None:
    """vLLM's CPU build with VLLM_CPU_KVCACHE_SPACE=2 logs "CPU KV cache size: 1,048,576 tokens" for the
    tiny Llama (2 layers x 4 KV heads x 64 x 2 bytes x K and V = 2 KiB a token), in 128-token blocks."""
    profile = profile_for("tiny-llama", "cpu")
    assert profile.engine.block_size == 128 and profile.engine.async_scheduling is False
    assert profile.kv_blocks * profile.engine.block_size == 1_048_576


def test_the_cpu_platform_sets_its_engine_defaults_on_every_run() -> None:
    from retrybench.conditions.config import load_condition
    from retrybench.plan.spec import RunSpec, engine_config_for

    spec = RunSpec(model="tiny-llama", gpu="cpu", condition="engine-cap-100", seed=1, max_batched_tokens=2048)
    engine, cap = engine_config_for(spec, load_condition(spec.condition), chat=1.0)
    assert (engine.block_size, engine.async_scheduling, engine.max_num_batched_tokens, cap) == (128, False, 2048, 100)
    gpu, _ = engine_config_for(dataclasses.replace(spec, gpu="h100"), load_condition(spec.condition), chat=1.0)
    assert (gpu.block_size, gpu.async_scheduling) == (16, True)
