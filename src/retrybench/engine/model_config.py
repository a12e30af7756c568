"""A model's engine figures from its Hugging Face config.json: pure, no file or network access.

Only dense decoders whose layers are Llama's are priced, since those are the layers the kernel
database measures for vLLM: Llama, Qwen2 and Qwen3 as themselves, and Mistral without a sliding
window relabelled as Llama (the same layers: grouped-query attention, RMSNorm, a gated SiLU MLP).
Anything the database would price differently, or not at all, is refused with what is supported:
mixtures of experts, multi-head latent attention, sliding-window attention, multimodal models and
quantised weights.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from retrybench.engine.models import ModelSpec

__all__ = ["AS_PRICED", "DTYPE_BYTES", "UnsupportedModel", "config_digest", "model_from_config"]

# config.json's architecture -> the one the kernel database prices its layers as.
AS_PRICED: dict[str, str] = {"LlamaForCausalLM": "LlamaForCausalLM", "Qwen2ForCausalLM": "Qwen2ForCausalLM",
                             "Qwen3ForCausalLM": "Qwen3ForCausalLM", "MistralForCausalLM": "LlamaForCausalLM"}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2}
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
SUPPORTED = (f"supported: dense decoders with bf16 or fp16 weights, architectures {', '.join(AS_PRICED)} "
             "(Mistral without a sliding window)")


class UnsupportedModel(ValueError):
    """A config.json this simulator cannot price, and why."""


def config_digest(config: Mapping[str, Any]) -> str:
    """The first 12 hex digits of the SHA-256 of the config's canonical JSON: part of the model's identity,
    so an edited config is another model (and its runs other cache entries)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def model_from_config(config: Mapping[str, Any], name: str) -> ModelSpec:
    """The model a config.json describes, or UnsupportedModel naming what it has and what is supported."""
    architecture = _architecture(config)
    _refuse_unpriced(config)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise UnsupportedModel(f"{name}: weights in {dtype}; {SUPPORTED}")
    heads = _positive(config, "num_attention_heads", name)
    hidden = _positive(config, "hidden_size", name)
    kv_heads = _positive(config, "num_key_value_heads", name, default=heads)
    if config.get("head_dim") is None and hidden % heads:
        raise UnsupportedModel(f"{name}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                               "and no head_dim is given")
    head_dim = _positive(config, "head_dim", name, default=hidden // heads)
    if heads % kv_heads:
        raise UnsupportedModel(f"{name}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                               f"{kv_heads}")
    return ModelSpec(name=name, layers=_positive(config, "num_hidden_layers", name), hidden=hidden,
                     intermediate=_positive(config, "intermediate_size", name), heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, vocab=_positive(config, "vocab_size", name), dtype_bytes=DTYPE_BYTES[dtype],
                     architecture=AS_PRICED[architecture],
                     tied_embeddings=bool(config.get("tie_word_embeddings", False)))


def _architecture(config: Mapping[str, Any]) -> str:
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or len(architectures) != 1:
        raise UnsupportedModel(f"config.json names architectures {architectures!r}, not one; {SUPPORTED}")
    architecture = str(architectures[0])
    if architecture not in AS_PRICED:
        raise UnsupportedModel(f"architecture {architecture} is not priced; {SUPPORTED}")
    return architecture


def _refuse_unpriced(config: Mapping[str, Any]) -> None:
    """UnsupportedModel for the features whose kernels a Llama layer's table would misprice."""
    experts = [key for key in MOE_KEYS if config.get(key)]
    if experts:
        raise UnsupportedModel(f"a mixture of experts ({experts[0]}: {config[experts[0]]}); {SUPPORTED}")
    if config.get("kv_lora_rank"):
        raise UnsupportedModel(f"multi-head latent attention (kv_lora_rank: {config['kv_lora_rank']}); {SUPPORTED}")
    modal = [key for key in ("vision_config", "text_config", "audio_config") if key in config]
    if modal:
        raise UnsupportedModel(f"a multimodal model ({modal[0]}); {SUPPORTED}")
    if config.get("quantization_config") is not None:
        method = config["quantization_config"].get("quant_method", "?") if isinstance(
            config["quantization_config"], Mapping) else "?"
        raise UnsupportedModel(f"quantised weights (quantization_config, {method}); {SUPPORTED}")
    window = _sliding_window(config)
    if window is not None:
        raise UnsupportedModel(f"sliding-window attention ({window}); {SUPPORTED}")


def _sliding_window(config: Mapping[str, Any]) -> str | None:
    """What makes the model's attention windowed, or None: a window shorter than its context (unless
    use_sliding_window is false, as Qwen2's configs say), or layers typed as sliding."""
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and any("sliding" in str(t) for t in layer_types):
        return "layer_types"
    window = config.get("sliding_window")
    if window is None or config.get("use_sliding_window") is False:
        return None
    context = config.get("max_position_embeddings")
    if isinstance(context, int) and int(window) >= context:
        return None
    return f"sliding_window: {window} < max_position_embeddings: {context}"


def _positive(config: Mapping[str, Any], key: str, name: str, default: int | None = None) -> int:
    value = config.get(key)
    if value is None:
        if default is None:
            raise UnsupportedModel(f"{name}: config.json has no {key}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedModel(f"{name}: {key} must be a positive integer, got {value!r}")
    return value
