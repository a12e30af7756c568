"""Refusal semantics (beyond the paper): the proxy's refusals take the configured status and headers,
the policy keys are validated, and the defaults answer as the paper's proxy."""

from __future__ import annotations

import pytest

from retrybench.conditions.config import (
    BreakerPolicy,
    ConfigError,
    ProxyPolicy,
    condition_from_toml,
    load_condition,
)
from retrybench.control.proxy import AttemptIn, Create, Notify, ProxyCore, Refuse

pytestmark = pytest.mark.beyond


def attempt(call: int, no: int) -> AttemptIn:
    return AttemptIn(call, no, f"k{call}", 1000, 100)


def budget_refusal(policy: ProxyPolicy) -> Refuse:
    core = ProxyCore(policy)
    assert isinstance(core.on_attempt(attempt(0, 0), 0.0), Create)
    decision = core.on_attempt(attempt(0, 1), 1.0)  # no budget yet: 10% of one first attempt
    assert isinstance(decision, Refuse)
    return decision


def test_the_defaults_answer_as_the_papers_proxy() -> None:
    refusal = budget_refusal(ProxyPolicy(retry_budget=True))
    assert (refusal.status, refusal.no_retry, refusal.source) == (429, False, "budget")
    assert refusal.retry_after_s is not None


@pytest.mark.parametrize("status", [429, 503, 529])
@pytest.mark.parametrize("retry_after", [True, False])
@pytest.mark.parametrize("no_retry", [True, False])
def test_the_budget_refuses_with_the_configured_status_and_headers(status: int, retry_after: bool,
                                                                     no_retry: bool) -> None:
    refusal = budget_refusal(ProxyPolicy(retry_budget=True, budget_status=status, budget_retry_after=retry_after,
                                         budget_no_retry=no_retry))
    assert refusal.status == status and refusal.no_retry is no_retry
    assert (refusal.retry_after_s is not None) is retry_after


def test_the_deadline_check_refuses_with_its_configured_answer() -> None:
    core = ProxyCore(ProxyPolicy(max_outstanding=1, deadline_check=True, attempt_deadline_s=0.001,
                                 deadline_status=529, deadline_retry_after=True, deadline_no_retry=True))
    decision = core.on_attempt(attempt(0, 0), 0.0, engine_waiting=1000)
    assert isinstance(decision, Refuse)
    assert (decision.status, decision.no_retry, decision.source) == (529, True, "deadline")
    assert decision.retry_after_s is not None and decision.retry_after_s > 0.001


@pytest.mark.parametrize(("status", "retry_after", "no_retry"), [(503, False, False), (429, True, False),
                                                                 (529, False, True)])
def test_the_engines_refusal_is_relayed_with_the_configured_answer(status: int, retry_after: bool,
                                                                    no_retry: bool) -> None:
    core = ProxyCore(ProxyPolicy(engine_status=status, engine_retry_after=retry_after, engine_no_retry=no_retry))
    created = core.on_attempt(attempt(0, 0), 0.0)
    assert isinstance(created, Create)
    actions = core.on_engine_event(created.execution_id, "refused", 0.0, engine_waiting=338)
    notify = [a for a in actions if isinstance(a, Notify)]
    assert len(notify) == 1 and notify[0].kind == "refused"
    assert (notify[0].status, notify[0].no_retry) == (status, no_retry)
    assert (notify[0].retry_after_s is not None) is retry_after


@pytest.mark.parametrize("key", ["budget_status", "deadline_status", "engine_status"])
@pytest.mark.parametrize("bad", [200, 500, 502])
def test_a_refusal_status_outside_429_503_529_is_refused_by_name(key: str, bad: int) -> None:
    with pytest.raises(ConfigError, match=f"{key} must be one of 429, 503, 529"):
        ProxyPolicy(**{key: bad})  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "message"), [
    ({"failures": 0}, r"failures must be in \[1, 100000\]"),
    ({"window_s": 0.0}, r"window_s must be in \(0, 3600\]"),
    ({"open_s": -1.0}, r"open_s must be in \(0, 3600\]"),
    ({"probes": 0}, r"probes must be in \[1, 1000\]"),
    ({"status": 500}, "status must be one of 429, 503, 529"),
])
def test_breaker_values_are_checked_by_name(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BreakerPolicy(**fields)  # type: ignore[arg-type]


def test_a_breaker_table_is_read_and_checked_and_absent_by_default() -> None:
    condition = condition_from_toml('[breaker]\nfailures = 7\nbusy_is_fault = false\n', "x")
    assert condition.breaker == BreakerPolicy(failures=7, busy_is_fault=False)
    assert condition_from_toml("", "x").breaker is None
    assert load_condition("no-control").breaker is None
    with pytest.raises(ConfigError, match=r"\[breaker\]: unknown field 'cooldown'"):
        condition_from_toml("[breaker]\ncooldown = 3\n", "x")
    with pytest.raises(ConfigError, match=r"field 'probes' must be int"):
        condition_from_toml('[breaker]\nprobes = "2"\n', "x")


def test_every_rejection_policy_loads() -> None:
    from retrybench.plan.blocks import BLOCKS
    for name in BLOCKS["rejection"].conditions:
        load_condition(name)
    assert load_condition("breaker-busy-faults").breaker == BreakerPolicy(failures=20, busy_is_fault=True)
