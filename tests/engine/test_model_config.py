"""Models given as a config.json: what is read from it, what is refused and why, how its key names it, and
whether it fits on a GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from retrybench.engine.gpus import GIB
from retrybench.engine.model_config import UnsupportedModel, config_digest, model_from_config
from retrybench.engine.model_registry import is_config_model, model_spec, register_model
from retrybench.engine.profiles import MODELS, profile_for

# Mistral-7B-v0.3's shapes (no sliding window): priced as a Llama.
MISTRAL: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
    "max_position_embeddings": 32768, "sliding_window": None, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


def _config(**changes: Any) -> dict[str, Any]:
    return {**MISTRAL, **changes}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))


def test_mistral_without_a_window_is_priced_as_a_llama_with_its_shapes() -> None:
    model = model_from_config(MISTRAL, "mistral")
    assert model.architecture == "LlamaForCausalLM"
    assert (model.layers, model.hidden, model.intermediate, model.heads, model.kv_heads, model.head_dim,
            model.vocab) == (32, 4096, 14336, 32, 8, 128, 32768)
    assert model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_a_llama_shaped_model_shares_the_paper_llamas_layers() -> None:
    """Llama-3.1-8B's config gives the same layer shapes as the packaged profile (its tables are shared)."""
    config = _config(architectures=["LlamaForCausalLM"], vocab_size=128_256, max_position_embeddings=131_072)
    assert model_from_config(config, "llama").shapes == MODELS["llama-3.1-8b-instruct"].shapes


def test_head_dim_defaults_to_hidden_over_heads_and_kv_heads_to_heads() -> None:
    config = _config(hidden_size=2048, num_attention_heads=16)
    del config["num_key_value_heads"]
    model = model_from_config(config, "m")
    assert model.head_dim == 128 and model.kv_heads == 16
    assert model_from_config(_config(head_dim=64), "m").head_dim == 64  # given: read, not derived


def test_tied_embeddings_hold_the_vocabulary_matrix_once() -> None:
    untied = model_from_config(MISTRAL, "m")
    tied = model_from_config(_config(tie_word_embeddings=True), "m")
    assert untied.weight_bytes - tied.weight_bytes == 32768 * 4096 * 2
    assert tied.shapes == untied.shapes  # the kernels are the same


def test_fp16_weights_are_two_bytes_and_float32_is_refused() -> None:
    assert model_from_config(_config(torch_dtype="float16"), "m").dtype_bytes == 2
    with pytest.raises(UnsupportedModel, match=r"float32.*supported: dense decoders with bf16 or fp16"):
        model_from_config(_config(torch_dtype="float32"), "m")


def test_qwen2s_disabled_window_is_no_window() -> None:
    config = _config(architectures=["Qwen2ForCausalLM"], sliding_window=4096, use_sliding_window=False)
    assert model_from_config(config, "qwen").architecture == "Qwen2ForCausalLM"
    assert model_from_config(_config(sliding_window=32768), "m").layers == 32  # as long as the context


