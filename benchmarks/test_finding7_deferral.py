"""Finding 7 (Section 6.3): cancellation propagated at once left coalescing nothing to attach to,
and service did not return. Deferring cancellation by 10 s, beyond the client's backoff, let
retries attach again and restored service; the proxy (almost) never cancelled.
"""

from __future__ import annotations

import pytest

from findings import Record, assert_claim, cases
from retrybench.claims import Case
from retrybench.claims import section6 as claims

pytestmark = pytest.mark.finding7


@pytest.mark.parametrize("case", cases(claims.IMMEDIATE_CANCELLATION_LEAVES_NOTHING))
def test_immediate_cancellation_leaves_coalescing_nothing_to_attach_to(case: Case, record: Record) -> None:
    assert_claim(case, record)


@pytest.mark.parametrize("case", cases(claims.DEFERRED_CANCELLATION_RESTORES))
def test_deferred_cancellation_lets_retries_attach_and_restores_service(case: Case, record: Record) -> None:
    assert_claim(case, record)
