"""scripts/fit_profiles.py --layer-profile: a step profile measured on the user's GPU becomes the layer
table the fit measures with, and once written, the one every run reads."""

from __future__ import annotations

import csv
import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from retrybench.engine import profiles
from retrybench.engine.layer_table import LINEAR_PHASES
from retrybench.engine.profiles import GPUS, MODELS, fitted_costs, profile_for

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fit_profiles.py"
PHASES = (*LINEAR_PHASES, "elementwise_hidden", "mlp_activation", "attention_prefill")
STORED = "h100_llama2_7b_layer_ms.csv"


@pytest.fixture(scope="module")
def fit() -> ModuleType:
    pytest.importorskip("scipy", reason="the fit needs scipy (pip install -e '.[fit]')")
    spec = importlib.util.spec_from_file_location("fit_profiles_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_steps(path: Path, *, models: tuple[str, ...] = ("tiny-llama",), dtype: str = "float32") -> Path:
    fields = ("device", "dtype", "model", "phase", "tokens", "batch", "context", "seconds", "flops", "bytes")
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for model in models:
            for phase in PHASES:
                for tokens in (16, 64, 256):
                    writer.writerow({"device": "cpu", "dtype": dtype, "model": model, "phase": phase,
                                     "tokens": tokens, "batch": 1, "context": 0, "seconds": 1e-6 * tokens,
                                     "flops": 1, "bytes": 1})
    return path


def test_a_step_profile_becomes_a_table_of_its_model_read_as_the_named_gpu(fit: ModuleType, tmp_path: Path) -> None:
    model, table = fit.table_from_step_profile(_write_steps(tmp_path / "steps.csv"), "h100")
    tiny = MODELS["tiny-llama"]
    assert model == "tiny-llama"
    assert (table.peak_flops, table.bandwidth) == (GPUS["h100"].bf16_flops_per_s, GPUS["h100"].bandwidth_bytes_per_s)
    assert (table.hidden, table.intermediate, table.dtype_bytes) == (tiny.hidden, tiny.intermediate, 4)
    assert table.layer_params == tiny.layer_params // tiny.layers
    assert [row[0] for row in table.rows] == [16, 64, 256]
    assert table.rows[0][1] == pytest.approx(4 * 16e-3)  # four linear phases of 16 us each, in ms


def test_a_step_profile_of_two_models_is_refused(fit: ModuleType, tmp_path: Path) -> None:
    path = _write_steps(tmp_path / "steps.csv", models=("tiny-llama", "qwen3-14b"))
    with pytest.raises(SystemExit, match="one known model and dtype"):
        fit.table_from_step_profile(path, "h100")


def test_the_fit_measures_with_the_given_table(fit: ModuleType, tmp_path: Path) -> None:
    table = fit.table_from_step_profile(_write_steps(tmp_path / "s.csv"), "h100")[1]
    costs = fitted_costs("h100", "qwen2.5-7b-instruct")
    assert fit.engine_profile("qwen2.5-7b-instruct", costs, "h100", table).gpu.layer_profile == table
    packaged = GPUS["h100"].layer_profile
    assert fit.engine_profile("qwen2.5-7b-instruct", costs, "h100", None).gpu.layer_profile == packaged


def test_a_table_named_in_fitted_toml_is_read_by_every_run(fit: ModuleType, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """write_section names the stored table in its GPU's section, keeps the other sections, and profile_for
    then reads that packaged table (here the one the package ships, standing in for a measured one)."""
    fitted = tmp_path / "fitted.toml"
    fitted.write_text(fit.FITTED.read_text())
    monkeypatch.setattr(fit, "FITTED", fitted)
    fit.write_section("h100", fitted_costs("h100", "qwen2.5-7b-instruct"),
                      {"qwen2.5-7b-instruct": 1.0}, ["# a measured table"], STORED)
    data: dict[str, Any] = tomllib.loads(fitted.read_text())
    assert data["gpu"]["h100"]["layer_profile"] == STORED
    assert "layer_profile" not in data["gpu"]["h200"]  # the other GPUs' sections are kept as they were
    monkeypatch.setattr(profiles, "_fitted", lambda: data)
    assert profile_for("qwen2.5-7b-instruct", "h100").gpu.layer_profile == STORED
    assert profile_for("qwen2.5-7b-instruct", "h200").gpu.layer_profile == GPUS["h200"].layer_profile
