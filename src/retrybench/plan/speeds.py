"""The engine-speed band a verdict's margin is judged over (report/margin.py): every engine step 5%
slower, as calibrated, and 5% faster, the trace at the calibrated C-hat throughout (RunSpec.engine_speed)."""

from __future__ import annotations

__all__ = ["CALIBRATED", "SPEEDS", "side_speeds", "speed_label"]

CALIBRATED = 1.0  # the engine calibration measured
SPEEDS = (0.95, CALIBRATED, 1.05)


def side_speeds(speeds: tuple[float, ...] = SPEEDS) -> tuple[float, ...]:
    """The speeds other than the calibrated one: those a margin needs runs at."""
    return tuple(s for s in speeds if s != CALIBRATED)


def speed_label(speed: float) -> str:
    """A speed as the report, the JSON and the command's notes name it: 0.95, 1, 1.05."""
    return f"{speed:g}"
