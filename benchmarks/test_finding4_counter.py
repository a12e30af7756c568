"""Finding 4 (Section 5.3): vLLM's prompt-token counter records a prompt only at its execution's
first output, so with retries and cancellation on it falls short of the admission counter over the
hold, by about a fifth to two thirds, on all three models; its increase matches that rule.
"""

from __future__ import annotations

from typing import Any

import pytest

from findings import PRIMARY, block_runs, result
from retrybench.blocks import BLOCKS
from retrybench.paper import near, paper_values

pytestmark = pytest.mark.finding4

PAPER = paper_values()
RULE_WITHIN_PCT = PAPER["tracing"]["counter_matches_rule_within_pct"]


@pytest.mark.parametrize("steps", [8192, 2048])
@pytest.mark.parametrize(("model", "seed"), block_runs("tracing", (PRIMARY,)))
def test_the_prompt_token_counter_follows_its_rule(model: str, seed: int, steps: int, record: Any) -> None:
    run = result(model, "retries-on-cancel-on", seed, max_batched_tokens=steps, trace=True)
    record("counter_rule_error_pct", run["counter_rule_error_pct"], RULE_WITHIN_PCT)
    assert run["counter_rule_error_pct"] <= RULE_WITHIN_PCT


@pytest.mark.parametrize(("model", "seed"), block_runs("diagnostic", BLOCKS["diagnostic"].models))
def test_the_counter_misses_a_fifth_to_two_thirds_of_admitted_prompt_tokens(model: str, seed: int,
                                                                           record: Any) -> None:
    run = result(model, "retries-on-cancel-on", seed)
    record("counter_gap_pct", run["counter_gap_pct"], PAPER["counter_gap"][model])
    assert near(run["counter_gap_pct"], 100 / 5, 200 / 3)
