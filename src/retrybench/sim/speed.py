"""The engine made faster or slower by one factor: every step takes 1/speed of its profile's time.

A calibration measures one engine speed; the engine a run meets may be a little faster or slower. Scaling
only the step time (the KV cache, batch limits and scheduling stay) moves capacity by that factor while
the trace, at the calibrated C-hat, stays the same, so a run at another speed shows what that gap does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from retrybench.engine.profiles import EngineProfile

__all__ = ["ScaledProfile", "at_speed", "check_speed"]


@dataclass(frozen=True, kw_only=True)
class ScaledProfile(EngineProfile):
    """An engine profile `speed` times as fast: every step takes 1/speed of the profile's time. Only the
    step time changes (the KV cache, batch limits and scheduling stay), so capacity scales by `speed`."""

    speed: float = 1.0

    def step_timer(self) -> Callable[..., float]:
        base = super().step_timer()
        speed = self.speed

        def step_time_s(*args: Any) -> float:
            return float(base(*args)) / speed

        return step_time_s


def check_speed(speed: float) -> None:
    """ValueError unless `speed` is a positive, finite factor."""
    if not 0 < speed < float("inf"):
        raise ValueError(f"engine speed must be positive and finite, got {speed}")


def at_speed(profile: EngineProfile, speed: float) -> EngineProfile:
    """`profile` made `speed` times as fast; the profile itself at speed 1, so a run at the calibrated
    speed is the very run it was before speeds existed."""
    check_speed(speed)
    if speed == 1.0:
        return profile
    fields = {f.name: getattr(profile, f.name) for f in dataclasses.fields(profile) if f.init and f.name != "speed"}
    base_speed = profile.speed if isinstance(profile, ScaledProfile) else 1.0
    return ScaledProfile(**fields, speed=base_speed * speed)
