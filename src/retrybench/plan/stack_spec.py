"""A run spec's stacked client: the layers of its client profile (a [[layer]] profile, docs/stacks.md), each
overridden by the spec's `layer.NAME.FIELD` overrides (a layer's retries turned off, say)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from retrybench.conditions.client_profiles import client_stack
from retrybench.conditions.client_stack import StackLayer
from retrybench.conditions.config import ClientPolicy, ConfigError
from retrybench.plan.spec import RunSpec

__all__ = ["LAYER_OVERRIDE", "client_stack_for"]

LAYER_OVERRIDE = "layer."


def client_stack_for(spec: RunSpec) -> tuple[StackLayer, ...] | None:
    """The spec's stacked client, its layer overrides set; None when its client is one policy (and then a
    layer override is an error that names it)."""
    layer_overrides = [(name, value) for name, value in spec.overrides if name.startswith(LAYER_OVERRIDE)]
    layers = client_stack(spec.client) if spec.client is not None else None
    if layers is None:
        if layer_overrides:
            raise ConfigError(f"override {layer_overrides[0][0]!r} needs a stacked client profile ([[layer]] "
                              f"tables); the spec's client is {spec.client!r}")
        return None
    by_name = {layer.name: layer for layer in layers}
    for name, value in layer_overrides:
        layer_name, _, field_name = name[len(LAYER_OVERRIDE):].rpartition(".")
        if layer_name not in by_name:
            raise ConfigError(f"override {name!r}: no layer {layer_name!r} in {spec.client!r}; its layers: "
                              f"{', '.join(by_name)}")
        by_name[layer_name] = _overridden(by_name[layer_name], name, field_name, value)
    return tuple(by_name[layer.name] for layer in layers)


def _overridden(layer: StackLayer, name: str, field_name: str, value: Any) -> StackLayer:
    try:
        if field_name == "timeout_kind":
            return replace(layer, timeout_kind=value)
        if field_name in {f.name for f in fields(ClientPolicy)}:
            return replace(layer, policy=replace(layer.policy, **{field_name: value}))
    except ConfigError as error:
        raise ConfigError(f"{name}: {error}") from error
    raise ConfigError(f"unknown override {name!r}: give layer.NAME.FIELD, FIELD a client policy field or timeout_kind")
