"""The paper's figures (paper_values.toml, transcribed from its text) and the suite's one tolerance.

Nothing here tunes the simulator: these are what a reproduction is compared against.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["FAR", "NEAR", "near", "paper_values"]

# The one tolerance band of the suite, for claims the paper states as "near" a figure: the
# measured value must lie within this relative margin of the paper's [low, high] range.
NEAR = 0.10
# "Far fewer" (Finding 5): at most this fraction of the figure compared against.
FAR = 0.75


@cache
def paper_values() -> dict[str, Any]:
    return tomllib.loads((resources.files("retrybench.claims") / "paper_values.toml").read_text())


def near(value: float, low: float, high: float, margin: float = NEAR) -> bool:
    """True if value lies in [low, high] widened by `margin` of each end."""
    return low * (1 - margin) <= value <= high * (1 + margin)
