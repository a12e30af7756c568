"""The faster step-time attribution against the original per-entry one (fixtures/reference/step_time.py): the
shares must be the very same floats, on random traces and on a simulated engine's trace."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

import pytest
from fixtures.reference import step_time as reference
from fixtures.reference.traces import random_trace

from retrybench.analysis import step_time
from retrybench.conditions.config import WorkloadSpec, load_condition
from retrybench.engine.profiles import profile_for
from retrybench.sim.run import simulate
from retrybench.traffic.workload import generate_trace

WINDOWS = [(None, None), (2.0, None), (None, 5.0), (1.5, 4.0)]


def same(fast: Any, slow: Any) -> bool:
    return repr(asdict(fast)) == repr(asdict(slow))


def check(events: list[dict[str, Any]]) -> None:
    fit = reference.fit_step_costs(events)
    assert same(step_time.fit_step_costs(events), fit)
    for start_s, end_s in WINDOWS:
        for given in (None, step_time.StepCostFit(**asdict(fit))):
            slow = reference.step_time_shares(events, given and reference.StepCostFit(**asdict(given)),
                                              start_s=start_s, end_s=end_s)
            assert same(step_time.step_time_shares(events, given, start_s=start_s, end_s=end_s), slow)
            prompt = step_time.prompt_step_time_shares(events, given, start_s=start_s, end_s=end_s)
            assert repr(prompt) == repr(slow.aborted_prompt_share_pct)


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("duplicates", [False, True])
def test_random_traces_match_the_reference(seed: int, duplicates: bool) -> None:
    check(random_trace(seed, duplicates=duplicates))


def test_no_steps_is_an_error_as_before() -> None:
    with pytest.raises(ValueError, match="no steps"):
        step_time.fit_step_costs([])
    with pytest.raises(ValueError, match="no steps"):
        step_time.prompt_step_time_shares([{"t": 0.0, "event": "aborted", "execution": 1}])


@pytest.mark.parametrize("condition", ["retries-on-cancel-on", "deferred-cancellation"])
def test_simulated_trace_matches_the_reference(condition: str) -> None:
    """A short run with a 15-s deadline: many aborts, decodes of aborted executions, prefix hits."""
    chat = 2.8285726931688133
    spec = WorkloadSpec(chat_calls_per_s=chat, base_s=30, pulse_s=30, hold_s=60)
    policy = load_condition(condition)
    events: list[dict[str, Any]] = []
    simulate(profile_for("qwen2.5-7b-instruct"), generate_trace(spec, 5).calls,
             client=replace(policy.client, attempt_timeout_s=15.0), proxy=policy.proxy, seed=5, meta={},
             prefix_tokens=spec.shared_prefix_tokens, trace=events)
    assert any(e["event"] == "aborted" for e in events)
    check(events)
