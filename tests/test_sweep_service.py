"""The sweep as a service: its options checked before any run, and a sweep on a live engine (`sweep --engine
URL`), one run after another through the live executor, with the live stack faked (the simulated run's
log stands in for each live one), refusing up front the policy axes a live engine cannot take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from retrybench.plan.engine_choice import parse_engine
from retrybench.plan.spec import RunSpec
from retrybench.runs.display import SilentDisplay
from retrybench.runs.live import LiveExecutor
from retrybench.runs.simulate import simulate_spec
from retrybench.sweep.service import SweepError, plan_sweep, run_sweep, sweep_executor

MODEL = "qwen3-14b"
CHAT = 1.0900243919376884  # its C-hat as calibrated (tests/sim/test_digests.py pins it too)
URL = "http://127.0.0.1:9"


def test_the_options_are_checked_before_any_run() -> None:
    with pytest.raises(SweepError, match="--resolution goes with --find"):
        plan_sweep(conditions="no-control", axes=["pulse_x=1.5,2.7"], seeds=(1,), model=MODEL, resolution="0.1")
    with pytest.raises(SweepError, match="give at least one --axis"):
        plan_sweep(conditions="no-control", axes=[], seeds=(1,), model=MODEL)
    with pytest.raises(SweepError, match="unknown condition 'nope'"):
        plan_sweep(conditions="no-control,nope", axes=["pulse_x=2"], seeds=(1,), model=MODEL)
    with pytest.raises(SweepError, match="--address is for --executor ray"):
        sweep_executor("local", address="head:6379")
    assert isinstance(sweep_executor(engine=parse_engine(URL), time_scale=0.5), LiveExecutor)


class Recording:
    """A display that keeps its lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, text: str) -> None:
        self.lines.append(text)

    def failed(self, text: str) -> None:
        self.lines.append("failed " + text)

    def start(self, label: str, total: int) -> None:
        self.lines.append(f"start {label} {total}")

    def advance(self, steps: int, label: str) -> None:
        pass

    def stop(self, completed: int | None = None) -> None:
        pass


@pytest.fixture
def live_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[RunSpec, dict[str, Any]]]:
    """loadgen.run.run_live faked: each run's log is the simulated one; the (spec, arguments) of each run."""
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("retrybench.runs.plan.calibration_of", lambda *args, **kwargs: {"chat": CHAT})
    ran: list[tuple[RunSpec, dict[str, Any]]] = []

    def run_live(spec: RunSpec, **kwargs: Any) -> object:
        ran.append((spec, kwargs))
        return type("LiveRun", (), {"log": simulate_spec(spec, kwargs["chat"])})()

    monkeypatch.setattr("retrybench.loadgen.run.run_live", run_live)
    return ran


def test_a_sweep_runs_on_a_live_engine(live_stack: list[tuple[RunSpec, dict[str, Any]]], tmp_path: Path) -> None:
    sweep = plan_sweep(conditions="no-control", axes=["pulse_x=1.5,2.7"], seeds=(1,), model=MODEL)
    display = Recording()
    outcome = run_sweep(sweep, sweep_executor(engine=parse_engine(URL), time_scale=0.5), out=tmp_path / "out",
                        command="retrybench sweep --engine " + URL, display=display)
    assert [(spec.pulse_x, kwargs["engine_url"], kwargs["time_scale"]) for spec, kwargs in live_stack] == [
        (1.5, URL, 0.5), (2.7, URL, 0.5)]
    assert display.lines[:2] == ["2 runs live, one after another", "start sweep (live) 2"]
    doc = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert doc["executor"] == "live" and [row["pulse_x"] for row in doc["rows"]] == [1.5, 2.7]
    assert [row["recovered"] for row in doc["rows"]] == [True, False]  # Finding 1, on the (faked) live runs
    (boundary,) = doc["boundaries"]
    assert (boundary["status"], boundary["critical"]) == ("found", 2.7)
    assert outcome.failed == 0 and outcome.lines()[0] == "no-control: not-recovered from pulse_x = 2.7 (1 of 1 seeds)"
    again = run_sweep(sweep, sweep_executor(engine=parse_engine(URL), time_scale=0.5), out=tmp_path / "out",
                      command="again", display=SilentDisplay())
    assert len(live_stack) == 2 and again.result.rows == outcome.result.rows  # both live runs from the cache


def test_a_live_sweep_refuses_policy_axes_before_any_run(live_stack: list[tuple[RunSpec, dict[str, Any]]],
                                                         tmp_path: Path) -> None:
    sweep = plan_sweep(conditions="deferred-cancellation", axes=["proxy.defer_s=2,10"], seeds=(1,), model=MODEL)
    with pytest.raises(SweepError, match=r"policy overrides .* run on the simulated engine only"):
        run_sweep(sweep, sweep_executor(engine=parse_engine(URL)), out=tmp_path / "out", command="")
    search = plan_sweep(conditions="coalescing", axes=["pulse_x=1:3:0.5", "proxy.defer_s=1"], seeds=(1,),
                        model=MODEL, find="pulse_x")
    with pytest.raises(SweepError, match=r"proxy\.defer_s=1"):
        run_sweep(search, sweep_executor(engine=parse_engine(URL)), out=tmp_path / "out", command="")
    assert not live_stack and not (tmp_path / "out").exists()
