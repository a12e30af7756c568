"""Finding 2 (Section 5.1): in Qwen2.5-7B-Instruct's traces, most of the engine's prompt work under
cancellation went to executions it later aborted, and at 8,192 batched tokens about half of that
work was in steps already issued when the abort came; 2,048-token steps cut that in-flight share.
Counted in step time under five attribution rules, it is still a majority under every rule.
"""

from __future__ import annotations

import pytest

from findings import Record, assert_claim, cases
from retrybench.claims import Case
from retrybench.claims import section5 as claims

pytestmark = pytest.mark.finding2


@pytest.mark.parametrize("case", cases(claims.ABORTED_HOLD_MOST_PROMPT_WORK))
def test_aborted_executions_hold_most_computed_prompt_tokens(case: Case, record: Record) -> None:
    assert_claim(case, record)


@pytest.mark.parametrize("case", cases(claims.IN_FLIGHT_HALF_AT_8K))
def test_at_8k_about_half_of_the_aborted_work_was_in_flight_and_2k_steps_cut_it(case: Case, record: Record) -> None:
    assert_claim(case, record)


@pytest.mark.parametrize("case", cases(claims.STEP_TIME_MAJORITY))
def test_aborted_prompt_work_takes_most_step_time_under_every_rule(case: Case, record: Record) -> None:
    assert_claim(case, record)


@pytest.mark.parametrize("case", cases(claims.NOTHING_MISSED_WITHOUT_CANCELLATION))
def test_without_cancellation_no_prompt_work_is_missed(case: Case, record: Record) -> None:
    """Figure 4: with cancellation off nothing is aborted, so the counter misses nothing."""
    assert_claim(case, record)
