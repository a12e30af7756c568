"""A sweep's plan: conditions x axis values x seeds -> run specs, each checked before any run.

A point of the sweep is a condition, a seed and one value per axis; its run spec carries spec-field
axes as fields and policy-field axes as RunSpec.overrides, so a point with no override is the very spec
(and cache key) `retrybench run` and `reproduce` use.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal
from typing import Any

from retrybench.conditions.config import ConfigError, load_condition
from retrybench.engine.profiles import profile_for
from retrybench.plan.recorded import WorkloadFields
from retrybench.plan.spec import OverrideValue, RunSpec, condition_for, engine_config_for
from retrybench.sweep.axes import Axis
from retrybench.sweep.bisect import grid

__all__ = ["PlanError", "Point", "SweepPlan", "check_specs", "parse_conditions"]


class PlanError(ValueError):
    """A plan that cannot run: an unknown condition, or axis values a condition or engine refuses."""


Values = tuple[tuple[str, OverrideValue], ...]  # (axis name, value) in the plan's axis order


@dataclass(frozen=True)
class Point:
    """One run of the sweep."""

    condition: str
    seed: int
    values: Values
    spec: RunSpec


def parse_conditions(text: str) -> tuple[str, ...]:
    """Comma-separated conditions (names in policies/ or TOML paths), each loaded to check it."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise PlanError("--condition: give at least one condition")
    for name in names:
        try:
            load_condition(name)
        except ConfigError as error:
            raise PlanError(f"--condition: {error}") from error
    return names


@dataclass(frozen=True)
class SweepPlan:
    """Conditions x axes x seeds on one engine build (unless `model` or `gpu` is itself an axis)."""

    conditions: tuple[str, ...]
    axes: tuple[Axis, ...]
    seeds: tuple[int, ...]
    model: str
    gpu: str = "h100"
    recorded: WorkloadFields = field(default_factory=WorkloadFields)  # --workload's fields, every point's

    def spec(self, condition: str, seed: int, values: Values) -> RunSpec:
        """The run spec of one point. An override equal to the condition's own value is left out, so that
        the point is the condition's plain spec and shares its cached run (proxy.defer_s=10 on
        deferred-cancellation is the paper's run)."""
        change: dict[str, Any] = {name: value for name, value in values if "." not in name}  # axes.py typed them
        try:
            spec = replace(RunSpec(model=self.model, condition=condition, seed=seed, gpu=self.gpu, **self.recorded),
                           **change)
        except ConfigError as error:  # a field the spec refuses with the others (rate_x without --workload)
            raise PlanError(f"--axis values refused ({', '.join(f'{n}={v}' for n, v in values)}): {error}") from error
        overrides = [(name, value) for name, value in values if "." in name]
        if not overrides:
            return spec
        own = _policy_values(spec)
        changed = tuple(sorted((n, v) for n, v in overrides if n not in own or own[n] != v))
        return replace(spec, overrides=changed)

    def points(self, axes: Iterable[Axis] | None = None,
               fixed: Mapping[str, OverrideValue] | None = None) -> list[Point]:
        """Every point over `axes` (default: all), conditions outermost and seeds innermost; `fixed`
        sets the value of an axis left out."""
        chosen = list(self.axes if axes is None else axes)
        fixed = dict(fixed or {})
        found: list[Point] = []
        for condition in self.conditions:
            for combo in itertools.product(*(axis.values for axis in chosen)):
                given = dict(zip((a.name for a in chosen), combo, strict=True)) | fixed
                values = tuple((a.name, given[a.name]) for a in self.axes if a.name in given)
                found.extend(Point(condition, seed, values, self.spec(condition, seed, values)) for seed in self.seeds)
        return found

    def axis(self, name: str) -> Axis:
        for axis in self.axes:
            if axis.name == name:
                return axis
        raise PlanError(f"--find {name}: not an axis of this sweep; give its bounds with --axis {name}=LOW:HIGH:STEP")

    def find_grid(self, name: str, resolution: Decimal | None) -> list[float]:
        """The values a boundary search along axis `name` may probe: its bounds cut at `resolution`
        (default: the axis' step)."""
        axis = self.axis(name)
        if not axis.numeric or len(axis.values) < 2:
            raise PlanError(f"--find {name}: the axis needs two numeric values at least (its bounds)")
        step = resolution if resolution is not None else axis.step
        if step is None:
            raise PlanError(f"--find {name}: give --resolution (the axis is a list, without a step)")
        integral = all(isinstance(v, int) for v in axis.values)
        if integral and step != step.to_integral_value():
            raise PlanError(f"--resolution {step}: {name} takes whole numbers; give a whole resolution")
        numbers = [Decimal(str(v)) for v in axis.values]
        return [int(v) if integral else float(v) for v in grid(min(numbers), max(numbers), step)]


def _policy_values(spec: RunSpec) -> dict[str, object]:
    """The client and proxy fields of the spec's condition (with its client profile), by axis name;
    empty where the condition does not load (check_specs reports it)."""
    try:
        condition = condition_for(spec)
    except (ConfigError, ValueError):
        return {}
    return {f"{section}.{name}": value for section, policy in (("client", condition.client), ("proxy", condition.proxy))
            for name, value in asdict(policy).items()}


def check_specs(specs: Iterable[RunSpec]) -> None:
    """Build each distinct condition, engine and workload the specs need, so that a value one of them
    refuses fails the sweep before any run, naming the axis value and the condition."""
    seen: set[RunSpec] = set()
    for spec in specs:
        key = replace(spec, seed=0)
        if key in seen:
            continue
        seen.add(key)
        where = ", ".join([f"condition {spec.condition}", *(f"{n}={v}" for n, v in spec.overrides)])
        try:
            condition = condition_for(spec)
            engine, _cap = engine_config_for(spec, condition, 1.0)
            profile_for(spec.model, spec.gpu, engine)
            spec.workload(1.0)
        except (ConfigError, ValueError) as error:
            raise PlanError(f"--axis values refused ({where}, model {spec.model} on {spec.gpu}): {error}") from error
