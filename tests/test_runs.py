"""The run service: a plan resolves C-hat once, up front, calibrating on the executor's pool where the
cache lacks it; the local executor puts long runs first; a live run has a simulated run's summary and
one cache key; live failures are kept with their error; calibration at other steps has its own entry."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from fixtures.runner_fakes import InlineExecutor, fake_calibration_seed

from retrybench.calibration import store
from retrybench.calibration.store import EngineBuild, ReplicaSet, build_of, calibrate_missing, calibration_for
from retrybench.plan.engine_choice import parse_engine
from retrybench.plan.spec import RunSpec
from retrybench.records.results import is_failed
from retrybench.runs import executors
from retrybench.runs.executors import LocalExecutor, make_executor, run_specs
from retrybench.runs.live import LiveExecutor, live_refusal, run_one_live
from retrybench.runs.plan import PlannedRun, RunPlan, plan_runs
from retrybench.runs.simulate import simulate_spec, summarize_spec
from retrybench.runs.store import live_run_key, store_run


def test_long_runs_are_submitted_first() -> None:
    specs = [RunSpec(model="m", condition="c", seed=1),
             RunSpec(model="m", condition="c", seed=1, trace=True),
             RunSpec(model="m", condition="c", seed=1, trace=True, max_batched_tokens=2048)]
    assert sorted(specs, key=executors.expected_cost) == [specs[2], specs[1], specs[0]]


@pytest.fixture
def fake_calibrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, int]]:
    """Every calibration of one seed, 1.25 calls/s, in no time; the (build, seed) calibrated, in order."""
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(store, "CALIBRATION_SEEDS", 2)
    calibrated: list[tuple[object, int]] = []

    def fake(build: EngineBuild | ReplicaSet, seed: int) -> object:
        calibrated.append((build, seed))
        return fake_calibration_seed(build, seed)

    monkeypatch.setattr(EngineBuild, "calibrate_seed", fake)
    monkeypatch.setattr(ReplicaSet, "calibrate_seed", fake)
    return calibrated


def test_the_pool_writes_the_calibration_calibration_for_reads(fake_calibrations: list[tuple[object, int]]) -> None:
    """The pool's record lands where calibration_for looks, so no run calibrates again."""
    calibrate_missing(InlineExecutor(), [EngineBuild("qwen3-14b")])
    assert fake_calibrations == [(EngineBuild("qwen3-14b"), 0), (EngineBuild("qwen3-14b"), 1)]
    assert calibration_for("qwen3-14b")["chat"] == pytest.approx(1.25)
    assert len(fake_calibrations) == 2


def test_a_plan_resolves_each_builds_chat_once_before_any_run(fake_calibrations: list[tuple[object, int]]) -> None:
    one = RunSpec(model="qwen3-14b", condition="no-control", seed=1)
    specs = [one, RunSpec(model="qwen3-14b", condition="coalescing", seed=2),
             RunSpec(model="qwen3-14b", condition="no-control", seed=1, replicas=2),
             RunSpec(model="qwen3-14b", condition="no-control", seed=1, token_scale=0.5)]
    plan = plan_runs(specs, InlineExecutor())
    builds = [build_of(spec) for spec in specs]
    assert set(plan.chats) == set(builds) and len(plan.chats) == 3  # two specs share one engine build
    assert [(run.spec, run.chat) for run in plan.runs] == [(spec, 1.25) for spec in specs]
    assert sorted((str(b), s) for b, s in fake_calibrations) == sorted((str(b), s) for b in set(builds)
                                                                      for s in range(2))
    plan_runs(specs)  # all cached now: nothing calibrates again
    assert len(fake_calibrations) == 6


def test_the_local_executor_reads_cached_runs_and_keeps_failures(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))
    computed: list[PlannedRun] = []

    def compute(run: PlannedRun) -> Any:
        computed.append(run)
        if run.spec.seed == 2:
            raise RuntimeError("the engine broke")
        return {"recovered": True, "chat": run.chat}

    monkeypatch.setattr(executors, "compute", compute)
    specs = [RunSpec(model="qwen3-14b", condition="no-control", seed=seed) for seed in (1, 2, 3)]
    cached: Any = {"recovered": False, "chat": 1.4}
    store_run(specs[2], cached)
    plan = RunPlan(tuple(PlannedRun(spec, 1.5) for spec in specs))
    seen: list[RunSpec] = []
    results = LocalExecutor(jobs=1).run(plan, lambda spec, result: seen.append(spec))
    failed = {**asdict(specs[1]), "error": "RuntimeError: the engine broke"}
    assert results == [{"recovered": True, "chat": 1.5}, failed, cached]
    assert seen == [specs[2], specs[0], specs[1]]  # the cached run reported first, then as they finish
    assert [run.spec for run in computed] == specs[:2]


