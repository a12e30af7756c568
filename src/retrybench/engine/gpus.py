"""The GPUs a simulated engine runs on: the paper's two with the figures their drivers report, vLLM's
CPU build, and every other GPU the kernel database has vLLM kernel data for, read from the packaged
registry (gpus.toml, written by scripts/build_gpu_registry.py) so that listing them and sizing a
model's KV cache need no database installed.

A registry GPU's memory is its system file's capacity (nominal for some, as the driver reports for
others); its step costs come from the database's kernels, and its host costs from the H100's fit
(profiles.kernel_host_costs): no other GPU's figures were fitted.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TypedDict, cast

from retrybench.conditions.config import EngineConfig
from retrybench.engine.layer_table import LayerTable

__all__ = ["GIB", "GPUS", "REGISTRY_FIELDS", "GpuSpec", "RegistryGpu", "registry", "registry_path"]

GIB = 1024**3
REGISTRY_FIELDS = ("system", "vllm", "memory_bytes", "bandwidth_bytes_per_s", "bf16_flops_per_s")


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    name: str
    memory_bytes: float  # what the driver reports as total memory
    bandwidth_bytes_per_s: float
    bf16_flops_per_s: float  # dense
    # What vLLM's platform sets on its own: the CPU build uses 128-token blocks, runs one batch at a
    # time and takes its KV cache size from VLLM_CPU_KVCACHE_SPACE instead of memory profiling.
    block_size: int = 16
    async_scheduling: bool = True
    kv_cache_bytes: float | None = None
    # Measured GEMM and elementwise times (engine/layer_table.py): a packaged table's name (the H100's, for
    # the GPUs) or a table itself; None: the plain roofline.
    layer_profile: str | LayerTable | None = "h100_llama2_7b_layer_ms.csv"
    # The kernel database's system and the vLLM version its kernels were measured with (the `kernels` step
    # model, engine/kernel_steps.py); None: the GPU is not in it, and only the roofline prices its steps.
    kernel_system: str | None = None
    kernel_vllm: str | None = None

    def engine_defaults(self) -> EngineConfig:
        """vLLM's engine arguments on this platform (the paper's, with the platform's own settings)."""
        return EngineConfig(block_size=self.block_size, async_scheduling=self.async_scheduling)


class RegistryGpu(TypedDict):
    """One GPU of gpus.toml."""

    name: str
    system: str
    vllm: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    bf16_flops_per_s: float


def registry_path() -> str:
    return str(resources.files("retrybench") / "engine" / "gpus.toml")


@cache
def registry() -> dict[str, RegistryGpu]:
    """The packaged registry, by the short name `--gpu` takes."""
    text = (resources.files("retrybench") / "engine" / "gpus.toml").read_text()
    return cast(dict[str, RegistryGpu], tomllib.loads(text)["gpu"])


def _from_registry(gpu: RegistryGpu) -> GpuSpec:
    return GpuSpec(name=gpu["name"], memory_bytes=float(gpu["memory_bytes"]),
                   bandwidth_bytes_per_s=float(gpu["bandwidth_bytes_per_s"]),
                   bf16_flops_per_s=float(gpu["bf16_flops_per_s"]), kernel_system=gpu["system"],
                   kernel_vllm=gpu["vllm"])


# The paper's GPUs keep the memory their drivers report (their runs' KV capacity, and so their cache keys,
# predate the registry); the registry's figures for them are the database's nominal ones.
PAPER_GPUS: dict[str, GpuSpec] = {
    # NVIDIA H100 SXM5 80 GB HBM3: 81,559 MiB reported, 3.35 TB/s, 989 TFLOP/s dense BF16.
    "h100": GpuSpec(name="NVIDIA H100 80GB HBM3 (SXM)", memory_bytes=81_559 * 1024**2,
                    bandwidth_bytes_per_s=3.35e12, bf16_flops_per_s=989.4e12, kernel_system="h100_sxm",
                    kernel_vllm="0.24.0"),
    # NVIDIA H200 SXM 141 GB HBM3e: 143,771 MiB reported, 4.8 TB/s, same compute as H100.
    "h200": GpuSpec(name="NVIDIA H200 (SXM)", memory_bytes=143_771 * 1024**2,
                    bandwidth_bytes_per_s=4.8e12, bf16_flops_per_s=989.4e12, kernel_system="h200_sxm",
                    kernel_vllm="0.24.0"),
    # vLLM's CPU build on a 2-core x86 machine with VLLM_CPU_KVCACHE_SPACE=2 (the real-engine tests'),
    # seen at time scale 0.1: its clocks are trace seconds, so the peaks are a tenth of the nominal
    # wall-clock ones (2 cores x 2 AVX-512 FMA units x 32 bf16 lanes x 2 x ~2 GHz; one DDR channel).
    # The fitted efficiencies absorb what the nominal figures miss (scripts/fit_profiles.py --gpu cpu).
    "cpu": GpuSpec(name="CPU, 2 cores (vLLM CPU build), time scale 0.1", memory_bytes=24 * GIB,
                   bandwidth_bytes_per_s=2e9, bf16_flops_per_s=0.05e12, block_size=128, async_scheduling=False,
                   kv_cache_bytes=2 * GIB, layer_profile=None),
}

GPUS: dict[str, GpuSpec] = {**{short: _from_registry(gpu) for short, gpu in sorted(registry().items())},
                            **PAPER_GPUS}
