"""Helpers of the finding tests: cached runs and the parametrization of a block's runs."""

from __future__ import annotations

from typing import Any

import pytest

from retrybench.blocks import paper_runs
from retrybench.runner import RunSpec, run_one

__all__ = ["PRIMARY", "block_runs", "result"]

PRIMARY = "qwen2.5-7b-instruct"


def result(model: str, condition: str, seed: int, **overrides: Any) -> dict[str, Any]:
    """One run's summary on the simulated engine, computed once and then read from the cache."""
    return run_one(RunSpec(model=model, condition=condition, seed=seed, **overrides))


def block_runs(block: str, models: tuple[str, ...], known: dict[tuple[str, int], str] | None = None) -> list[Any]:
    """(model, seed) params of a block with the paper's run counts, grouped so that one xdist
    worker computes every condition of one trace. `known` maps a (model, seed) on which the
    simulator does not reproduce the claim to the measured numbers: a strict xfail."""
    params = []
    for model in models:
        for seed in range(1, paper_runs(block, model) + 1):
            marks: list[Any] = [pytest.mark.xdist_group(f"{block}-{model}-{seed}")]
            if known and (model, seed) in known:
                marks.append(pytest.mark.xfail(strict=True, reason=known[(model, seed)]))
            params.append(pytest.param(model, seed, id=f"{model}-run{seed}", marks=marks))
    return params