def test_make_executor_refuses_what_an_engine_cannot_do() -> None:
    url = parse_engine("http://127.0.0.1:9")
    assert isinstance(make_executor("local", engine=url), LiveExecutor)
    assert isinstance(make_executor("local", jobs=3), LocalExecutor)
    with pytest.raises(ValueError, match="--executor and --address are for the simulated engine"):
        make_executor("ray", engine=url)
    with pytest.raises(ValueError, match="--time-scale is for a live engine"):
        make_executor("local", time_scale=0.1)
    with pytest.raises(ValueError, match="--address is for --executor ray"):
        make_executor("local", address="head:6379")
    with pytest.raises(ValueError, match="unknown executor 'dask'"):
        make_executor("dask")


LIVE_SPEC = RunSpec(model="qwen2.5-7b-instruct", condition="retries-on-cancel-on", seed=1, token_scale=0.5)


class _FakeLive:
    """run_one_live's view of loadgen.run.run_live: the simulated run's log stands in for a live one."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.log = simulate_spec(LIVE_SPEC, chat=2.5)

    def __call__(self, spec: RunSpec, **kwargs: Any) -> object:
        self.calls.append(kwargs)
        return type("LiveRun", (), {"log": self.log})()


@pytest.fixture
def fake_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _FakeLive:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))
    fake = _FakeLive()
    monkeypatch.setattr("retrybench.loadgen.run.run_live", fake)
    return fake


def test_a_live_summary_has_a_simulated_runs_keys_and_where_it_ran(fake_live: _FakeLive,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[EngineBuild] = []

    def calibration(build: EngineBuild, use_cache: bool = True) -> dict[str, float]:
        asked.append(build)
        return {"chat": 2.5}

    monkeypatch.setattr("retrybench.runs.plan.calibration_of", calibration)
    executor = LiveExecutor(parse_engine("http://127.0.0.1:9/"))
    (live_result,) = run_specs(executor, [LIVE_SPEC])
    assert asked == [EngineBuild(LIVE_SPEC.model, token_scale=0.5)]  # the spec's build at its token scale
    assert fake_live.calls[0]["engine_url"] == "http://127.0.0.1:9" and fake_live.calls[0]["chat"] == 2.5
    simulated = summarize_spec(LIVE_SPEC, 2.5)
    assert not is_failed(live_result)
    assert set(live_result) == set(simulated) | {"engine", "workdir"}
    assert live_result.get("engine") == "http://127.0.0.1:9" and live_result["chat"] == simulated["chat"]


def test_live_runs_are_cached_by_spec_engine_chat_and_time_scale(fake_live: _FakeLive, tmp_path: Path) -> None:
    served: list[tuple[RunSpec, float]] = []

    def serve(spec: RunSpec, chat: float) -> str:
        served.append((spec, chat))
        return "http://127.0.0.1:7"

    vllm = parse_engine("vllm-process")
    first = run_one_live(LIVE_SPEC, vllm, chat=1.5, serve=serve)
    assert served == [(LIVE_SPEC, 1.5)] and fake_live.calls[-1]["engine_url"] == "http://127.0.0.1:7"
    assert run_one_live(LIVE_SPEC, vllm, chat=1.5, serve=serve) == first  # from the cache
    assert len(fake_live.calls) == 1
    run_one_live(LIVE_SPEC, vllm, chat=1.6, serve=serve)
    run_one_live(LIVE_SPEC, parse_engine("engine-server"), chat=1.5, time_scale=0.1)
    run_one_live(LIVE_SPEC, parse_engine("engine-server"), chat=1.5, time_scale=0.2)
    assert len(fake_live.calls) == 4
    assert fake_live.calls[-1]["engine_url"] is None and fake_live.calls[-1]["time_scale"] == 0.2
    assert first["workdir"] == str(tmp_path / "live" / live_run_key(LIVE_SPEC, vllm, 1.5, 1.0))


def test_a_failed_live_run_is_kept_with_its_error(fake_live: _FakeLive) -> None:
    overridden = RunSpec(model="qwen3-14b", condition="coalescing", seed=1, overrides=(("proxy.defer_s", 2.0),))
    executor = LiveExecutor(parse_engine("vllm-container"), chat=1.5)  # no serve: it cannot start
    results = run_specs(executor, [LIVE_SPEC, overridden])
    expected = {**asdict(LIVE_SPEC), "error": "ValueError: the engine vllm-container is started per run: pass serve"}
    refused = {**asdict(overridden), "error": f"ValueError: {live_refusal(overridden)}"}
    assert [dict(r) for r in results] == [expected, refused]
    assert not fake_live.calls


class _Stop(Exception):
    """Stops a calibration once the engine it was given is known."""


def test_calibration_at_other_steps_uses_that_step_size_and_its_own_cache_entry(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))
    seen: list[int] = []

    def fake_calibrate(profile: Any, seed: int, spec: Any) -> Any:
        seen.append(profile.engine.max_num_batched_tokens)
        raise _Stop

    monkeypatch.setattr(store, "calibrate", fake_calibrate)
    with pytest.raises(_Stop):
        store.calibration_at_steps("qwen2.5-7b-instruct", "h100", 2048)
    assert seen == [2048]
    assert EngineBuild("qwen2.5-7b-instruct", max_batched_tokens=2048).path() != \
        EngineBuild("qwen2.5-7b-instruct").path()
