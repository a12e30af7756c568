"""A run at another engine speed: every step 1/speed as long, the trace and its C-hat the calibrated
engine's; the speed is part of the run's identity only where it is not the calibrated one."""

from __future__ import annotations

import pytest

from retrybench.calibration.store import build_of
from retrybench.conditions.config import ConfigError
from retrybench.engine.profiles import profile_for
from retrybench.plan.spec import RunSpec
from retrybench.runs.live import live_refusal
from retrybench.runs.simulate import simulate_spec
from retrybench.sim.speed import ScaledProfile, at_speed

STEP = (8, 8192, 8, 4.0e6, 30_000, 20_000)  # seqs, tokens, sampled, attention pairs, context, decode context
SPEC = RunSpec(model="qwen3-14b", condition="no-control", seed=1)


def test_every_step_takes_one_over_speed_of_the_profile_s_time() -> None:
    base = profile_for("qwen3-14b", "h100")
    assert at_speed(base, 1.0) is base  # the calibrated engine is the profile itself
    fast, slow = at_speed(base, 1.05), at_speed(base, 0.95)
    assert isinstance(fast, ScaledProfile) and fast.kv_blocks == base.kv_blocks
    step_s = base.step_timer()(*STEP)
    assert fast.step_timer()(*STEP) == pytest.approx(step_s / 1.05)
    assert slow.step_timer()(*STEP) == pytest.approx(step_s / 0.95)
    assert at_speed(fast, 2.0).step_timer()(*STEP) == pytest.approx(step_s / 2.1)  # speeds compose
    with pytest.raises(ValueError, match="positive"):
        at_speed(base, 0.0)


def test_the_speed_enters_the_record_and_key_only_off_the_calibrated_engine() -> None:
    fast = RunSpec(model="qwen3-14b", condition="no-control", seed=1, engine_speed=1.05)
    assert "engine_speed" not in SPEC.as_dict()
    assert fast.as_dict()["engine_speed"] == 1.05 and fast.key() != SPEC.key()
    assert build_of(fast) == build_of(SPEC)  # the trace's C-hat stays the calibrated engine's
    assert live_refusal(fast) is not None and live_refusal(SPEC) is None
    with pytest.raises(ConfigError, match="engine_speed must be positive"):
        RunSpec(model="qwen3-14b", condition="no-control", seed=1, engine_speed=-1.0)


def test_a_faster_engine_runs_the_same_trace_faster() -> None:
    chat = 1.09
    calibrated = simulate_spec(SPEC, chat)
    faster = simulate_spec(RunSpec(model="qwen3-14b", condition="no-control", seed=1, engine_speed=1.05), chat)
    assert faster.meta["engine_speed"] == 1.05 and "engine_speed" not in calibrated.meta
    assert faster.meta["chat"] == calibrated.meta["chat"]
    assert len(faster.calls) == len(calibrated.calls)  # one trace
    assert faster.to_json() != calibrated.to_json()
