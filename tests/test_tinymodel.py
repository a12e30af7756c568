"""The tiny model's files: the safetensors layout, bfloat16 rounding, the tokenizer and the config."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from retrybench.cli.main import main
from retrybench.realvllm.tinymodel import TinyLlama, bfloat16_bytes, make_tiny_model


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """An independent reader: bfloat16 widened back to float32."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header.pop("__metadata__")
    body = data[8 + length :]
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "BF16"
        start, end = info["data_offsets"]
        halves = np.frombuffer(body[start:end], dtype="<u2").astype(np.uint32) << 16
        out[name] = halves.view(np.float32).reshape(info["shape"])
    return out


def test_bfloat16_rounds_to_nearest_even() -> None:
    values = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.0e38], dtype=np.float32)
    back = (np.frombuffer(bfloat16_bytes(values), "<u2").astype(np.uint32) << 16).view(np.float32)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even one (1.0); 1 + 3*2^-8 goes up.
    assert back.tolist()[:4] == [1.0, -2.5, 1.0, 1.015625]
    assert abs(back[4] - 3.0e38) / 3.0e38 < 2**-8


def test_the_model_directory_holds_a_loadable_llama(tmp_path: Path) -> None:
    shape = TinyLlama(layers=1, hidden=32, intermediate=64, heads=4, kv_heads=2, vocab=300, max_positions=512)
    make_tiny_model(tmp_path, shape)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "generation_config.json",
                                                          "model.safetensors", "tokenizer.json",
                                                          "tokenizer_config.json"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["head_dim"] == 8
    tensors = read_safetensors(tmp_path / "model.safetensors")
    assert tensors["model.embed_tokens.weight"].shape == (300, 32)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (16, 32)  # 2 kv heads x 8
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (32, 64)
    assert np.all(tensors["model.norm.weight"] == 1.0)
    assert 0.015 < float(tensors["model.embed_tokens.weight"].std()) < 0.025
    assert "lm_head.weight" not in tensors and config["tie_word_embeddings"] is True


def test_the_tokenizer_maps_words_to_their_ids(tmp_path: Path) -> None:
    make_tiny_model(tmp_path, TinyLlama(hidden=16, intermediate=32, vocab=400, max_positions=256))
    tokenizer = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    assert tokenizer["model"]["type"] == "WordLevel" and len(vocab) == 400
    assert vocab["<unk>"] == 0 and vocab["</s>"] == 2 and vocab["w3"] == 3 and vocab["w399"] == 399
    assert sorted(vocab.values()) == list(range(400))


def test_the_same_seed_gives_the_same_weights(tmp_path: Path) -> None:
    shape = TinyLlama(hidden=16, intermediate=32, vocab=300, max_positions=256)
    a = make_tiny_model(tmp_path / "a", shape) / "model.safetensors"
    b = make_tiny_model(tmp_path / "b", shape) / "model.safetensors"
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("bad", [{"hidden": 30}, {"vocab": 3}, {"layers": 0}])
def test_impossible_shapes_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        TinyLlama(**bad)


def test_the_command_refuses_a_directory_with_other_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    result = CliRunner().invoke(main, ["make-tiny-model", str(tmp_path)])
    assert result.exit_code == 2 and "holds other files" in result.output
    assert not (tmp_path / "model.safetensors").exists()


def test_the_command_writes_the_default_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["make-tiny-model", str(tmp_path / "m"), "--layers", "1"])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["vocab_size"], config["max_position_embeddings"]) == (1, 32000, 32768)
