"""Beyond the paper: result retention (the `retention` block). Section 6.4's composition runs, rerun with
each completed response kept 10 s for retries that arrive after it: no call is computed twice, no retry
is refused, and no call is lost that the paper's condition delivered.

This is the project's own claim, not the paper's; it was checked on the ten unseen seeds (101-110) of
all three models as well as on the paper's seeds these tests run.
"""

from __future__ import annotations

import pytest

from findings import result
from retrybench.plan.blocks import BLOCKS, paper_runs

pytestmark = pytest.mark.retention

PAIRS = [("coalescing", "coalescing-retain"), ("lookup-first", "lookup-first-retain")]
RUNS = [pytest.param(model, seed, paper, kept, id=f"{kept}-{model}-seed{seed}",
                     marks=pytest.mark.xdist_group(f"composition-{model}-{seed}"))
        for model in BLOCKS["retention"].models for seed in range(1, paper_runs("retention", model) + 1)
        for paper, kept in PAIRS]


@pytest.mark.parametrize(("model", "seed", "paper", "kept"), RUNS)
def test_retention_computes_each_call_once_refuses_no_retry_and_loses_no_call(
        model: str, seed: int, paper: str, kept: str) -> None:
    plain, retained = result(model, paper, seed), result(model, kept, seed)
    figures = (f"{kept}: {retained['executions_created']} executions for {retained['calls']} calls, "
               f"{retained['calls_delivered']} delivered, {retained['retries_refused']} retries refused, "
               f"{retained.get('attempts_served_retained', 0)} served retained; {paper}: "
               f"{plain['executions_created']} executions, {plain['calls_delivered']} delivered, "
               f"{plain['retries_refused']} refused")
    assert retained["executions_created"] <= retained["calls"], f"a call was computed twice: {figures}"
    assert retained["retries_refused"] == 0, f"a retry was refused: {figures}"
    assert retained["calls_delivered"] >= plain["calls_delivered"], f"retention lost a call: {figures}"
    assert retained.get("attempts_served_retained", 0) > 0 or plain["executions_created"] == plain["calls"], (
        f"the paper's condition computed a call twice, yet no retry was served a kept response: {figures}")
