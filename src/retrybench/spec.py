"""A run's specification: which engine build, condition, trigger and seed; the domain type every
runner (simulated or live), the blocks of Table 1 and the report share."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from retrybench.cache import code_version
from retrybench.client_profiles import load_client_profile
from retrybench.config import Condition, EngineConfig, WorkloadSpec, load_condition
from retrybench.engine.profiles import GPUS

__all__ = ["RunSpec", "condition_for", "engine_config_for"]


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

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict, without `client` when it is unset: a run with the condition's own client
        keeps the record, the run log and the cache key it had before client profiles existed."""
        fields = asdict(self)
        if self.client is None:
            del fields["client"]
        return fields

    def workload(self, chat: float) -> WorkloadSpec:
        """The run's trace parameters at C-hat = `chat` calls/s."""
        spec = WorkloadSpec(chat_calls_per_s=chat, pulse_rate_x=self.pulse_x, mixed_prompts=self.mixed_prompts)
        return spec.scaled(self.token_scale)

    def key(self) -> str:
        """The cache key of this spec's result: the spec and the code that computes results."""
        text = json.dumps({"spec": self.as_dict(), "code": code_version()}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def condition_for(spec: RunSpec) -> Condition:
    """The spec's condition, its client replaced by the spec's client profile when one is named; the proxy
    policy and the engine cap stay the condition's."""
    condition = load_condition(spec.condition)
    if spec.client is None:
        return condition
    return replace(condition, client=load_client_profile(spec.client))


def engine_config_for(spec: RunSpec, condition: Condition, chat: float) -> tuple[EngineConfig, int | None]:
    """The engine arguments of a run, with its queue cap resolved ("auto" = ceil(120 x C-hat))."""
    cap = spec.engine_cap if spec.engine_cap is not None else condition.engine_cap
    if cap == "auto":
        cap = math.ceil(round(120 * chat, 6))  # robust to float noise
    resolved = cap if isinstance(cap, int) else None
    engine = replace(GPUS[spec.gpu].engine_defaults(), max_num_batched_tokens=spec.max_batched_tokens,
                     max_num_queued_reqs=resolved)
    return engine, resolved
