"""A run's specification: which engine build, condition, trigger and seed; the domain type every
runner (simulated or live), the blocks of Table 1 and the report share."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from retrybench.conditions.client_profiles import load_client_profile
from retrybench.conditions.config import (
    ClientPolicy,
    Condition,
    ConfigError,
    EngineConfig,
    ProxyPolicy,
    WorkloadSpec,
    load_condition,
)
from retrybench.control.router import FRONT_POLICIES, ROUTER_POLICIES
from retrybench.engine.profiles import GPUS, STEP_MODELS
from retrybench.records.cache import code_version

__all__ = ["DEFAULT_GPU_MEMORY_UTILIZATION", "DEPLOYMENT_DEFAULTS", "PROXY_STATES", "WORKLOAD_DEFAULTS",
           "OverrideValue", "RunSpec", "condition_for", "engine_config_for"]

OverrideValue = float | int | bool | str | None

PROXY_STATES = ("per-instance", "shared")
MAX_REPLICAS = 64
# The deployment fields at their defaults: one engine behind one proxy, the paper's. A spec that leaves
# them so keeps the record and the cache key it had before they existed.
DEPLOYMENT_DEFAULTS: dict[str, object] = {"replicas": 1, "replica_gpus": None, "router": "round-robin",
                                          "proxies": 1, "proxy_state": "per-instance", "front": "random"}
# The recorded-workload fields at their defaults: the paper's generated trace. Left out of the record and
# the cache key so, likewise, a paper run keeps the key it had before a recorded workload could be given.
WORKLOAD_DEFAULTS: dict[str, object] = {"workload_file": None, "workload_digest": None, "workload_format": None,
                                        "rate_x": None, "pulses": ()}
PAPER_PULSE_X = 2.7
DEFAULT_GPU_MEMORY_UTILIZATION = EngineConfig().gpu_memory_utilization  # vLLM's 0.90


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
    # The deployment (docs/replicas.md): engine replicas behind a router, proxy instances behind a front.
    replicas: int = 1
    replica_gpus: str | None = None  # each replica's GPU, comma-separated ("h100,h200"); None: all on `gpu`
    router: str = "round-robin"  # control.router.ROUTER_POLICIES
    proxies: int = 1  # proxy instances
    proxy_state: str = "per-instance"  # or "shared": one coalescing table, budget and queue for all
    front: str = "random"  # how attempts are spread over the instances: control.router.FRONT_POLICIES
    # How the simulated engine prices a step (engine.profiles.STEP_MODELS); None: the GPU's default (the
    # measured kernels where the database has the GPU).
    step_model: str | None = None
    # A recorded workload (docs/workloads.md) in place of the paper's trace: the file, its content digest
    # (part of the run's identity, so a changed file is a different run) and the format it is read as.
    workload_file: str | None = None
    workload_digest: str | None = None
    workload_format: str | None = None
    rate_x: float | None = None  # the file's arrivals rescaled to this multiple of C-hat; None: as recorded
    pulses: tuple[tuple[float, float, float], ...] = ()  # bursts over it: (at_s, duration_s, x C-hat)
    # Every engine step 1/engine_speed as long, the trace still at the calibrated C-hat (a verdict's margin,
    # docs/margins.md): the engine a run meets is faster or slower than the one calibration measured.
    engine_speed: float = 1.0
    # The share of the GPU's memory vLLM may use (its --gpu-memory-utilization): what is left of it after the
    # weights and the activation reserve is the KV cache. Left out of the record and the cache key at vLLM's
    # default, so a run keeps the key it had before it could be set.
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION

    def __post_init__(self) -> None:
        # JSON gives lists back: keep one spelling of the bursts, so equal specs stay equal and hashable.
        object.__setattr__(self, "pulses", tuple(tuple(float(v) for v in p) for p in self.pulses))
        _check_deployment(self)
        _check_workload(self)
        if self.step_model is not None and self.step_model not in STEP_MODELS:
            raise ConfigError(f"step_model must be one of {', '.join(STEP_MODELS)}, got {self.step_model!r}")
        if self.step_model == "kernels" and any(GPUS[g].kernel_system is None for g in self.gpus() if g in GPUS):
            raise ConfigError(f"the kernel database has no {self.gpu} GPU: use step_model 'roofline'")
        if not 0 < self.engine_speed < math.inf:
            raise ConfigError(f"engine_speed must be positive and finite, got {self.engine_speed}")
        if not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in [0.05, 1], got {self.gpu_memory_utilization}")

    @property
    def deployed(self) -> bool:
        """Whether the run has more than one engine replica or proxy instance (else the paper's setup)."""
        return self.replicas > 1 or self.proxies > 1

    def gpus(self) -> tuple[str, ...]:
        """The GPU of each engine replica."""
        if self.replica_gpus is None:
            return (self.gpu,) * self.replicas
        return tuple(g.strip() for g in self.replica_gpus.split(","))

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict, without `client`, `overrides`, `step_model` and `engine_speed` when unset: a
        run with the condition's own policies on the calibrated engine keeps the record, the run log and the
        cache key it had before any of them existed."""
        record = asdict(self)
        if self.client is None:
            del record["client"]
        if self.step_model is None:
            del record["step_model"]
        if self.overrides:
            record["overrides"] = dict(self.overrides)
        else:
            del record["overrides"]
        for name, default in (DEPLOYMENT_DEFAULTS | WORKLOAD_DEFAULTS).items():
            if record[name] == default:
                del record[name]
        if "pulses" in record:
            record["pulses"] = [list(p) for p in self.pulses]
        if self.engine_speed == 1.0:
            del record["engine_speed"]
        if self.gpu_memory_utilization == DEFAULT_GPU_MEMORY_UTILIZATION:
            del record["gpu_memory_utilization"]
        return record

    def workload(self, chat: float) -> WorkloadSpec:
        """The run's trace parameters at C-hat = `chat` calls/s."""
        spec = WorkloadSpec(chat_calls_per_s=chat, pulse_rate_x=self.pulse_x, mixed_prompts=self.mixed_prompts)
        return spec.scaled(self.token_scale)

    def key(self) -> str:
        """The cache key of this spec's result: the spec and the code that computes results."""
        text = json.dumps({"spec": self.as_dict(), "code": code_version()}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def _check_deployment(spec: RunSpec) -> None:
    """ConfigError naming the deployment field that is out of range, or set where it changes nothing
    (so that one deployment has one spec, and one cache key)."""
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        raise ConfigError(f"replicas must be 1 to {MAX_REPLICAS}, got {spec.replicas}")
    if spec.proxies < 1:
        raise ConfigError(f"proxies must be >= 1, got {spec.proxies}")
    if spec.router not in ROUTER_POLICIES:
        raise ConfigError(f"router must be one of {', '.join(ROUTER_POLICIES)}, got {spec.router!r}")
    if spec.proxy_state not in PROXY_STATES:
        raise ConfigError(f"proxy_state must be one of {', '.join(PROXY_STATES)}, got {spec.proxy_state!r}")
    if spec.front not in FRONT_POLICIES:
        raise ConfigError(f"front must be one of {', '.join(FRONT_POLICIES)}, got {spec.front!r}")
    if spec.replica_gpus is not None:
        gpus = spec.gpus()
        unknown = [g for g in gpus if g not in GPUS]
        if unknown:
            raise ConfigError(f"replica_gpus: unknown GPU(s) {', '.join(unknown)}; known: {', '.join(GPUS)}")
        if len(gpus) != spec.replicas:
            raise ConfigError(f"replica_gpus names {len(gpus)} GPU(s) for {spec.replicas} replica(s)")
    if spec.replicas == 1 and spec.router != "round-robin":
        raise ConfigError(f"router {spec.router!r} needs replicas > 1 (one replica takes every execution)")
    if spec.proxies == 1 and (spec.proxy_state != "per-instance" or spec.front != "random"):
        raise ConfigError("proxy_state and front need proxies > 1 (one instance holds the only state)")
    if spec.proxy_state == "shared" and spec.front != "random":
        raise ConfigError("front does not matter with shared proxy state: leave it at 'random'")
    if spec.trace and spec.replicas > 1:
        raise ConfigError("the engine trace (trace=True) is kept for one replica only")


def _check_workload(spec: RunSpec) -> None:
    """ConfigError where the recorded-workload fields are incomplete or meet an option of the paper's
    trace (which would change nothing, yet give the one run a second cache key)."""
    if spec.workload_file is None:
        given = [name for name, default in WORKLOAD_DEFAULTS.items() if getattr(spec, name) != default]
        if given:
            raise ConfigError(f"{', '.join(given)} need a recorded workload (workload_file); the paper's trace has "
                              "its own pulse (pulse_x)")
        return
    if not spec.workload_digest or not spec.workload_format:
        raise ConfigError("a recorded workload needs its content digest and format (plan.recorded.workload_fields)")
    if spec.pulse_x != PAPER_PULSE_X:
        raise ConfigError("pulse_x is the paper's pulse: over a recorded workload give pulses (--pulse AT:DURATION:X)")
    if spec.mixed_prompts or spec.token_scale != 1.0:
        raise ConfigError("mixed_prompts and token_scale change the paper's trace: a recorded workload's lengths "
                          "are the file's")
    if spec.rate_x is not None and not 0 < spec.rate_x <= 100:
        raise ConfigError(f"rate_x must be in (0, 100] (multiples of C-hat), got {spec.rate_x}")
    for at_s, duration_s, x in spec.pulses:
        if not (0 <= at_s < math.inf and 0 < duration_s < math.inf and 0 < x <= 100):
            raise ConfigError(f"a pulse needs AT >= 0 s, DURATION > 0 s and X in (0, 100], got "
                              f"{at_s:g}:{duration_s:g}:{x:g}")


def condition_for(spec: RunSpec) -> Condition:
    """The spec's condition, its client replaced by the spec's client profile when one is named, then
    each override ("client.X" or "proxy.X") set; ConfigError names a field that is unknown or out of range."""
    condition = load_condition(spec.condition)
    if spec.client is not None:
        condition = replace(condition, client=load_client_profile(spec.client))
    for name, value in spec.overrides:
        if name.startswith("layer."):
            continue  # a stacked client's layer: plan/stack_spec.py sets it
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
                     max_num_queued_reqs=resolved, gpu_memory_utilization=spec.gpu_memory_utilization)
    return engine, resolved
