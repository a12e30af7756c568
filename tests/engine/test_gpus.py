"""The GPUs `--gpu` takes: the packaged registry, as the installed kernel database has them, and whose host
costs a GPU without a fit of its own reads."""

from __future__ import annotations

import importlib.util

import pytest

from retrybench.engine.gpu_listing import gpu_rows
from retrybench.engine.gpus import GPUS, REGISTRY_FIELDS, registry
from retrybench.engine.profiles import default_step_model, kernel_host_costs, profile_for

HAS_DATABASE = importlib.util.find_spec("aiconfigurator_core") is not None


def test_the_registry_has_the_database_gpus_with_their_vllm_versions() -> None:
    gpus = registry()
    assert {"a100", "h100", "h200", "b200", "l40s", "gb200", "b300"} <= set(gpus)
    assert gpus["a100"]["vllm"] == "0.14.0" and gpus["a100"]["system"] == "a100_sxm"
    assert gpus["b200"]["vllm"] == "0.24.0" and gpus["b200"]["memory_bytes"] == 180 * 1024**3
    for short, gpu in gpus.items():
        assert GPUS[short].kernel_system == gpu["system"] and default_step_model(short) == "kernels"


def test_the_paper_gpus_keep_the_memory_their_drivers_report() -> None:
    """Their KV capacity, and so every paper run's C-hat and cache key, predate the registry."""
    assert GPUS["h100"].memory_bytes == 81_559 * 1024**2 and GPUS["h200"].memory_bytes == 143_771 * 1024**2
    assert registry()["h100"]["memory_bytes"] == 80 * 1024**3
    assert "cpu" in GPUS and GPUS["cpu"].kernel_system is None and default_step_model("cpu") == "roofline"


@pytest.mark.skipif(not HAS_DATABASE, reason="the kernel database is not installed: pip install 'retrybench[kernels]'")
def test_the_registry_is_what_the_installed_database_gives() -> None:
    from retrybench.engine.kernel_db import database_gpus

    database = database_gpus()
    assert set(database) == set(registry())
    for short, gpu in database.items():
        packaged = dict(registry()[short])
        assert {f: packaged[f] for f in REGISTRY_FIELDS} == gpu, f"{short}: rerun scripts/build_gpu_registry.py"


def test_a_gpu_without_fitted_host_costs_reads_the_h100s_and_says_so() -> None:
    assert kernel_host_costs("a100")[1] == "h100" and kernel_host_costs("h100")[1] == "h100"
    a100, h100 = profile_for("llama-3.1-8b-instruct", "a100"), profile_for("llama-3.1-8b-instruct", "h100")
    assert a100.host_costs_from == "h100" and a100.costs == h100.costs
    assert profile_for("tiny-llama", "cpu").host_costs_from is None  # the roofline: its own fit


def test_the_listing_names_every_gpu_with_its_kernel_data() -> None:
    rows = {row["gpu"]: row for row in gpu_rows()}
    assert set(rows) == set(GPUS)
    assert rows["a100"]["vllm"] == "0.14.0" and rows["a100"]["host_costs_from"] == "h100"
    assert rows["h100"]["memory_gib"] == pytest.approx(79.6, abs=0.05) and rows["h100"]["bandwidth_tb_per_s"] == 3.35
    assert rows["cpu"]["kernel_system"] is None and rows["cpu"]["step_model"] == "roofline"
