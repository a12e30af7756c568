"""What `retrybench gpus` lists: every GPU `--gpu` takes, with the figures that size and price its engine."""

from __future__ import annotations

from typing import TypedDict

from retrybench.engine.gpus import GIB, GPUS
from retrybench.engine.profiles import default_step_model, kernel_host_costs

__all__ = ["GpuRow", "gpu_rows"]


class GpuRow(TypedDict):
    gpu: str
    name: str
    memory_gib: float
    bandwidth_tb_per_s: float
    bf16_tflops: float
    kernel_system: str | None  # the kernel database's system; None: priced by the roofline only
    vllm: str | None  # the vLLM version its kernels were measured with
    step_model: str  # the default step model on it
    host_costs_from: str | None  # the GPU whose fitted host costs its kernels model reads


def gpu_rows() -> list[GpuRow]:
    rows: list[GpuRow] = []
    for key in sorted(GPUS):
        gpu = GPUS[key]
        step_model = default_step_model(key)
        rows.append(GpuRow(gpu=key, name=gpu.name, memory_gib=round(gpu.memory_bytes / GIB, 1),
                           bandwidth_tb_per_s=round(gpu.bandwidth_bytes_per_s / 1e12, 3),
                           bf16_tflops=round(gpu.bf16_flops_per_s / 1e12, 1), kernel_system=gpu.kernel_system,
                           vllm=gpu.kernel_vllm, step_model=step_model,
                           host_costs_from=kernel_host_costs(key)[1] if step_model == "kernels" else None))
    return rows
