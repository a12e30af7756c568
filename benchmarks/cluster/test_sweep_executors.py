"""A 200-run sweep under both executors on this machine, side by side in one run: the local process pool
and a local Ray instance with as many CPUs. Both start from an empty run cache (the calibration is
shared and written first, so neither waits for it) and must give byte-identical summaries; the printed
line and pytest-benchmark's extra_info have the wall times and their ratio.

On one machine Ray can only add its own cost (task dispatch, serialisation, its daemons sharing the CPUs);
what it buys is more machines: the same sweep on a cluster is `retrybench sweep ... --executor ray
--address HEAD:6379` (README). Not part of CI's benchmark stage (it takes minutes); run it on its own:

    pytest benchmarks/cluster -p no:xdist -s
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from retrybench.calibration.store import EngineBuild, calibration_for
from retrybench.records.cache import write_entry
from retrybench.runs.executors import Executor, LocalExecutor
from retrybench.runs.ray import RayExecutor
from retrybench.sweep.axes import parse_axis
from retrybench.sweep.plan import SweepPlan
from retrybench.sweep.run import run_grid

pytest.importorskip("ray", reason="Ray is not installed (pip install 'retrybench[ray]')")

MODEL = "qwen2.5-7b-instruct"
PLAN = SweepPlan(conditions=("no-control", "coalescing", "retry-budget", "deferred-cancellation"),
                 axes=(parse_axis("pulse_x=1.0:3.4:0.1"),), seeds=(1, 2), model=MODEL)
RUNS = 200
CPUS = os.cpu_count() or 1
WALL_S: dict[str, float] = {}
SUMMARIES: dict[str, list[bytes]] = {}


def _executor(name: str) -> Executor:
    return LocalExecutor(CPUS) if name == "local" else RayExecutor(jobs=CPUS)


def _summaries(rows: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps({k: v for k, v in r.items() if k != "wall_s"}, sort_keys=True).encode() for r in rows]


@pytest.fixture(scope="module")
def chat() -> float:
    """The model's C-hat, from the usual cache (calibrated there once if need be)."""
    return float(calibration_for(MODEL, "h100", False)["chat"])


@pytest.mark.parametrize("name", ["local", "ray"])
def test_a_200_run_sweep(name: str, chat: float, benchmark: Any, tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(list(PLAN.points())) == RUNS
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    write_entry(EngineBuild(MODEL).path(), {"chat": chat})
    executor = _executor(name)
    try:
        result = benchmark.pedantic(lambda: run_grid(PLAN, executor), rounds=1, iterations=1)
    finally:
        executor.close()
    WALL_S[name] = benchmark.stats.stats.max
    SUMMARIES[name] = _summaries(result.rows)
    assert not any(row.get("error") for row in result.rows)
    benchmark.extra_info.update(runs=RUNS, cpus=CPUS, wall_s=round(WALL_S[name], 2))


def test_both_executors_give_the_same_summaries_and_their_ratio() -> None:
    if set(WALL_S) != {"local", "ray"}:
        pytest.skip("run with both executors' benchmarks")
    assert SUMMARIES["ray"] == SUMMARIES["local"]
    print(f"\n{RUNS}-run sweep on {CPUS} CPUs: local {WALL_S['local']:.1f} s, Ray {WALL_S['ray']:.1f} s "
          f"(Ray / local = {WALL_S['ray'] / WALL_S['local']:.2f})")
