"""A run's specification: which engine build, condition, trigger and seed; the domain type every
runner (simulated or live), the blocks of Table 1 and the report share."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from retrybench.cache import code_version
from retrybench.client_profiles import load_client_profile
from retrybench.config import (
    ClientPolicy,
    Condition,
    ConfigError,
    EngineConfig,
    ProxyPolicy,
    WorkloadSpec,
    load_condition,
)
from retrybench.engine.profiles import GPUS

__all__ = ["OverrideValue", "RunSpec", "condition_for", "engine_config_for"]

OverrideValue = float | int | bool | str | None


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One paper run: engine profile, model, condition, trigger, trace seed and overrides."""

    model: str
    condition: str
    seed: int
    gpu: str = "h100"
    pulse_x: float = 2.7
    max_batched_tokens: int = 8192
    mixed_prompts: bool = False
    engine_cap: int | None = None  # overrides the condition's cap
    trace: bool = False  # keep the engine trace and report where the prompt work went (Section 5)
    token_scale: float = 1.0  # every prompt and response length times this (a slower engine's workload)
    client: str | None = None  # a client profile (clients/) in place of the condition's client
    # Policy fields set over the condition's, as sorted ("proxy.defer_s", 2.0) pairs (a sweep's axes).
    overrides: tuple[tuple[str, OverrideValue], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict, without `client` and `overrides` when unset: a run with the condition's
        own policies keeps the record, the run log and the cache key it had before either existed."""
        record = asdict(self)
        if self.client is None:
            del record["client"]
        if self.overrides:
            record["overrides"] = dict(self.overrides)
        else:
            del record["overrides"]
        return record

    def workload(self, chat: float) -> WorkloadSpec:
        """The run's trace parameters at C-hat = `chat` calls/s."""
        spec = WorkloadSpec(chat_calls_per_s=chat, pulse_rate_x=self.pulse_x, mixed_prompts=self.mixed_prompts)
        return spec.scaled(self.token_scale)

    def key(self) -> str:
        """The cache key of this spec's result: the spec and the code that computes results."""
        text = json.dumps({"spec": self.as_dict(), "code": code_version()}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def condition_for(spec: RunSpec) -> Condition:
    """The spec's condition, its client replaced by the spec's client profile when one is named, then
    each override ("client.X" or "proxy.X") set; ConfigError names a field that is unknown or out of range."""
    condition = load_condition(spec.condition)
    if spec.client is not None:
        condition = replace(condition, client=load_client_profile(spec.client))
    for name, value in spec.overrides:
        condition = _overridden(condition, name, value)
    return condition


def _overridden(condition: Condition, name: str, value: OverrideValue) -> Condition:
    section, _, field_name = name.partition(".")
    change: dict[str, Any] = {field_name: value}
    try:
        if section == "client" and field_name in {f.name for f in fields(ClientPolicy)}:
            return replace(condition, client=replace(condition.client, **change))
        if section == "proxy" and field_name in {f.name for f in fields(ProxyPolicy)}:
            return replace(condition, proxy=replace(condition.proxy, **change))
    except ConfigError as error:
        raise ConfigError(f"{name}: {error}") from error
    raise ConfigError(f"unknown override {name!r}: give client.FIELD or proxy.FIELD")


def engine_config_for(spec: RunSpec, condition: Condition, chat: float) -> tuple[EngineConfig, int | None]:
    """The engine arguments of a run, with its queue cap resolved ("auto" = ceil(120 x C-hat))."""
    cap = spec.engine_cap if spec.engine_cap is not None else condition.engine_cap
    if cap == "auto":
        cap = math.ceil(round(120 * chat, 6))  # robust to float noise
    resolved = cap if isinstance(cap, int) else None
    engine = replace(GPUS[spec.gpu].engine_defaults(), max_num_batched_tokens=spec.max_batched_tokens,
                     max_num_queued_reqs=resolved)
    return engine, resolved
