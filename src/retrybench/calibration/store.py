"""C-hat of a run spec, through the calibration cache: what every run's rates are in.

A spec's C-hat is its build's: one engine (model, GPU, prompt mix, token scale, and the step size where
it is not the GPU's default) or, for a spec with several replicas, the replica set behind its router.
Each is calibrated on the simulated engine the paper's way, on CALIBRATION_SEEDS independent traces,
and cached by build and code version. A pool calibrates the missing builds with one task per
(build, seed), each calibration a sixth of a cold reproduction on one core otherwise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NotRequired, TypedDict

from retrybench.calibration.simulated import (
    CALIBRATION_SEEDS,
    RepeatedCalibration,
    average_calibrations,
    calibrate,
    calibrate_deployment,
)
from retrybench.calibration.stages import LATENCY_RATE, Calibration, StageRecord, stage_record
from retrybench.conditions.config import WorkloadSpec
from retrybench.engine.profiles import GPUS, profile_for
from retrybench.plan.spec import DEFAULT_GPU_MEMORY_UTILIZATION, RunSpec
from retrybench.records.cache import cache_dir, cached_json, code_version, has_entry, write_entry

__all__ = ["Build", "CalibrationRecord", "EngineBuild", "ReplicaSet", "build_of", "calibrate_missing",
           "calibration_at_steps", "calibration_for", "calibration_of", "chat_for"]


class SeedRecord(TypedDict):
    """One seed's calibration in a record."""

    seed: int
    chat: float
    saturated_stage_rate: float
    saturated_stage_growth_per_s: float
    stages: list[StageRecord]


class CalibrationRecord(TypedDict):
    """A build's calibration as cached and as `retrybench calibrate` prints it."""

    chat: float
    median_ttft_s_at_1_52: float
    median_e2e_s_at_1_52: float
    runs: list[SeedRecord]
    model: str
    gpu: str  # a replica set's: its replicas' GPUs, comma-separated
    mixed_prompts: bool
    token_scale: float
    max_batched_tokens: NotRequired[int]  # calibrated at another step size than the GPU's default
    gpu_memory_utilization: NotRequired[float]  # calibrated at another memory share than vLLM's 0.90
    replicas: NotRequired[int]
    router: NotRequired[str]


def _workload(mixed_prompts: bool, token_scale: float) -> WorkloadSpec:
    return WorkloadSpec(chat_calls_per_s=1.0, mixed_prompts=mixed_prompts).scaled(token_scale)


def _record(result: RepeatedCalibration, model: str, gpu: str, mixed_prompts: bool,
            token_scale: float) -> CalibrationRecord:
    return {"chat": result.chat_calls_per_s, "median_ttft_s_at_1_52": result.median_ttft_s,
            "median_e2e_s_at_1_52": result.median_e2e_s,
            "runs": [{"seed": seed, "chat": run.chat_calls_per_s,
                      "saturated_stage_rate": run.saturated.rate_calls_per_s,
                      "saturated_stage_growth_per_s": run.saturated.growth_per_s,
                      "stages": [stage_record(s) for s in run.stages]} for seed, run in enumerate(result.runs)],
            "model": model, "gpu": gpu, "mixed_prompts": mixed_prompts, "token_scale": token_scale}


@dataclass(frozen=True)
class EngineBuild:
    """One engine: what its C-hat depends on. `max_batched_tokens` None: the GPU's default step size."""

    model: str
    gpu: str = "h100"
    mixed_prompts: bool = False
    token_scale: float = 1.0
    max_batched_tokens: int | None = None
    step_model: str | None = None  # None: the GPU's default (engine.profiles.default_step_model)
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION  # the KV cache's share of memory (vLLM's)

    def path(self) -> Path:
        if self.gpu_memory_utilization != DEFAULT_GPU_MEMORY_UTILIZATION:  # the default keeps its earlier paths
            parts = [self.model, self.gpu, self.mixed_prompts, self.token_scale, self.max_batched_tokens,
                     self.step_model, self.gpu_memory_utilization, code_version()]
            digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]
            return cache_dir() / "calibration" / f"{self.model}-{self.gpu}-mem{self.gpu_memory_utilization:g}-" \
                                                 f"{digest}.json"
        if self.step_model is not None:
            parts = [self.model, self.gpu, self.mixed_prompts, self.token_scale, self.max_batched_tokens,
                     self.step_model, code_version()]
            digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]
            return cache_dir() / "calibration" / f"{self.model}-{self.gpu}-{self.step_model}-{digest}.json"
        if self.max_batched_tokens is not None:
            return cache_dir() / "calibration" / f"{self.model}-{self.gpu}-steps{self.max_batched_tokens}-" \
                                                 f"{code_version()}.json"
        parts = [self.model, self.gpu, self.mixed_prompts, code_version()]
        key = hashlib.sha256(json.dumps(parts + ([self.token_scale] if self.token_scale != 1 else [])).encode())
        mixed = "mixed-" if self.mixed_prompts else ""
        return cache_dir() / "calibration" / f"{self.model}-{self.gpu}-{mixed}{key.hexdigest()[:24]}.json"

    def calibrate_seed(self, seed: int) -> Calibration:
        engine = replace(GPUS[self.gpu].engine_defaults(), gpu_memory_utilization=self.gpu_memory_utilization)
        if self.max_batched_tokens is not None:
            engine = replace(engine, max_num_batched_tokens=self.max_batched_tokens)
        return calibrate(profile_for(self.model, self.gpu, engine, step_model=self.step_model), seed=seed,
                         spec=_workload(self.mixed_prompts, self.token_scale))

    def record(self, runs: tuple[Calibration, ...]) -> CalibrationRecord:
        record = _record(average_calibrations(runs), self.model, self.gpu, self.mixed_prompts, self.token_scale)
        if self.max_batched_tokens is not None:
            record["max_batched_tokens"] = self.max_batched_tokens
        if self.gpu_memory_utilization != DEFAULT_GPU_MEMORY_UTILIZATION:
            record["gpu_memory_utilization"] = self.gpu_memory_utilization
        return record


