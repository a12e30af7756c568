"""`--axis NAME=VALUES`: what a sweep may vary and the values it takes, checked before any run.

An axis is a run-spec field (`pulse_x`, `engine_cap`, `model`, ...) or a policy field of the condition
(`proxy.defer_s`, `client.attempt_timeout_s`, ...). Values are a comma-separated list or an inclusive
range START:STOP:STEP, computed in decimal so that 1.0:3.0:0.1 gives exactly 2.7 (the paper's pulse, whose
runs the cache may already hold), not 2.7000000000000006.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from retrybench.conditions.client_profiles import available_client_profiles
from retrybench.conditions.config import ClientPolicy, ConfigError, ProxyPolicy
from retrybench.engine.profiles import GPUS, MODELS
from retrybench.plan.spec import OverrideValue

__all__ = ["MAX_VALUES", "Axis", "AxisError", "axis_names", "parse_axes", "parse_axis"]

MAX_VALUES = 10_000  # values one axis may take: a typo in a step should not plan a million runs


class AxisError(ValueError):
    """An axis or value a sweep cannot take; the message names the field and what it allows."""


@dataclass(frozen=True)
class _Field:
    """How one field's values are read and checked: its type, whether None is allowed, the check."""

    kind: type
    optional: bool
    check: Callable[[Any], bool]
    allowed: str


def _choices(names: list[str]) -> _Field:
    return _Field(str, False, lambda v: v in names, "one of " + ", ".join(names))


# Run-spec fields (spec.RunSpec) an axis may vary, with the ranges the engine model and workload accept.
SPEC_FIELDS: dict[str, _Field] = {
    "pulse_x": _Field(float, False, lambda v: 0 <= v <= 100, "a number in [0, 100] (multiples of C-hat)"),
    "engine_cap": _Field(int, True, lambda v: v >= 1, "a whole number >= 1, or none (the condition's own cap)"),
    "max_batched_tokens": _Field(int, False, lambda v: 16 <= v <= 1 << 20, "a whole number in [16, 1048576]"),
    "token_scale": _Field(float, False, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "rate_x": _Field(float, True, lambda v: 0 < v <= 100, "a number in (0, 100] (multiples of C-hat, --workload's "
                     "rate), or none (its rate as recorded)"),
    "mixed_prompts": _Field(bool, False, lambda v: True, "true or false"),
    "model": _choices(sorted(MODELS)),
    "gpu": _choices(sorted(GPUS)),
    "client": _Field(str, True, lambda v: v in available_client_profiles(),
                     "one of " + ", ".join(available_client_profiles()) + ", or none (the condition's client)"),
}

_POLICIES: dict[str, type[Any]] = {"client": ClientPolicy, "proxy": ProxyPolicy}


def axis_names() -> list[str]:
    """Every name `--axis` accepts."""
    return [*SPEC_FIELDS, *(f"{section}.{f.name}" for section, cls in _POLICIES.items() for f in fields(cls))]


@dataclass(frozen=True)
class Axis:
    """One swept field and its values, in the order given. `step` is a range's step (None for a list):
    the default resolution of a boundary search along the axis."""

    name: str
    values: tuple[OverrideValue, ...]
    step: Decimal | None = None

    @property
    def is_override(self) -> bool:
        """Whether the axis sets a policy field (carried by RunSpec.overrides) rather than a spec field."""
        return "." in self.name

    @property
    def numeric(self) -> bool:
        return all(isinstance(v, int | float) and not isinstance(v, bool) for v in self.values)


def _field(name: str) -> _Field:
    if name in SPEC_FIELDS:
        return SPEC_FIELDS[name]
    section, _, field_name = name.partition(".")
    cls = _POLICIES.get(section)
    known = {f.name: f for f in fields(cls)} if cls is not None else {}
    if field_name not in known:
        raise AxisError(f"--axis {name}: unknown field; allowed: {', '.join(axis_names())}")
    annotation = [part.strip() for part in str(known[field_name].type).split("|")]
    kind = {"float": float, "int": int, "bool": bool, "str": str}[annotation[0]]
    return _Field(kind, "None" in annotation, lambda v: True, f"a value {field_name} accepts")


def _scalar(name: str, rule: _Field, text: str) -> OverrideValue:
    """One value read as the field's type; None only where the field allows it."""
    word = text.strip()
    if rule.optional and word.lower() in ("none", "null"):
        return None
    value: OverrideValue
    try:
        if rule.kind is bool:
            value = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}[word.lower()]
        elif rule.kind is int:
            number = Decimal(word)
            if number != number.to_integral_value():
                raise ValueError(word)
            value = int(number)
        elif rule.kind is float:
            value = float(Decimal(word))
        else:
            value = word
    except (KeyError, ValueError, InvalidOperation) as error:
        kind = {bool: "true or false", int: "a whole number", float: "a number"}.get(rule.kind, "text")
        raise AxisError(f"--axis {name}: {word!r} is not {kind}; allowed: {rule.allowed}") from error
    _check_value(name, rule, value)
    return value


