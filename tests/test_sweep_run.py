"""A real small sweep (`retrybench sweep`, the local executor): each of its cells is the run `run_one`
computes for the same spec, a policy axis reaches the runs, the outputs are written, and a second
invocation computes nothing (every run is cached). Runs are on Qwen3-14B, the cheapest paper model to
simulate (the lowest C-hat, so the fewest calls), with its C-hat seeded into the cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from retrybench.calibration.store import EngineBuild
from retrybench.cli.main import main
from retrybench.plan.spec import RunSpec
from retrybench.records.cache import code_version, write_entry
from retrybench.records.results import RunSummary, is_failed
from retrybench.runs import executors
from retrybench.runs.executors import run_one
from retrybench.runs.ray import RayExecutor
from retrybench.runs.store import run_is_cached

MODEL = "qwen3-14b"
CHAT = 1.0900243919376884  # its C-hat as calibrated (tests/sim/test_digests.py pins it too)
SWEEP = ["sweep", "--condition", "no-control,coalescing", "--axis", "pulse_x=1.5,2.7", "--axis",
         "client.attempt_timeout_s=60,120", "--model", MODEL, "--jobs", "2"]


def _seed_calibration() -> None:
    """C-hat where calibration_for reads it, so that no test spends seconds calibrating."""
    write_entry(EngineBuild(MODEL).path(), {"chat": CHAT})


def _canonical(summary: RunSummary | dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in summary.items() if k != "wall_s"}, sort_keys=True)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    _seed_calibration()
    return tmp_path / "cache"


def _spec(row: dict[str, Any]) -> RunSpec:
    timeout = row["client.attempt_timeout_s"]
    overrides = () if timeout == 120.0 else (("client.attempt_timeout_s", timeout),)  # 120 s: the condition's own
    return RunSpec(model=MODEL, condition=row["condition"], seed=row["seed"], pulse_x=row["pulse_x"],
                   overrides=overrides)


def test_a_small_sweep_equals_single_runs(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [*SWEEP, "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "sweep.json").read_text())
    assert len(doc["rows"]) == 8 and not any(row.get("error") for row in doc["rows"])
    swept = {spec: run_one(spec) for spec in map(_spec, doc["rows"])}  # the sweep's cache entries
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "alone"))  # where every run is computed afresh
    _seed_calibration()
    single: dict[tuple[str, float, float], RunSummary] = {}
    for row in doc["rows"]:
        spec = _spec(row)
        assert row["key"] == spec.key()  # 120 s is the plain spec: the cache entry reproduce would use
        alone = run_one(spec)
        single[row["condition"], row["pulse_x"], row["client.attempt_timeout_s"]] = alone
        assert {k: row[k] for k in ("recovered", "recovery_s", "hold_delivered_pct", "retry_share_pct")} == {
            k: alone[k] for k in ("recovered", "recovery_s", "hold_delivered_pct", "retry_share_pct")}
        assert _canonical(swept[spec]) == _canonical(alone)
    # The client's deadline reached the runs: under the 2.7 pulse a 60-s deadline retries sooner.
    shorter, paper = single["no-control", 2.7, 60.0], single["no-control", 2.7, 120.0]
    assert shorter["attempts"] != paper["attempts"]
    boundary = {(b["condition"], b["client.attempt_timeout_s"]): b for b in doc["boundaries"]}
    no_control = boundary["no-control", 120.0]
    assert (no_control["status"], no_control["critical"]) == ("found", 2.7)  # Finding 1: 1.5 recovers, 2.7 not
    page = (out / "index.html").read_text()
    assert page.count("<svg") == 2 and "Critical pulse_x" in page and "<script" not in page

    def no_runs(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a cached run was computed again")

    monkeypatch.setenv("RETRYBENCH_CACHE", str(cache))
    monkeypatch.setattr(executors, "compute", no_runs)
    again = CliRunner().invoke(main, [*SWEEP, "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert "8 runs: 8 cached, 0 to compute" in " ".join(again.output.split())
    assert json.loads((out / "sweep.json").read_text())["rows"] == doc["rows"]


def test_a_summary_from_other_code_is_not_cached(cache: Path) -> None:
    spec = RunSpec(model=MODEL, condition="no-control", seed=1)
    summary: Any = {"recovered": True, "code_version": "0" * 16}
    result = RayExecutor.store(spec, summary, code_version())
    assert is_failed(result) and "install the same version" in result["error"]
    assert not run_is_cached(spec)
