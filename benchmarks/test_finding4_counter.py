"""Finding 4 (Section 5.3): vLLM's prompt-token counter records a prompt only at its execution's
first output, so with retries and cancellation on it falls short of the admission counter over the
hold, by about a fifth to two thirds, on all three models; its increase matches that rule.
"""

from __future__ import annotations

import pytest

from findings import Record, assert_claim, cases
from retrybench.claims import Case
from retrybench.claims import section5 as claims

pytestmark = pytest.mark.finding4

# Runs on which the simulator does not reproduce a claim, with what it measured (strict xfails).
COUNTER_GAP_MISSES = {
    ("llama-3.1-8b-instruct", 2): "measured: the prompt-token counter fell short of the admission counter over "
    "the hold by 13.6%, under the paper's fifth",
}


@pytest.mark.parametrize("case", cases(claims.COUNTER_FOLLOWS_RULE))
def test_the_prompt_token_counter_follows_its_rule(case: Case, record: Record) -> None:
    assert_claim(case, record)


@pytest.mark.parametrize("case", cases(claims.COUNTER_GAP, COUNTER_GAP_MISSES))
def test_the_counter_misses_a_fifth_to_two_thirds_of_admitted_prompt_tokens(case: Case, record: Record) -> None:
    assert_claim(case, record)