@pytest.mark.parametrize(("changes", "named"), [
    ({"architectures": ["MixtralForCausalLM"], "num_local_experts": 8}, "MixtralForCausalLM is not priced"),
    ({"num_local_experts": 8}, "mixture of experts \\(num_local_experts: 8\\)"),
    ({"num_experts": 64}, "mixture of experts \\(num_experts: 64\\)"),
    ({"n_routed_experts": 256}, "mixture of experts \\(n_routed_experts: 256\\)"),
    ({"kv_lora_rank": 512}, "multi-head latent attention"),
    ({"sliding_window": 4096}, "sliding-window attention \\(sliding_window: 4096 < max_position_embeddings"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window attention \\(layer_types\\)"),
    ({"vision_config": {}}, "multimodal model \\(vision_config\\)"),
    ({"text_config": {}}, "multimodal model \\(text_config\\)"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantised weights \\(quantization_config, awq\\)"),
    ({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel is not priced"),
    ({"architectures": []}, "not one"),
])
def test_what_is_not_a_llama_layer_is_refused_naming_what_is_supported(changes: dict[str, Any], named: str) -> None:
    with pytest.raises(UnsupportedModel, match=named) as refused:
        model_from_config(_config(**changes), "m")
    assert "supported: dense decoders with bf16 or fp16 weights, architectures LlamaForCausalLM, Qwen2ForCausalLM, " \
           "Qwen3ForCausalLM, MistralForCausalLM (Mistral without a sliding window)" in str(refused.value)


@pytest.mark.parametrize(("changes", "named"), [
    ({"num_hidden_layers": None}, "no num_hidden_layers"),
    ({"hidden_size": 0}, "hidden_size must be a positive integer"),
    ({"num_key_value_heads": 5}, "not a multiple of num_key_value_heads 5"),
    ({"hidden_size": 4000, "num_attention_heads": 48}, "no head_dim is given"),
])
def test_missing_or_inconsistent_shapes_are_refused(changes: dict[str, Any], named: str) -> None:
    with pytest.raises(UnsupportedModel, match=named):
        model_from_config(_config(**changes), "m")


def _write(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_config_is_named_by_its_digest_from_a_file_or_its_directory(tmp_path: Path) -> None:
    folder = _write(tmp_path / "mistral", MISTRAL)
    key = register_model(folder)
    assert key == f"config:{config_digest(MISTRAL)}" and is_config_model(key)
    assert register_model(folder / "config.json") == key  # the file or its directory: one model
    assert model_spec(key).shapes == model_from_config(MISTRAL, "m").shapes
    edited = register_model(_write(tmp_path / "other", _config(num_hidden_layers=30)))
    assert edited != key and model_spec(edited).layers == 30


def test_a_key_resolves_only_to_the_config_it_was_made_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = register_model(_write(tmp_path / "m", MISTRAL))
    stored = tmp_path / "cache" / "models" / f"{key.removeprefix('config:')}.json"
    record = json.loads(stored.read_text())
    record["config"]["num_hidden_layers"] = 2
    stored.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"holds another config"):
        model_spec(key)
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "elsewhere"))
    with pytest.raises(ValueError, match="is not registered"):
        model_spec(key)
    with pytest.raises(ValueError, match=r"unknown model 'mistral'; known: .*config.json path"):
        model_spec("mistral")


def test_an_unsupported_config_is_not_registered(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModel, match="mixture of experts"):
        register_model(_write(tmp_path / "moe", _config(num_local_experts=8)))
    with pytest.raises(UnsupportedModel, match=r"not a readable config\.json"):
        register_model(tmp_path / "nothing-here.json")
    assert not (tmp_path / "cache" / "models").exists()


def test_kv_capacity_follows_the_gpu_memory_and_a_model_too_large_is_refused_with_its_figures(
        tmp_path: Path) -> None:
    small = register_model(_write(tmp_path / "m", MISTRAL))
    # A 70B-class model: 140 GB of bf16 weights, more than an L40S or an A100 holds.
    large = register_model(_write(tmp_path / "big", _config(architectures=["LlamaForCausalLM"], hidden_size=8192,
                                                             intermediate_size=28672, num_hidden_layers=80,
                                                             num_attention_heads=64, vocab_size=128_256)))
    assert profile_for(small, "h200").kv_blocks > profile_for(small, "h100").kv_blocks > \
        profile_for(small, "l40s").kv_blocks > 0
    assert profile_for(large, "b200").kv_blocks > 0
    for gpu in ("l40s", "a100"):
        with pytest.raises(ValueError, match=r"does not fit on .*: weights 13\d\.\d GiB \+ reserve \d+\.\d GiB .* "
                                             r"budget \d+\.\d GiB \(0\.9 x \d+\.\d GiB, --gpu-memory-utilization\)"):
            profile_for(large, gpu).kv_blocks  # noqa: B018
    assert profile_for(large, "b200").model.weight_bytes / GIB == pytest.approx(131.4, abs=0.2)


def test_the_roofline_is_refused_for_a_config_model(tmp_path: Path) -> None:
    key = register_model(_write(tmp_path / "m", MISTRAL))
    with pytest.raises(ValueError, match="roofline step model has fitted constants for the paper's models only"):
        profile_for(key, "h100", step_model="roofline")
    assert profile_for(key, "h100").step_model == "kernels"
