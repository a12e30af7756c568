"""The models a simulated engine serves: their layers' shapes, weights and KV cache per token.

The paper's models (and the CPU build's tiny Llama) are named here; any other dense decoder comes from
its config.json (engine/model_config.py, engine/model_registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from retrybench.engine.kernel_table import Shapes

__all__ = ["MODELS", "ModelSpec"]


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
    architecture: str = "LlamaForCausalLM"  # as the kernel database prices the model's layers
    tied_embeddings: bool = False  # the LM head is the embedding matrix: its weights are held once

    @property
    def shapes(self) -> Shapes:
        """What the model's kernels depend on: the key of its kernel tables."""
        return Shapes(architecture=self.architecture, layers=self.layers, hidden=self.hidden,
                      intermediate=self.intermediate, heads=self.heads, kv_heads=self.kv_heads,
                      head_dim=self.head_dim, vocab=self.vocab)

    @property
    def layer_params(self) -> int:
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        attention = self.hidden * q_out + 2 * self.hidden * kv_out + q_out * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp)

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """The layers', the embedding's and the LM head's (one matrix when they are tied)."""
        return self.layer_params + (1 if self.tied_embeddings else 2) * self.lm_head_params

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


MODELS: dict[str, ModelSpec] = {
    "qwen2.5-7b-instruct": ModelSpec(name="Qwen/Qwen2.5-7B-Instruct", layers=28, hidden=3584,
                                     intermediate=18944, heads=28, kv_heads=4, head_dim=128,
                                     vocab=152_064, architecture="Qwen2ForCausalLM"),
    "qwen3-14b": ModelSpec(name="Qwen/Qwen3-14B", layers=40, hidden=5120, intermediate=17408,
                           heads=40, kv_heads=8, head_dim=128, vocab=151_936, architecture="Qwen3ForCausalLM"),
    "llama-3.1-8b-instruct": ModelSpec(name="meta-llama/Llama-3.1-8B-Instruct", layers=32,
                                       hidden=4096, intermediate=14336, heads=32, kv_heads=8,
                                       head_dim=128, vocab=128_256),
    # `retrybench make-tiny-model`'s default: what the real-engine tests serve on a CPU.
    "tiny-llama": ModelSpec(name="retrybench tiny Llama (random weights)", layers=2, hidden=256, intermediate=512,
                            heads=4, kv_heads=4, head_dim=64, vocab=32_000),
}
