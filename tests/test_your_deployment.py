"""Re-test your own deployment (docs/your-deployment.md): a model none of the paper's, given only as its
config.json, on GPUs of the kernel database: every run completes, and C-hat orders the GPUs as their
measured kernels do. Also what the command line refuses before any run, and why."""

from __future__ import annotations

import importlib.util
import json
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from retrybench.calibration.simulated import calibrate
from retrybench.cli.main import main
from retrybench.conditions.config import WorkloadSpec
from retrybench.engine.model_registry import register_model
from retrybench.engine.profiles import profile_for
from retrybench.plan.spec import RunSpec
from retrybench.runs.simulate import run_summary, simulate_spec

HAS_DATABASE = importlib.util.find_spec("aiconfigurator_core") is not None
needs_database = pytest.mark.skipif(not HAS_DATABASE, reason="a model beyond the packaged tables is priced by the "
                                                             "kernel database: pip install 'retrybench[kernels]'")

# Mistral-7B-v0.3's shapes, its sliding window off: no test or packaged table has this model.
MISTRAL: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
    "max_position_embeddings": 32768, "sliding_window": None, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "_name_or_path": "mistral-7b-like",
}
GPUS = ("l40s", "a100", "h100", "h200", "b200")


def _model_dir(tmp_path: Path, config: dict[str, Any]) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _kernel_s(key: str, gpu: str) -> float:
    """Kernel time of a reference pair of steps (a 2,048-token prefill, 64 decodes at 1,024 tokens), host
    costs taken out: how fast the database says the GPU runs the model."""
    profile = profile_for(key, gpu)
    timer = profile.step_timer()
    prefill = timer(1, 2048, 1, 0.0, 0, 0, ((2048, 0),))
    decode = timer(64, 64, 64, 64 * 1024.0, 64 * 1024, 64 * 1024, ())
    return prefill + decode - 2 * profile.costs.fixed_s - 65 * profile.costs.per_seq_s


@needs_database
def test_an_unseen_model_on_four_gpus_runs_and_c_hat_follows_the_kernels(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    key = register_model(_model_dir(tmp_path, MISTRAL))
    started = time.perf_counter()
    chat = {gpu: calibrate(profile_for(key, gpu), seed=0, spec=WorkloadSpec(chat_calls_per_s=1.0)).chat_calls_per_s
            for gpu in GPUS}
    kernels = {gpu: _kernel_s(key, gpu) for gpu in GPUS}
    by_chat = sorted(GPUS, key=lambda gpu: chat[gpu])
    by_kernels = sorted(GPUS, key=lambda gpu: -kernels[gpu])
    assert by_chat == by_kernels, f"C-hat {chat}, kernel seconds {kernels}"
    for gpu in GPUS:
        spec = RunSpec(model=key, condition="retries-on-cancel-off", seed=1, gpu=gpu)
        summary = run_summary(spec, chat[gpu], simulate_spec(spec, chat[gpu]), time.perf_counter())
        assert summary["model"] == key and (summary["completed_x"] or 0) > 0
        assert summary.get("host_costs_from") == ("h100" if gpu != "h100" else None)
    assert time.perf_counter() - started < 120


def test_gpus_lists_the_database_gpus_with_their_vllm_versions() -> None:
    result = CliRunner().invoke(main, ["gpus", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["gpu"]: row for row in json.loads(result.output)}
    assert rows["a100"]["vllm"] == "0.14.0" and rows["b200"]["kernel_system"] == "b200_sxm"
    table = CliRunner().invoke(main, ["gpus"])
    assert table.exit_code == 0 and "a100_sxm (vLLM 0.14.0)" in table.output


@pytest.mark.parametrize(("changes", "named"), [
    ({"num_local_experts": 8}, "mixture of experts"),
    ({"sliding_window": 4096}, "sliding-window attention"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantised weights"),
])
def test_run_refuses_an_unpriced_model_before_any_run(changes: dict[str, Any], named: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    folder = _model_dir(tmp_path, {**MISTRAL, **changes})
    result = CliRunner().invoke(main, ["run", "--condition", "coalescing", "--model", str(folder), "--gpu", "a100"])
    assert result.exit_code == 2 and named in result.output and "supported:" in result.output


def test_run_refuses_a_model_that_does_not_fit_and_the_roofline_for_a_config(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    large = {**MISTRAL, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
             "num_attention_heads": 64}
    folder = _model_dir(tmp_path, large)
    result = CliRunner().invoke(main, ["run", "--condition", "coalescing", "--model", str(folder), "--gpu", "l40s"])
    assert result.exit_code == 2 and "does not fit on NVIDIA L40S: weights" in result.output
    roofline = CliRunner().invoke(main, ["calibrate", "--model", str(folder), "--gpu", "h100",
                                         "--step-model", "roofline"])
    assert roofline.exit_code == 2 and "roofline step model has fitted constants" in roofline.output


def test_a_config_model_without_the_database_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr("retrybench.engine.kernel_db.metadata.version", missing)
    folder = _model_dir(tmp_path, {**MISTRAL, "num_hidden_layers": 5})  # shapes no process has priced yet
    result = CliRunner().invoke(main, ["calibrate", "--model", str(folder), "--gpu", "a100"])
    assert result.exit_code == 2 and "pip install 'retrybench[kernels]'" in result.output


def test_gpu_memory_utilization_sizes_the_kv_cache_and_keys_only_where_it_is_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from retrybench.calibration.store import EngineBuild, build_of
    from retrybench.engine.gpus import GPUS as GPU_SPECS
    from retrybench.plan.spec import condition_for, engine_config_for

    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    paper = RunSpec(model="llama-3.1-8b-instruct", condition="coalescing", seed=1)
    assert "gpu_memory_utilization" not in paper.as_dict()  # the paper's runs keep their keys
    assert build_of(paper).path() == EngineBuild("llama-3.1-8b-instruct").path()
    half = replace(paper, gpu_memory_utilization=0.5)
    assert half.as_dict()["gpu_memory_utilization"] == 0.5 and half.key() != paper.key()
    assert build_of(half).path() != build_of(paper).path()
    engine, _ = engine_config_for(half, condition_for(half), 2.0)
    assert engine.gpu_memory_utilization == 0.5
    full = profile_for("llama-3.1-8b-instruct", "h100").kv_blocks
    halved = profile_for("llama-3.1-8b-instruct", "h100", engine).kv_blocks
    per_block = 16 * profile_for("llama-3.1-8b-instruct", "h100").model.kv_bytes_per_token
    assert full - halved == pytest.approx(0.4 * GPU_SPECS["h100"].memory_bytes / per_block, abs=1)
    large = {**MISTRAL, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
             "num_attention_heads": 64}
    folder = _model_dir(tmp_path, large)
    refused = CliRunner().invoke(main, ["calibrate", "--model", str(folder), "--gpu", "b200",
                                        "--gpu-memory-utilization", "0.5"])
    assert refused.exit_code == 2 and "(0.5 x 180.0 GiB, --gpu-memory-utilization)" in refused.output
