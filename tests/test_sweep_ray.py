"""The Ray executor on a local Ray instance (two CPUs): a small sweep through it gives the local
executor's summaries byte for byte (wall_s aside), its results land in the same cache, and a sweep
started under one executor resumes under the other. Skipped where Ray is not installed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retrybench.calibration.store import EngineBuild
from retrybench.records.cache import write_entry
from retrybench.records.results import Result
from retrybench.runs import executors, ray
from retrybench.runs.executors import LocalExecutor, run_specs
from retrybench.runs.ray import RayExecutor
from retrybench.runs.store import run_is_cached
from retrybench.sweep.axes import parse_axis
from retrybench.sweep.plan import SweepPlan
from retrybench.sweep.run import run_grid

ray_package = pytest.importorskip("ray", reason="Ray is not installed (pip install 'retrybench[ray]'): the Ray "
                                                "executor cannot be tested here")

MODEL = "qwen3-14b"
CHAT = 1.0900243919376884  # its C-hat as calibrated (tests/sim/test_digests.py pins it too)
PLAN = SweepPlan(conditions=("no-control", "coalescing"), axes=(parse_axis("pulse_x=1.5,2.7"),
                                                                parse_axis("proxy.defer_s=5")), seeds=(1,), model=MODEL)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray_package.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray_package.shutdown()


def _use_cache(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(path))
    write_entry(EngineBuild(MODEL).path(), {"chat": CHAT})  # no calibration to wait for


def _bytes(results: list[Result]) -> list[bytes]:
    return [json.dumps({k: v for k, v in r.items() if k != "wall_s"}, sort_keys=True).encode() for r in results]


def _forbidden(*_args: object, **_kwargs: object) -> Any:
    raise AssertionError("a cached run was computed again")


@pytest.mark.usefixtures("local_ray")
def test_ray_and_local_executors_agree_and_share_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs = [p.spec for p in PLAN.points()]
    assert all(spec.overrides for spec in specs)  # a policy override travels to the Ray workers too
    _use_cache(monkeypatch, tmp_path / "ray")
    on_ray = RayExecutor()
    through_ray = run_grid(PLAN, on_ray)
    ray_results = run_specs(on_ray, specs)  # now from the cache, as a resumed sweep reads it
    assert ray_package.is_initialized()  # the executor leaves a Ray it did not start running
    assert all(run_is_cached(spec) for spec in specs)

    _use_cache(monkeypatch, tmp_path / "local")
    through_local = run_grid(PLAN, LocalExecutor(jobs=2))
    local_results = run_specs(LocalExecutor(jobs=2), specs)
    assert through_ray.rows == through_local.rows and through_ray.boundaries == through_local.boundaries
    assert _bytes(ray_results) == _bytes(local_results)
    assert {row["recovered"] for row in through_ray.rows} == {True, False}  # the sweep crossed a boundary

    # What one executor cached, the other reads without computing it.
    monkeypatch.setattr(executors, "compute", _forbidden)
    _use_cache(monkeypatch, tmp_path / "ray")
    assert _bytes(run_specs(LocalExecutor(jobs=2), specs)) == _bytes(local_results)
    _use_cache(monkeypatch, tmp_path / "local")
    monkeypatch.setattr(ray, "_remote_apply", _forbidden)
    assert _bytes(run_specs(RayExecutor(), specs)) == _bytes(local_results)
