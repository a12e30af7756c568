"""A run spec's deployment (spec.RunSpec's replica and proxy-tier fields) as the simulator builds it:
the engine profile of each replica, the Deployment, and the build its C-hat is calibrated on."""

from __future__ import annotations

from dataclasses import replace

from retrybench.conditions.config import ConfigError
from retrybench.engine.profiles import GPUS, EngineProfile, profile_for
from retrybench.plan.spec import RunSpec
from retrybench.sim.deployment import Deployment
from retrybench.sim.speed import at_speed

__all__ = ["DeploymentBuild", "deployment_build", "deployment_of", "replica_profiles"]

# What a deployment's C-hat depends on: model, each replica's GPU, the router, the prompt mix and the token
# scale (the proxy tier does not enter: the calibration runs without controls).
DeploymentBuild = tuple[str, tuple[str, ...], str, bool, float]


def deployment_of(spec: RunSpec) -> Deployment:
    return Deployment(router=spec.router, proxies=spec.proxies, shared_state=spec.proxy_state == "shared",
                      front=spec.front)


def deployment_build(spec: RunSpec) -> DeploymentBuild:
    return (spec.model, spec.gpus(), spec.router, spec.mixed_prompts, spec.token_scale)


def replica_profiles(spec: RunSpec, cap: int | str | None = None) -> list[EngineProfile]:
    """Each replica's engine: its GPU's default arguments at the spec's step size and speed, with the queue cap
    `cap` per replica (vLLM's max_num_queued_reqs is an engine's own). A cap derived from C-hat ("auto",
    ceil(120 x C-hat)) is defined for one engine, not for a share of a deployment's: refused."""
    if cap == "auto" and spec.replicas > 1:
        raise ConfigError("the queue cap 'auto' (ceil(120 x C-hat)) is defined for one engine; give a number "
                          "per replica")
    resolved = cap if isinstance(cap, int) else None
    profiles = []
    for gpu in spec.gpus():
        engine = replace(GPUS[gpu].engine_defaults(), max_num_batched_tokens=spec.max_batched_tokens,
                         max_num_queued_reqs=resolved, gpu_memory_utilization=spec.gpu_memory_utilization)
        profiles.append(at_speed(profile_for(spec.model, gpu, engine, step_model=spec.step_model), spec.engine_speed))
    return profiles
