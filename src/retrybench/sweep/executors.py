"""The executors under the names `retrybench sweep`'s command imports (runs/executors.py and runs/ray.py
hold them): remove once it imports those."""

from __future__ import annotations

from retrybench.runs.executors import EXECUTORS, Executor, LocalExecutor, Progress, make_executor
from retrybench.runs.ray import RayExecutor, RayMissing

__all__ = ["EXECUTORS", "LocalExecutor", "Progress", "RayExecutor", "RayMissing", "RunExecutor", "make_executor"]

RunExecutor = Executor
