"""Finding 3 (Section 5.2): in Qwen2.5-7B-Instruct's traced runs, retries were typically first
scheduled, if at all, close to their deadline, about one deadline after their predecessor's abort.
Smaller (2,048-token) steps neither materially changed that timing nor restored service, while
they raised hold delivery.
"""

from __future__ import annotations

from typing import Any

import pytest

from findings import KNOWN_2K, PRIMARY, block_runs, result, tracing_runs
from retrybench.paper import near, paper_values

pytestmark = pytest.mark.finding3

TRACING = paper_values()["tracing"]
SMALL_FRACTION = 0.05  # "close to their deadline": the median time left is at most this share of it
DEADLINE_S = paper_values()["workload"]["attempt_timeout_s"]


def traced(seed: int, steps: int) -> dict[str, Any]:
    return result(PRIMARY, "retries-on-cancel-on", seed, max_batched_tokens=steps, trace=True)


@pytest.mark.parametrize(("model", "seed", "steps"), tracing_runs(KNOWN_2K))
def test_retries_are_first_scheduled_close_to_their_deadline(model: str, seed: int, steps: int, record: Any) -> None:
    run = traced(seed, steps)
    key = "8k" if steps == 8192 else "2k"
    record("retry_time_left_at_first_step_median_s", run["retry_time_left_at_first_step_median_s"],
           TRACING["scheduled_retry_time_left_at_first_step_median_s"])
    record("retry_time_left_at_first_step_p90_s", run["retry_time_left_at_first_step_p90_s"],
           TRACING["scheduled_retry_time_left_at_first_step_p90_s"])
    record("retry_first_scheduled_after_abort_median_s", run["retry_first_scheduled_after_abort_median_s"],
           TRACING["retry_first_scheduled_after_predecessor_abort_median_s"])
    record("abort_after_first_step_median_s", run["abort_after_first_step_median_s"],
           TRACING["abort_after_first_step_began_median_s"])
    record("retries_never_scheduled_pct", run["retries_never_scheduled_pct"],
           TRACING[f"retries_never_scheduled_pct_{key}"])
    assert run["retry_time_left_at_first_step_median_s"] <= SMALL_FRACTION * DEADLINE_S
    low, high = TRACING["retry_first_scheduled_after_predecessor_abort_median_s"]
    assert near(run["retry_first_scheduled_after_abort_median_s"], low, high)


@pytest.mark.parametrize(("model", "seed"), block_runs("tracing", (PRIMARY,), KNOWN_2K))
def test_smaller_steps_do_not_change_the_timing_or_restore_service_but_raise_hold_delivery(
        model: str, seed: int, record: Any) -> None:
    big, small = traced(seed, 8192), traced(seed, 2048)
    record("hold_delivered_pct_8k", big["hold_delivered_pct"], TRACING["hold_delivered_pct_8k_cancel_on"])
    record("hold_delivered_pct_2k", small["hold_delivered_pct"], TRACING["hold_delivered_pct_2k_cancel_on"])
    low, high = TRACING["retry_first_scheduled_after_predecessor_abort_median_s"]
    assert near(small["retry_first_scheduled_after_abort_median_s"], low, high)
    assert small["retry_time_left_at_first_step_median_s"] <= SMALL_FRACTION * DEADLINE_S
    assert small["recovered"] is False
    assert small["hold_delivered_pct"] > big["hold_delivered_pct"]
