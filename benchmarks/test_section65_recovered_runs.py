"""Section 6.5: every recovered run created executions at the proxy below C-hat (over 347-947 s),
across every run of every block. The paper names one exception class the other way round (a run
below C-hat that did not recover: Q = 338 with cancellation on, 0.98 C-hat); such runs are recorded."""

from __future__ import annotations

from typing import Any

import pytest

from findings import block_runs, result
from retrybench.blocks import BLOCKS

pytestmark = pytest.mark.section65


def _every_run() -> list[Any]:
    params = []
    for name, block in BLOCKS.items():
        for pulse_x in block.pulses_x:
            for param in block_runs(name, block.models):
                model, seed = param.values
                params.append(pytest.param(name, model, seed, pulse_x, id=f"{name}-{param.id}-pulse{pulse_x}",
                                           marks=param.marks))
    return params


@pytest.mark.parametrize(("block", "model", "seed", "pulse_x"), _every_run())
def test_every_recovered_run_created_executions_below_capacity(block: str, model: str, seed: int, pulse_x: float,
                                                               record: Any) -> None:
    spec = BLOCKS[block]
    runs = {c: result(model, c, seed, pulse_x=pulse_x, mixed_prompts=spec.mixed_prompts) for c in spec.conditions}
    for condition, run in runs.items():
        record(f"{condition}:created_x", run["created_x"])
        record(f"{condition}:recovered", run["recovered"])
    recovered_above = {c: r["created_x"] for c, r in runs.items() if r["recovered"] and r["created_x"] >= 1.0}
    below_not_recovered = {c: r["created_x"] for c, r in runs.items() if not r["recovered"] and r["created_x"] < 1.0}
    record("below_chat_not_recovered", below_not_recovered)
    assert not recovered_above, f"recovered runs that created executions at or above C-hat: {recovered_above}"
