"""Finding 2 (Section 5.1): in Qwen2.5-7B-Instruct's traces, most of the engine's prompt work under
cancellation went to executions it later aborted, and at 8,192 batched tokens about half of that
work was in steps already issued when the abort came; 2,048-token steps cut that in-flight share.
Counted in step time under five attribution rules, it is still a majority under every rule.
"""

from __future__ import annotations

from typing import Any

import pytest

from findings import KNOWN_2K, PRIMARY, block_runs, result, tracing_runs
from retrybench.paper import near, paper_values

pytestmark = pytest.mark.finding2

TRACING = paper_values()["tracing"]


def traced(seed: int, condition: str, steps: int) -> dict[str, Any]:
    return result(PRIMARY, condition, seed, max_batched_tokens=steps, trace=True)


@pytest.mark.parametrize(("model", "seed", "steps"), tracing_runs(KNOWN_2K))
def test_aborted_executions_hold_most_computed_prompt_tokens(model: str, seed: int, steps: int, record: Any) -> None:
    run = traced(seed, "retries-on-cancel-on", steps)
    key = "8k" if steps == 8192 else "2k"
    record("aborted_prompt_share_pct", run["aborted_prompt_share_pct"],
           TRACING[f"aborted_share_of_computed_prompt_pct_{key}"])
    record("aborted_unscheduled", run["aborted_unscheduled"], TRACING[f"aborted_before_first_scheduled_per_run_{key}"])
    record("missed_share_pct", run["missed_share_pct"], TRACING[f"aborted_before_first_output_share_pct_{key}"])
    record("missed_share_last240_pct", run["missed_share_last240_pct"],
           TRACING[f"aborted_before_first_output_share_last_240s_pct_{key}"])
    assert run["aborted_prompt_share_pct"] > 50.0


@pytest.mark.parametrize(("model", "seed"), block_runs("tracing", (PRIMARY,)))
def test_at_8k_about_half_of_the_aborted_work_was_in_flight_and_2k_steps_cut_it(model: str, seed: int,
                                                                               record: Any) -> None:
    big = traced(seed, "retries-on-cancel-on", 8192)
    small = traced(seed, "retries-on-cancel-on", 2048)
    record("in_flight_share_pct_8k", big["in_flight_share_pct"], TRACING["in_flight_share_of_aborted_pct_8k"])
    record("in_flight_share_pct_2k", small["in_flight_share_pct"], TRACING["in_flight_share_of_aborted_pct_2k"])
    low, high = TRACING["in_flight_share_of_aborted_pct_8k"]
    assert near(big["in_flight_share_pct"], low, high)
    assert small["in_flight_share_pct"] < big["in_flight_share_pct"]


@pytest.mark.parametrize(("model", "seed", "steps"), tracing_runs(KNOWN_2K))
def test_aborted_prompt_work_takes_most_step_time_under_every_rule(model: str, seed: int, steps: int,
                                                                 record: Any) -> None:
    run = traced(seed, "retries-on-cancel-on", steps)
    key = "8k" if steps == 8192 else "2k"
    record("step_time_aborted_share_pct", run["step_time_aborted_share_pct"],
           TRACING[f"aborted_share_of_step_time_pct_{key}"])
    record("step_time_aborted_share_by_rule_pct", run["step_time_aborted_share_by_rule_pct"])
    assert all(share > 50.0 for share in run["step_time_aborted_share_by_rule_pct"].values())


@pytest.mark.parametrize(("model", "seed"), block_runs("tracing", (PRIMARY,)))
def test_without_cancellation_no_prompt_work_is_missed(model: str, seed: int, record: Any) -> None:
    """Figure 4: with cancellation off nothing is aborted, so the counter misses nothing."""
    run = traced(seed, "retries-on-cancel-off", 2048)
    record("missed_share_pct", run["missed_share_pct"], TRACING["missed_share_pct"]["k2_cancel_off"])
    assert run["aborted_prompt_share_pct"] == 0.0
    assert run["missed_share_pct"] == 0.0
