"""Attribution of computed prompt tokens on small hand-made traces."""

from __future__ import annotations

from typing import Any

import pytest

from retrybench.analysis.prompt_work import prompt_work


def step(sid: int, start: float, end: float, prompt: dict[int, int], decode: tuple[int, ...] = (),
         preempted: tuple[int, ...] = ()) -> dict[str, Any]:
    return {"t": start, "event": "step", "step": sid, "start_s": start, "end_s": end,
            "prompt_tokens": {str(k): v for k, v in prompt.items()}, "decode": list(decode), "cached_tokens": {},
            "preempted": list(preempted)}


def aborted(rid: int, t: float, unscheduled: bool = False) -> dict[str, Any]:
    return {"t": t, "event": "aborted", "execution": rid, "unscheduled": unscheduled}


def first_token(rid: int, t: float) -> dict[str, Any]:
    return {"t": t, "event": "first_token", "execution": rid}


def test_an_abort_with_one_step_in_flight() -> None:
    # Execution 1: a chunk of 8,192 processed at 1.0, abort applied at 1.5 while the next chunk runs.
    work = prompt_work([step(1, 0.0, 1.0, {1: 8192}), step(2, 1.0, 2.0, {1: 1808}), aborted(1, 1.5)])
    assert work.aborted_body_tokens == 8192
    assert work.aborted_in_flight_tokens == 1808
    assert work.aborted_share_pct == 100.0
    assert work.in_flight_share_pct == pytest.approx(100 * 1808 / 10000)
    assert work.missed_share_pct == 100.0  # aborted before its first output


def test_the_batch_whose_completion_applies_the_abort_is_in_flight() -> None:
    # vLLM applies the abort when batch 1's output is ready, before processing it: batch 1 (ending at
    # the abort's time) and batch 2 (already issued) both finish after the abort.
    work = prompt_work([step(1, 0.0, 1.0, {1: 8192}), step(2, 1.0, 2.0, {1: 1808}), aborted(1, 1.0)])
    assert work.aborted_body_tokens == 0
    assert work.aborted_in_flight_tokens == 10_000


def test_an_abort_with_two_steps_in_flight() -> None:
    events = [step(1, 0.0, 1.0, {1: 4000}), step(2, 1.0, 2.0, {1: 4000}), step(3, 2.0, 3.0, {1: 2000}),
              aborted(1, 0.5)]
    work = prompt_work(events)
    assert work.aborted_body_tokens == 0
    assert work.aborted_in_flight_tokens == 10_000
    assert work.in_flight_share_pct == 100.0


def test_never_aborted_and_aborted_after_first_output() -> None:
    events = [step(1, 0.0, 1.0, {1: 5000, 2: 3000}), first_token(1, 1.0), first_token(2, 1.0),
              step(2, 1.0, 1.1, {}, decode=(1, 2)), aborted(2, 1.1)]
    work = prompt_work(events)
    assert work.never_aborted_tokens == 5000
    assert work.aborted_body_tokens == 3000
    assert work.missed_tokens == 0  # execution 2 produced its first token before the abort
    assert work.aborted_share_pct == pytest.approx(37.5)


def test_preemption_then_abort_counts_recomputed_tokens_apart() -> None:
    events = [step(1, 0.0, 1.0, {1: 3000}), step(2, 1.0, 2.0, {}, preempted=(1,)),
              step(3, 2.0, 3.0, {1: 3000}), aborted(1, 3.5)]
    work = prompt_work(events)
    assert work.computed_tokens == 6000
    assert work.preempted_execution_tokens == 6000
    assert work.aborted_body_tokens == 6000


def test_a_prefix_cache_hit_is_not_computed() -> None:
    hit = step(1, 0.0, 1.0, {1: 10_000})
    hit["cached_tokens"] = {"1": 2000}
    work = prompt_work([hit])
    assert work.computed_tokens == 10_000  # the 2,000 cached tokens are not computed work


def test_a_request_aborted_while_waiting() -> None:
    work = prompt_work([aborted(7, 5.0, unscheduled=True), step(1, 0.0, 1.0, {1: 100})])
    assert work.aborted_unscheduled == 1
    assert work.aborted_executions == 1
    assert work.computed_tokens == 100 and work.never_aborted_tokens == 100


def test_the_last_window_counts_steps_that_began_in_it() -> None:
    events = [step(1, 0.0, 1.0, {1: 100}), step(2, 10.0, 11.0, {2: 300}), aborted(2, 10.5)]
    work = prompt_work(events, last_window=(5.0, 20.0))
    assert work.last_window_tokens == 300
    assert work.missed_share_last_window_pct == 100.0
    assert work.missed_share_pct == pytest.approx(75.0)