def _check_value(name: str, rule: _Field, value: OverrideValue) -> None:
    if value is not None and not rule.check(value):
        raise AxisError(f"--axis {name}: {value!r} is outside what it allows: {rule.allowed}")
    section, _, field_name = name.partition(".")
    if section in _POLICIES:
        # The field's own range (its message starts "FIELD must"); a check that ties it to other fields
        # (lifo needs max_outstanding) is left to the plan, which knows each condition's policy.
        try:
            replace(_POLICIES[section](), **{field_name: value})
        except ConfigError as error:
            if str(error).startswith(f"{field_name} must"):
                raise AxisError(f"--axis {name}: {error}") from error


def _range(name: str, rule: _Field, parts: list[str]) -> tuple[tuple[OverrideValue, ...], Decimal]:
    if rule.kind not in (int, float):
        raise AxisError(f"--axis {name}: a START:STOP:STEP range needs a numeric field; give a comma-separated "
                        f"list of {rule.allowed}")
    try:
        start, stop, step = (Decimal(p.strip()) for p in parts)
    except InvalidOperation as error:
        raise AxisError(f"--axis {name}: START:STOP:STEP must be three numbers, got {':'.join(parts)!r}") from error
    if step <= 0 or stop < start:
        raise AxisError(f"--axis {name}: need STEP > 0 and STOP >= START, got {':'.join(parts)!r}")
    count = int((stop - start) / step) + 1
    if count > MAX_VALUES:
        raise AxisError(f"--axis {name}: {count} values; at most {MAX_VALUES}")
    values = tuple(_scalar(name, rule, str(start + k * step)) for k in range(count))
    return values, step


def parse_axis(text: str) -> Axis:
    """`NAME=V1,V2,...` or `NAME=START:STOP:STEP` (STOP included when the steps reach it)."""
    name, sep, spec = text.partition("=")
    name = name.strip()
    if not sep or not spec.strip():
        raise AxisError(f"--axis {text!r}: give NAME=V1,V2,... or NAME=START:STOP:STEP")
    rule = _field(name)
    parts = spec.split(":")
    step: Decimal | None = None
    if len(parts) == 3:
        values, step = _range(name, rule, parts)
    elif len(parts) == 1:
        values = tuple(_scalar(name, rule, word) for word in spec.split(","))
    else:
        raise AxisError(f"--axis {name}: a range is START:STOP:STEP, got {spec!r}")
    if len(set(values)) != len(values):
        raise AxisError(f"--axis {name}: a value is repeated in {spec!r}")
    return Axis(name=name, values=values, step=step)


def parse_axes(texts: tuple[str, ...] | list[str]) -> list[Axis]:
    """Every `--axis`, each field at most once."""
    axes = [parse_axis(text) for text in texts]
    names = [axis.name for axis in axes]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise AxisError(f"--axis {', '.join(repeated)} given more than once; give all its values in one --axis")
    return axes
