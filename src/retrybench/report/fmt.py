"""Formatting of figures for the report's tables: numbers, ranges, flags and metric names."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["label", "number", "span", "value"]

DASH = "–"


def number(x: float | None, digits: int = 1) -> str:
    """A number as the paper prints it: integers plain; below 10 two decimals (rates in C-hat), else
    `digits` decimals (percentages, seconds)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if abs(x) < 10:
        return f"{x:.2f}"
    return f"{x:,.{digits}f}"


def span(values: Sequence[float | None], digits: int = 1) -> str:
    """low–high over the values (one number if they agree); '–' if there are none."""
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not present:
        return DASH
    low, high = min(present), max(present)
    if number(low, digits) == number(high, digits):
        return number(low, digits)
    return f"{number(low, digits)}{DASH}{number(high, digits)}"


def value(x: Any) -> str:
    """Any recorded figure: a [low, high] range, a flag, a number, or text."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int | float) or x is None:
        return number(x)
    if isinstance(x, list | tuple) and len(x) == 2 and all(isinstance(v, int | float) for v in x):
        return span(list(x))
    if isinstance(x, list | tuple):
        return ", ".join(value(v) for v in x)
    if isinstance(x, dict):
        return "; ".join(f"{k} {value(v)}" for k, v in x.items()) or "none"
    return str(x)


_WORDS = {"pct": "%", "x": "×C", "s": "s", "chat": "C-hat", "8k": "8K", "2k": "2K"}


def label(name: str) -> str:
    """A metric key as words: 'hold_delivered_pct' -> 'hold delivered %'."""
    return " ".join(_WORDS.get(word, word) for word in name.split("_"))
