"""Keep the real engine and the harness (load generator, proxy) off each other's CPUs, and measure
what the harness itself costs.

On a small machine the load generator and the proxy compete with a CPU-build vLLM for the same
cores, so the engine's speed during a run depends on the harness's load: a comparison against the
simulator then measures the harness too. `pinning_plan` (pure) gives the engine one core and the
harness another; `pin_harness` applies the harness's half to this process, which the proxy it
starts inherits; the engine's half is an environment for vLLM's CPU build plus the affinity its
process starts under (`ServerProcess(cpus=...)`). vLLM 0.32's CPU build binds its OpenMP threads to
`VLLM_CPU_OMP_THREADS_BIND` ("0", "0-1", "auto", "nobind"); `VLLM_CPU_NUM_OF_RESERVED_CPU` is read
only with "auto", so an explicit list does not set it.

`HarnessMeter` reads this process's CPU time and that of its children waited for (the proxy,
which a live run starts and stops), so a run's harness load is known, as a share of one core.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

from typing_extensions import TypedDict

__all__ = ["CpuSample", "HarnessMeter", "PinningJson", "PinningPlan", "cpu_pct", "pin_harness", "pinning_plan"]


@dataclass(frozen=True, kw_only=True)
class PinningPlan:
    """Which CPUs the engine and the harness get; both None when nothing is pinned (`note` says why)."""

    engine_cpus: frozenset[int] | None
    harness_cpus: frozenset[int] | None
    note: str

    @property
    def pinned(self) -> bool:
        return self.engine_cpus is not None

    def engine_env(self) -> dict[str, str]:
        """vLLM CPU build's OpenMP binding: its worker's threads on the engine's CPUs only."""
        if self.engine_cpus is None:
            return {}
        return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in sorted(self.engine_cpus))}

    def to_json(self) -> PinningJson:
        return {"engine_cpus": sorted(self.engine_cpus) if self.engine_cpus is not None else None,
                "harness_cpus": sorted(self.harness_cpus) if self.harness_cpus is not None else None,
                "note": self.note}


class PinningJson(TypedDict):
    engine_cpus: list[int] | None
    harness_cpus: list[int] | None
    note: str


def pinning_plan(available: frozenset[int] | set[int]) -> PinningPlan:
    """The engine on the lowest available CPU, the harness on the next one; the rest stay unused, so
    that the engine meets the same contention (none) on a 2-core and a 16-core machine. With one CPU
    nothing can be separated."""
    cpus = sorted(available)
    if not cpus:
        raise ValueError("no CPU available to this process")
    if len(cpus) == 1:
        return PinningPlan(engine_cpus=None, harness_cpus=None,
                           note=f"not pinned: only CPU {cpus[0]} is available, so the engine and the harness share it")
    return PinningPlan(engine_cpus=frozenset({cpus[0]}), harness_cpus=frozenset({cpus[1]}),
                       note=f"engine on CPU {cpus[0]}, harness (load generator and proxy) on CPU {cpus[1]}"
                            + (f"; CPUs {', '.join(map(str, cpus[2:]))} unused" if len(cpus) > 2 else ""))


def pin_harness(plan: PinningPlan) -> None:
    """Pin this process (and so every process it starts afterwards) to the harness's CPUs."""
    if plan.harness_cpus is not None:
        os.sched_setaffinity(0, plan.harness_cpus)


@dataclass(frozen=True, slots=True)
class CpuSample:
    wall_s: float
    cpu_s: float  # user + system, this process and its children waited for


def cpu_pct(start: CpuSample, end: CpuSample) -> float:
    """CPU used between two samples as a percentage of one core (200 = two cores busy)."""
    wall = end.wall_s - start.wall_s
    if wall <= 0:
        raise ValueError(f"the samples are {wall} s apart: take the end after the start")
    return 100.0 * (end.cpu_s - start.cpu_s) / wall


class HarnessMeter:
    """The harness's CPU share over a stretch of time: `with HarnessMeter() as meter: ...` then
    `meter.pct`. Children count once they have been waited for, as a live run's proxy is when the
    run ends; a server still running (the engine) does not count."""

    def __init__(self) -> None:
        self.start: CpuSample | None = None
        self.end: CpuSample | None = None

    @staticmethod
    def sample() -> CpuSample:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
        return CpuSample(wall_s=time.monotonic(), cpu_s=cpu)

    def __enter__(self) -> HarnessMeter:
        self.start = self.sample()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = self.sample()

    @property
    def pct(self) -> float:
        if self.start is None or self.end is None:
            raise RuntimeError("measure inside `with HarnessMeter()` first")
        return cpu_pct(self.start, self.end)
