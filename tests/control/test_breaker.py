"""The circuit breaker's state machine (control/breaker.py): open, cool-down, half-open probes, close,
reopen, and busy answers counted as faults or not."""

from __future__ import annotations

import pytest

from retrybench.conditions.config import BreakerPolicy
from retrybench.control.breaker import CLOSED, HALF_OPEN, OPEN, BreakerCore, result_of
from retrybench.records.runlog import COMPLETED, REFUSED_503, REFUSED_529, TIMED_OUT

pytestmark = pytest.mark.beyond


def breaker(**fields: object) -> BreakerCore:
    policy: dict[str, object] = {"failures": 3, "window_s": 10.0, "open_s": 30.0, "probes": 1} | fields
    return BreakerCore(BreakerPolicy(**policy))  # type: ignore[arg-type]


def faults(core: BreakerCore, times: list[float], outcome: str = TIMED_OUT) -> None:
    for i, t in enumerate(times):
        assert core.on_attempt((i, 0), t) is None
        core.on_result((i, 0), outcome, t)


def test_n_faults_within_the_window_open_it_and_fewer_do_not() -> None:
    core = breaker()
    faults(core, [0.0, 5.0])
    assert core.state(5.0) == CLOSED
    faults(core, [20.0])  # the first two fell out of the 10-s window
    assert core.state(20.0) == CLOSED
    core2 = breaker()
    faults(core2, [0.0, 1.0, 2.0])
    assert core2.state(2.0) == OPEN and core2.counts.opened == 1


def test_open_it_refuses_with_the_configured_answer_until_the_cool_down_ends() -> None:
    core = breaker(status=529, no_retry=True)
    faults(core, [0.0, 1.0, 2.0])
    refusal = core.on_attempt((9, 0), 12.0)
    assert refusal is not None
    assert (refusal.status, refusal.no_retry, refusal.source) == (529, True, "breaker")
    assert refusal.retry_after_s == pytest.approx(20.0)  # 30 s from 2.0, asked at 12.0
    assert core.state(31.9) == OPEN
    assert core.state(32.0) == HALF_OPEN


def test_without_retry_after_the_refusal_carries_none() -> None:
    core = breaker(retry_after=False)
    faults(core, [0.0, 1.0, 2.0])
    refusal = core.on_attempt((9, 0), 3.0)
    assert refusal is not None and refusal.retry_after_s is None and refusal.status == 503


def test_half_open_lets_k_probes_through_and_a_probe_success_closes_it() -> None:
    core = breaker(probes=2)
    faults(core, [0.0, 1.0, 2.0])
    assert core.on_attempt((10, 0), 40.0) is None
    assert core.on_attempt((11, 0), 40.0) is None
    assert core.on_attempt((12, 0), 40.0) is not None  # a third is refused
    core.on_result((11, 0), COMPLETED, 41.0)
    assert core.state(41.0) == CLOSED and core.counts.closed == 1
    assert core.on_attempt((13, 0), 41.0) is None


def test_a_probe_fault_reopens_it_for_a_new_cool_down() -> None:
    core = breaker()
    faults(core, [0.0, 1.0, 2.0])
    assert core.on_attempt((10, 0), 33.0) is None
    core.on_result((10, 0), TIMED_OUT, 35.0)
    assert core.state(35.0) == OPEN and core.counts.opened == 2
    assert core.state(64.9) == OPEN
    assert core.state(65.0) == HALF_OPEN


def test_only_probes_decide_a_half_open_breaker() -> None:
    core = breaker()
    assert core.on_attempt((1, 0), 0.0) is None  # let through while closed, answered late
    faults(core, [0.0, 1.0, 2.0])
    core.on_result((1, 0), COMPLETED, 40.0)  # half-open by now, but not a probe
    assert core.state(40.0) == HALF_OPEN


@pytest.mark.parametrize("busy", [REFUSED_503, REFUSED_529])
def test_busy_answers_open_it_only_when_counted_as_faults(busy: str) -> None:
    counted = breaker(busy_is_fault=True)
    faults(counted, [0.0, 1.0, 2.0], busy)
    assert counted.state(2.0) == OPEN
    not_counted = breaker(busy_is_fault=False)
    faults(not_counted, [0.0, 1.0, 2.0, 3.0, 4.0], busy)
    assert not_counted.state(4.0) == CLOSED


def test_a_busy_probe_not_counted_frees_its_place_for_another_probe() -> None:
    core = breaker(busy_is_fault=False)
    faults(core, [0.0, 1.0, 2.0])
    assert core.on_attempt((10, 0), 33.0) is None
    assert core.on_attempt((11, 0), 33.0) is not None
    core.on_result((10, 0), REFUSED_503, 34.0)
    assert core.state(34.0) == HALF_OPEN
    assert core.on_attempt((12, 0), 34.0) is None


def test_result_of_names_every_outcome_and_refuses_others() -> None:
    assert [result_of(o) for o in (COMPLETED, REFUSED_529, TIMED_OUT)] == ["success", "busy", "fault"]
    with pytest.raises(ValueError, match="unknown attempt outcome"):
        result_of("lost")


def test_a_malformed_request_counts_for_nothing_and_frees_its_probe_place() -> None:
    """A 4xx of the client's own making (not 408, not 429) says nothing of the engine: closed, it is no fault;
    half-open, its probe's place goes to the next attempt and the state stays half-open."""
    core = breaker()
    for i in range(5):
        assert core.on_attempt((i, 0), float(i)) is None
        core.on_not_judged((i, 0), float(i))
    assert core.state(5.0) == CLOSED
    faults(core, [10.0, 11.0, 12.0])
    assert core.on_attempt((20, 0), 42.0) is None  # the one probe
    assert core.on_attempt((21, 0), 42.0) is not None
    core.on_not_judged((20, 0), 43.0)
    assert core.state(43.0) == HALF_OPEN
    assert core.on_attempt((22, 0), 43.0) is None  # its place went to another probe


@pytest.mark.parametrize(("status", "outcome"), [(200, COMPLETED), (408, TIMED_OUT), (429, "refused_429"),
                                                 (503, REFUSED_503), (529, REFUSED_529), (502, "error"),
                                                 (400, None), (404, None), (413, None)])
def test_the_live_gate_reads_each_status(status: int, outcome: str | None) -> None:
    from retrybench.proxy.breaker_gate import outcome_of_status

    assert outcome_of_status(status) == outcome
