"""Section 6.5: every recovered run created executions at the proxy below C-hat (over 347-947 s),
across every run of every block, each block's conditions at its step sizes. The paper names one
exception class the other way round (a run below C-hat that did not recover: Q = 338 with
cancellation on, 0.98 C-hat); such runs are recorded."""

from __future__ import annotations

import pytest

from findings import Record, assert_claim, cases
from retrybench.claims import Case
from retrybench.claims import section6 as claims

pytestmark = pytest.mark.section65



@pytest.mark.parametrize("case", cases(claims.RECOVERED_RUNS_BELOW_CAPACITY))
def test_every_recovered_run_created_executions_below_capacity(case: Case, record: Record) -> None:
    assert_claim(case, record)
