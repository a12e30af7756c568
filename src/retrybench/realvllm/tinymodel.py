"""A tiny Llama with random weights and a word-level tokenizer, written with numpy alone.

The real-engine tests measure vLLM's scheduling, aborts and counters, not text quality, so a
2-layer model that vLLM loads in seconds on a CPU is all they need, and it is built here with no
download and no torch. The files are the ones `transformers` writes for a Llama: `config.json`,
`generation_config.json`, `model.safetensors` (the format: an 8-byte little-endian header length,
a JSON header of dtype/shape/offsets, then the raw tensors), `tokenizer.json` (a `tokenizers`
WordLevel model) and `tokenizer_config.json`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["TinyLlama", "make_tiny_model"]

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


@dataclass(frozen=True, kw_only=True)
class TinyLlama:
    """The model's shape. The defaults fit the suite's workload: token ids up to 30,000 and
    prompts of a few thousand tokens within 32k positions."""

    layers: int = 2
    hidden: int = 256
    intermediate: int = 512
    heads: int = 4
    kv_heads: int = 4
    vocab: int = 32_000
    max_positions: int = 32_768
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}), "
                             f"and heads of kv_heads ({self.kv_heads})")
        if self.vocab <= len(SPECIAL_TOKENS) or min(self.layers, self.hidden, self.intermediate,
                                                    self.max_positions) < 1:
            raise ValueError("every size must be positive and the vocabulary larger than the special tokens")

    def config(self) -> dict[str, object]:
        """transformers' LlamaConfig as JSON."""
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": self.hidden, "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.hidden // self.heads,
            "vocab_size": self.vocab, "max_position_embeddings": self.max_positions,
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10_000.0, "attention_bias": False,
            "mlp_bias": False, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "initializer_range": 0.02,
        }

    def tensors(self) -> dict[str, np.ndarray]:
        """Random weights (normal, std 0.02; norms at one), float32, named as transformers names them."""
        rng = np.random.default_rng(self.seed)
        head_dim = self.hidden // self.heads

        def normal(*shape: int) -> np.ndarray:
            return rng.normal(0.0, 0.02, shape).astype(np.float32)

        out = {"model.embed_tokens.weight": normal(self.vocab, self.hidden),
               "model.norm.weight": np.ones(self.hidden, np.float32)}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out |= {
                p + "input_layernorm.weight": np.ones(self.hidden, np.float32),
                p + "post_attention_layernorm.weight": np.ones(self.hidden, np.float32),
                p + "self_attn.q_proj.weight": normal(self.heads * head_dim, self.hidden),
                p + "self_attn.k_proj.weight": normal(self.kv_heads * head_dim, self.hidden),
                p + "self_attn.v_proj.weight": normal(self.kv_heads * head_dim, self.hidden),
                p + "self_attn.o_proj.weight": normal(self.hidden, self.heads * head_dim),
                p + "mlp.gate_proj.weight": normal(self.intermediate, self.hidden),
                p + "mlp.up_proj.weight": normal(self.intermediate, self.hidden),
                p + "mlp.down_proj.weight": normal(self.hidden, self.intermediate),
            }
        return out

    def tokenizer(self) -> dict[str, object]:
        """A WordLevel tokenizer: the special tokens, then the words w3 ... w{vocab-1}."""
        vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
        vocab |= {f"w{i}": i for i in range(len(SPECIAL_TOKENS), self.vocab)}
        added = [{"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for i, token in enumerate(SPECIAL_TOKENS)]
        return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
                "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}


def bfloat16_bytes(array: np.ndarray) -> bytes:
    """float32 -> bfloat16 (round to nearest even), as little-endian bytes."""
    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write `tensors` as bfloat16 in the safetensors format."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        blob = bfloat16_bytes(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [offset,
                                                                                             offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(head)))
        out.write(head)
        for blob in blobs:
            out.write(blob)


def make_tiny_model(directory: Path, shape: TinyLlama | None = None) -> Path:
    """Write the model's files into `directory` (created if needed) and return it. The weights are
    written last, to a temporary name, so a half-written directory never looks like a model."""
    shape = shape or TinyLlama()
    directory.mkdir(parents=True, exist_ok=True)
    config = shape.config()
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False}, indent=2) + "\n")
    (directory / "tokenizer.json").write_text(json.dumps(shape.tokenizer()))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
        "eos_token": "</s>", "pad_token": "<unk>", "model_max_length": shape.max_positions,
        "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    partial = directory / "model.safetensors.partial"
    write_safetensors(partial, shape.tensors())
    partial.replace(directory / "model.safetensors")
    return directory
