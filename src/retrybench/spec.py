"""A run's specification: which engine build, condition, trigger and seed; the domain type every
runner (simulated or live), the blocks of Table 1 and the report share."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace

from retrybench.cache import code_version
from retrybench.config import Condition, EngineConfig, WorkloadSpec
from retrybench.engine.profiles import GPUS

__all__ = ["RunSpec", "engine_config_for"]


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

    def workload(self, chat: float) -> WorkloadSpec:
        """The run's trace parameters at C-hat = `chat` calls/s."""
        spec = WorkloadSpec(chat_calls_per_s=chat, pulse_rate_x=self.pulse_x, mixed_prompts=self.mixed_prompts)
        return spec.scaled(self.token_scale)

    def key(self) -> str:
        """The cache key of this spec's result: the spec and the code that computes results."""
        text = json.dumps({"spec": asdict(self), "code": code_version()}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def engine_config_for(spec: RunSpec, condition: Condition, chat: float) -> tuple[EngineConfig, int | None]:
    """The engine arguments of a run, with its queue cap resolved ("auto" = ceil(120 x C-hat))."""
    cap = spec.engine_cap if spec.engine_cap is not None else condition.engine_cap
    if cap == "auto":
        cap = math.ceil(round(120 * chat, 6))  # robust to float noise
    resolved = cap if isinstance(cap, int) else None
    engine = replace(GPUS[spec.gpu].engine_defaults(), max_num_batched_tokens=spec.max_batched_tokens,
                     max_num_queued_reqs=resolved)
    return engine, resolved
