"""A client as a stack of retry layers (a `[[layer]]` client profile), outermost first: an application's
retry wrapper around an SDK behind a gateway, each layer with its own retry policy and its own timeout.

A layer's timeout is `attempt_timeout_s`, read as its `timeout_kind` says:
  "total": the layer's attempt (everything inside it: the inner layers' attempts and their waits) is cut
    `attempt_timeout_s` after it began;
  "first_byte": the layer's attempt is cut when no first token has reached it `attempt_timeout_s` after it
    began; once one has, this layer no longer cuts it (a gateway's idle timeout before the first byte).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from retrybench.conditions.config import ClientPolicy, ConfigError, _check

__all__ = ["MAX_LAYERS", "TIMEOUT_KINDS", "StackLayer", "layers_from_tables"]

TIMEOUT_KINDS = ("total", "first_byte")
MAX_LAYERS = 8
_LAYER_KEYS = ("name", "timeout_kind")

# (table, where, section label) -> the table's policy; client_profiles supplies its own parser.
PolicyBuilder = Callable[[Any, str, str], ClientPolicy]


@dataclass(frozen=True, kw_only=True)
class StackLayer:
    """One layer of a stacked client: its name, its retry policy and how its timeout is read."""

    name: str
    policy: ClientPolicy
    timeout_kind: str = "total"

    def __post_init__(self) -> None:
        _check(bool(self.name.strip()), "a layer's name must be a non-empty string")
        _check(self.timeout_kind in TIMEOUT_KINDS,
               f"timeout_kind must be one of {', '.join(TIMEOUT_KINDS)}; got {self.timeout_kind!r}")

    @property
    def timeout_s(self) -> float:
        return self.policy.attempt_timeout_s


def layers_from_tables(tables: Any, where: str, build: PolicyBuilder) -> tuple[StackLayer, ...]:
    """The `[[layer]]` array of tables as layers, outermost first; every error names `where`, the layer
    (its position and name) and the field."""
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{where}: 'layer' must be an array of tables ([[layer]]), at least one")
    _check(len(tables) <= MAX_LAYERS, f"{where}: at most {MAX_LAYERS} layers, got {len(tables)}")
    layers: list[StackLayer] = []
    for position, table in enumerate(tables):
        name = table.get("name")
        label = f"[[layer]] {position}" + (f" ({name!r})" if isinstance(name, str) else "")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{where} {label}: field 'name' must be a non-empty string, got {name!r}")
        _check(name not in {layer.name for layer in layers}, f"{where} {label}: layer name {name!r} used twice")
        kind = table.get("timeout_kind", "total")
        if kind not in TIMEOUT_KINDS:
            raise ConfigError(f"{where} {label}: field 'timeout_kind' must be one of {', '.join(TIMEOUT_KINDS)}; "
                              f"got {kind!r}")
        policy = build({k: v for k, v in table.items() if k not in _LAYER_KEYS}, where, label)
        layers.append(StackLayer(name=name, policy=policy, timeout_kind=kind))
    return tuple(layers)
