"""The simulated engine at a chosen capacity, for comparing with a real engine whose speed is a band.

A live engine's C-hat is measured, not known: repeated calibrations give a band. The simulator's
engine has the fitted profile's own C-hat. Dividing every step's time by one factor makes the
engine that much faster, so the profile's capacity scales with it (`speed_for_capacity` finds the
speed whose simulated calibration gives a C-hat); a run at the band's lowest and highest C-hat
then brackets what the simulator predicts for the live engine. The trace
stays the same (its rates set by the band's mean, as the live run's are), so only the engine differs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from retrybench.calibration.simulated import calibrate_repeated
from retrybench.conditions.config import ClientPolicy, EngineConfig, ProxyPolicy, WorkloadSpec, load_condition
from retrybench.engine.profiles import EngineProfile, profile_for
from retrybench.plan.spec import RunSpec, engine_config_for
from retrybench.records.runlog import RunLog, RunMeta
from retrybench.sim.run import simulate
from retrybench.sim.speed import ScaledProfile, check_speed
from retrybench.traffic.workload import Call, generate_trace

__all__ = ["ScaledProfile", "SpeedFit", "scaled_profile", "simulate_calls_at", "simulate_spec_at", "speed_for_capacity"]


def scaled_profile(model: str, gpu: str, *, speed: float, engine: EngineConfig | None = None) -> ScaledProfile:
    """The profile of `model` on `gpu` made `speed` times as fast."""
    check_speed(speed)
    return ScaledProfile(**_fields(profile_for(model, gpu, engine)), speed=speed)


def _fields(profile: EngineProfile) -> dict[str, Any]:
    return {f.name: getattr(profile, f.name) for f in dataclasses.fields(profile) if f.init}


@dataclass(frozen=True, kw_only=True)
class SpeedFit:
    """The speed at which the simulated engine calibrates to a target C-hat, and the C-hat it gives."""

    target: float
    speed: float
    chat: float


def speed_for_capacity(model: str, gpu: str, target: float, *, token_scale: float, tolerance: float = 0.02,
                       max_tries: int = 8) -> SpeedFit:
    """The speed at which the simulated calibration (the paper's, averaged over its seeds, as
    calibration.store does) gives C-hat `target`. Capacity is near proportional to speed but the
    stage method reads it coarsely, so the speed is refined by the ratio still missing, until within
    `tolerance`; the closest try is returned."""
    spec = WorkloadSpec(chat_calls_per_s=1.0).scaled(token_scale)
    speed, best = 1.0, None
    for _ in range(max_tries):
        chat = calibrate_repeated(scaled_profile(model, gpu, speed=speed), spec=spec).chat_calls_per_s
        if best is None or abs(chat / target - 1) < abs(best.chat / target - 1):
            best = SpeedFit(target=target, speed=speed, chat=chat)
        if abs(chat / target - 1) <= tolerance:
            break
        speed *= target / chat
    assert best is not None
    return best


def simulate_spec_at(spec: RunSpec, *, chat: float, speed: float) -> RunLog:
    """runner.simulate_spec with the engine `speed` times as fast: the trace and queue cap at `chat`."""
    condition = load_condition(spec.condition)
    engine, cap = engine_config_for(spec, condition, chat)
    profile = scaled_profile(spec.model, spec.gpu, speed=speed, engine=engine)
    workload = spec.workload(chat)
    meta: RunMeta = {
        **asdict(spec), "chat": chat, "engine_speed": speed, "pulse_start_s": workload.pulse_start_s,
        "pulse_end_s": workload.pulse_end_s, "hold_end_s": workload.hold_end_s,
        "attempt_timeout_s": condition.client.attempt_timeout_s, "delivery_horizon_s": 840.0,
        "engine_cap": cap, "kv_blocks": profile.kv_blocks,
    }
    return simulate(profile, generate_trace(workload, spec.seed).calls, client=condition.client,
                    proxy=condition.proxy, seed=spec.seed, meta=meta, prefix_tokens=workload.shared_prefix_tokens)


def simulate_calls_at(calls: tuple[Call, ...] | list[Call], *, model: str, gpu: str, speed: float,
                      client: ClientPolicy, prefix_tokens: int, seed: int, meta: RunMeta) -> RunLog:
    """Given calls (a constant-rate stage, say) through a proxy that passes them on, on the engine
    `speed` times as fast; the run goes on until every call has ended, as a live one does."""
    profile = scaled_profile(model, gpu, speed=speed)
    return simulate(profile, calls, client=client, proxy=ProxyPolicy(cancellation="off"), seed=seed,
                    meta={**meta, "engine_speed": speed}, prefix_tokens=prefix_tokens)
