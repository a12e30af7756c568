"""run_many's pool: calibration as pool tasks, written where calibration_for reads it; long runs first.
Live runs: one summary shape and one cache key, with the live stack itself faked."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from fixtures.runner_fakes import InlineExecutor, fake_calibration_seed

from retrybench.plan.engine_choice import parse_engine
from retrybench.plan.spec import RunSpec
from retrybench.runs import runner


def test_long_runs_are_submitted_first() -> None:
    specs = [RunSpec(model="m", condition="c", seed=1),
             RunSpec(model="m", condition="c", seed=1, trace=True),
             RunSpec(model="m", condition="c", seed=1, trace=True, max_batched_tokens=2048)]
    assert sorted(specs, key=runner._expected_cost) == [specs[2], specs[1], specs[0]]


def test_pool_writes_the_calibration_calibration_for_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's record lands where calibration_for looks, so no run calibrates again."""
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(runner, "CALIBRATION_SEEDS", 1)
    monkeypatch.setattr(runner, "_calibrate_seed", fake_calibration_seed)
    runner._calibrate_in_pool(InlineExecutor(), [("qwen3-14b", "h100", False)])
    monkeypatch.setattr(runner, "calibrate_repeated", _forbidden)
    assert runner.calibration_for("qwen3-14b")["chat"] == pytest.approx(1.25)


def _forbidden(*args: object, **kwargs: object) -> None:
    raise AssertionError("calibration_for calibrated again")


LIVE_SPEC = RunSpec(model="qwen2.5-7b-instruct", condition="retries-on-cancel-on", seed=1, token_scale=0.5)


class _FakeLive:
    """runner.run_one_live's view of live.run.run_live: the simulated run's log stands in for a live one."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.token_scales: list[float] = []  # of the calibrations asked for
        self.log = runner.simulate_spec(LIVE_SPEC, chat=2.5)

    def __call__(self, spec: RunSpec, **kwargs: Any) -> object:
        self.calls.append(kwargs)
        return type("LiveRun", (), {"log": self.log})()

    def calibration(self, model: str, gpu: str, mixed: bool, use_cache: bool = True,
                    token_scale: float = 1.0) -> dict[str, Any]:
        self.token_scales.append(token_scale)
        return {"chat": 2.5}


@pytest.fixture
def fake_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _FakeLive:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))
    fake = _FakeLive()
    monkeypatch.setattr("retrybench.loadgen.run.run_live", fake)
    monkeypatch.setattr(runner, "calibration_for", fake.calibration)
    return fake


def test_a_live_summary_has_a_simulated_runs_keys_and_where_it_ran(fake_live: _FakeLive) -> None:
    live = runner.run_one_live(LIVE_SPEC, parse_engine("http://127.0.0.1:9/"))
    assert fake_live.token_scales == [0.5]  # C-hat of the spec's build at its token scale
    assert fake_live.calls[0]["engine_url"] == "http://127.0.0.1:9" and fake_live.calls[0]["chat"] == 2.5
    simulated = runner.run_one(LIVE_SPEC, use_cache=False)
    assert set(live) == set(simulated) | {"engine", "workdir"}
    assert live["engine"] == "http://127.0.0.1:9" and live["chat"] == simulated["chat"]


def test_live_runs_are_cached_by_spec_engine_chat_and_time_scale(fake_live: _FakeLive, tmp_path: Path) -> None:
    served: list[tuple[RunSpec, float]] = []

    def serve(spec: RunSpec, chat: float) -> str:
        served.append((spec, chat))
        return "http://127.0.0.1:7"

    vllm = parse_engine("vllm-process")
    first = runner.run_one_live(LIVE_SPEC, vllm, chat=1.5, serve=serve)
    assert served == [(LIVE_SPEC, 1.5)] and fake_live.calls[-1]["engine_url"] == "http://127.0.0.1:7"
    assert runner.run_one_live(LIVE_SPEC, vllm, chat=1.5, serve=serve) == first  # from the cache
    assert len(fake_live.calls) == 1
    runner.run_one_live(LIVE_SPEC, vllm, chat=1.6, serve=serve)
    runner.run_one_live(LIVE_SPEC, parse_engine("engine-server"), chat=1.5, time_scale=0.1)
    runner.run_one_live(LIVE_SPEC, parse_engine("engine-server"), chat=1.5, time_scale=0.2)
    assert len(fake_live.calls) == 4
    assert fake_live.calls[-1]["engine_url"] is None and fake_live.calls[-1]["time_scale"] == 0.2
    assert first["workdir"] == str(tmp_path / "live" / runner.live_run_key(LIVE_SPEC, vllm, 1.5, 1.0))


def test_a_failed_live_run_is_kept_with_its_error(fake_live: _FakeLive) -> None:
    results = runner.run_many_live([LIVE_SPEC], parse_engine("vllm-container"))  # no serve: it cannot start
    expected = {**asdict(LIVE_SPEC), "error": "ValueError: the engine vllm-container is started per run: pass serve"}
    assert [dict(r) for r in results] == [expected]


def test_calibration_at_other_steps_uses_that_step_size_and_its_own_cache_entry(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))
    seen: list[int] = []

    def fake_repeated(profile: Any, spec: Any) -> Any:
        seen.append(profile.engine.max_num_batched_tokens)
        raise _Stop

    monkeypatch.setattr(runner, "calibrate_repeated", fake_repeated)
    with pytest.raises(_Stop):
        runner.calibration_at_steps("qwen2.5-7b-instruct", "h100", 2048)
    assert seen == [2048]


class _Stop(Exception):
    """Stops a calibration once the engine it was given is known."""
