"""Finding 3 (Section 5.2): in Qwen2.5-7B-Instruct's traced runs, retries were typically first
scheduled, if at all, close to their deadline, about one deadline after their predecessor's abort.
Smaller (2,048-token) steps neither materially changed that timing nor restored service, while
they raised hold delivery.
"""

from __future__ import annotations

import pytest

from findings import Record, assert_claim, cases
from retrybench.claims import Case
from retrybench.claims import section5 as claims

pytestmark = pytest.mark.finding3


@pytest.mark.parametrize("case", cases(claims.FIRST_SCHEDULED_NEAR_DEADLINE))
def test_retries_are_first_scheduled_close_to_their_deadline(case: Case, record: Record) -> None:
    assert_claim(case, record)


@pytest.mark.parametrize("case", cases(claims.SMALLER_STEPS_KEEP_TIMING))
def test_smaller_steps_do_not_change_the_timing_or_restore_service_but_raise_hold_delivery(
        case: Case, record: Record) -> None:
    assert_claim(case, record)