@dataclass(frozen=True)
class ReplicaSet:
    """Several replicas behind a router: C-hat of the whole deployment (the proxy tier does not enter:
    the calibration runs without controls)."""

    model: str
    gpus: tuple[str, ...]
    router: str
    mixed_prompts: bool = False
    token_scale: float = 1.0
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION

    def path(self) -> Path:
        parts = [self.model, list(self.gpus), self.router, self.mixed_prompts, self.token_scale, code_version()]
        if self.gpu_memory_utilization != DEFAULT_GPU_MEMORY_UTILIZATION:  # the default keeps its earlier paths
            parts.append(self.gpu_memory_utilization)
        key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]
        return cache_dir() / "calibration" / f"{self.model}-{len(self.gpus)}-replicas-{self.router}-{key}.json"

    def calibrate_seed(self, seed: int) -> Calibration:
        engines = [replace(GPUS[gpu].engine_defaults(), gpu_memory_utilization=self.gpu_memory_utilization)
                   for gpu in self.gpus]
        return calibrate_deployment([profile_for(self.model, gpu, engine) for gpu, engine in zip(self.gpus, engines,
                                                                                                strict=True)],
                                    self.router, seed=seed,
                                    spec=_workload(self.mixed_prompts, self.token_scale))

    def record(self, runs: tuple[Calibration, ...]) -> CalibrationRecord:
        record = _record(average_calibrations(runs, LATENCY_RATE * len(self.gpus)), self.model, ",".join(self.gpus),
                         self.mixed_prompts, self.token_scale)
        record["replicas"], record["router"] = len(self.gpus), self.router
        return record


Build = EngineBuild | ReplicaSet


def build_of(spec: RunSpec) -> Build:
    """The build a spec's rates are in: its engine's, or its replica set's when it has several."""
    if spec.replicas > 1:
        return ReplicaSet(spec.model, spec.gpus(), spec.router, spec.mixed_prompts, spec.token_scale,
                          spec.gpu_memory_utilization)
    return EngineBuild(spec.model, spec.gpu, spec.mixed_prompts, spec.token_scale, step_model=spec.step_model,
                       gpu_memory_utilization=spec.gpu_memory_utilization)


def _calibrate(build: Build) -> CalibrationRecord:
    return build.record(tuple(build.calibrate_seed(seed) for seed in range(CALIBRATION_SEEDS)))


def calibration_of(build: Build, use_cache: bool = True) -> CalibrationRecord:
    """The build's calibration: C-hat, the latencies at 1.52 calls/s per replica and every seed's stages."""
    return cached_json(build.path(), lambda: _calibrate(build), use_cache)


def calibration_for(model: str, gpu: str = "h100", mixed_prompts: bool = False, use_cache: bool = True,
                    token_scale: float = 1.0, step_model: str | None = None,
                    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> CalibrationRecord:
    """C-hat and the calibration stages of one engine build (default engine arguments)."""
    return calibration_of(EngineBuild(model, gpu, mixed_prompts, token_scale, step_model=step_model,
                                      gpu_memory_utilization=gpu_memory_utilization), use_cache)


def calibration_at_steps(model: str, gpu: str, max_batched_tokens: int, use_cache: bool = True) -> CalibrationRecord:
    """C-hat of a build calibrated at another step size (12,000-token prompts). The paper calibrated at
    8,192 batched tokens only, and its 2,048-token runs keep that C-hat: this is recorded beside it, never
    used to set a run's rates."""
    return calibration_of(EngineBuild(model, gpu, max_batched_tokens=max_batched_tokens), use_cache)


def chat_for(spec: RunSpec, use_cache: bool = True) -> float:
    """The C-hat a spec's rates are in."""
    return float(calibration_of(build_of(spec), use_cache)["chat"])


def calibrate_missing(pool: Executor, builds: Iterable[Build]) -> None:
    """Calibrate the builds not (soundly) cached on `pool`, every (build, seed) a task of its own, and cache
    them where calibration_of reads them."""
    missing = [b for b in dict.fromkeys(builds) if not has_entry(b.path(), report=True)]
    futures = {(b, seed): pool.submit(b.calibrate_seed, seed) for b in missing for seed in range(CALIBRATION_SEEDS)}
    for build in missing:
        write_entry(build.path(), build.record(tuple(futures[build, seed].result()
                                                     for seed in range(CALIBRATION_SEEDS))))
