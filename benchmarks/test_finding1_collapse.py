"""Finding 1 (Section 4): retries alone keep every model from recovering after the 2.7 C-hat pulse,
cancellation alone does not restore service while clients retry, and every model recovers after a
1.5 C-hat pulse despite retries.

Each test asserts the paper's claim on simulated runs of the paper's blocks (Table 1) with the
paper's run counts, and records the measured and the paper's figures side by side.
"""

from __future__ import annotations

from typing import Any

import pytest

from findings import PRIMARY, block_runs, result
from retrybench.blocks import BLOCKS
from retrybench.paper import NEAR, near, paper_values

pytestmark = pytest.mark.finding1

PAPER = paper_values()
MODELS = BLOCKS["diagnostic"].models
TABLE2 = PAPER["diagnostic"]["hold_delivered_pct"]
SWEEP = PAPER["trigger_sweep"]


def _runs(block: str, models: tuple[str, ...] = MODELS) -> list[Any]:
    return block_runs(block, models)


# -- diagnostic block (Section 4.1, Table 2) ------------------------------------------------------

@pytest.mark.parametrize(("model", "seed"), _runs("diagnostic"))
def test_retries_on_cancel_off_delivers_no_hold_call_and_never_recovers(model: str, seed: int, record: Any) -> None:
    run = result(model, "retries-on-cancel-off", seed)
    record("hold_delivered_pct", run["hold_delivered_pct"], TABLE2[model]["retries_on_cancel_off"])
    record("recovered", run["recovered"], False)
    assert run["hold_delivered_pct"] == 0.0
    assert run["recovered"] is False


@pytest.mark.parametrize(("model", "seed"), _runs("diagnostic"))
def test_cancellation_alone_does_not_restore_service_while_clients_retry(model: str, seed: int, record: Any) -> None:
    run = result(model, "retries-on-cancel-on", seed)
    record("hold_delivered_pct", run["hold_delivered_pct"], TABLE2[model]["retries_on_cancel_on"])
    record("recovered", run["recovered"], False)
    assert run["recovered"] is False


@pytest.mark.parametrize("condition", ["retries-off-cancel-off", "retries-off-cancel-on"])
@pytest.mark.parametrize(("model", "seed"), _runs("diagnostic"))
def test_without_retries_every_model_recovers_within_the_hold(model: str, seed: int, condition: str,
                                                              record: Any) -> None:
    run = result(model, condition, seed)
    key = condition.replace("-", "_").replace("retries_off_cancel", "retries_off_cancel")
    record("hold_delivered_pct", run["hold_delivered_pct"], TABLE2[model][key])
    record("recovery_s", run["recovery_s"])
    assert run["recovered"] is True


@pytest.mark.parametrize(("model", "seed"), _runs("diagnostic", (PRIMARY,)))
def test_without_retries_cancellation_recovers_earlier(model: str, seed: int, record: Any) -> None:
    on = result(model, "retries-off-cancel-on", seed)
    off = result(model, "retries-off-cancel-off", seed)
    qwen = PAPER["diagnostic"]["qwen25"]
    record("recovery_s_cancel_on", on["recovery_s"], qwen["recovery_s_retries_off_cancel_on"])
    record("recovery_s_cancel_off", off["recovery_s"], qwen["recovery_s_retries_off_cancel_off"])
    assert on["recovered"] and off["recovered"]
    assert on["recovery_s"] < off["recovery_s"]


@pytest.mark.parametrize(("model", "seed"), _runs("diagnostic", (PRIMARY,)))
def test_retries_keep_the_engine_busy_accepting_over_twice_capacity(model: str, seed: int, record: Any) -> None:
    """Section 4.1: with retries on and cancellation off, vLLM accepts executions at over twice
    C-hat and completes them at nearly C-hat; retries create about three quarters of them."""
    run = result(model, "retries-on-cancel-off", seed)
    qwen = PAPER["diagnostic"]["qwen25"]
    completed_low, completed_high = (v / 100 for v in qwen["completed_pct_of_chat_retries_on_cancel_off"])
    record("accepted_x", run["accepted_x"], qwen["accepted_x_retries_on_cancel_off"])
    record("completed_x", run["completed_x"], [completed_low, completed_high])
    record("retry_share_pct", run["retry_share_pct"], qwen["retry_share_of_executions_pct_retries_on_cancel_off"])
    assert run["accepted_x"] > 2.0
    assert near(run["completed_x"], completed_low, completed_high), f"completion not within {NEAR:.0%} of C-hat"


@pytest.mark.parametrize(("model", "seed"), _runs("diagnostic", (PRIMARY,)))
def test_with_cancellation_completion_falls_far_below_capacity(model: str, seed: int, record: Any) -> None:
    """Section 4.1: with retries and cancellation on, acceptance stays over twice C-hat while
    completion falls to under 1% of it, and the waiting queue is the Little's-law one."""
    run = result(model, "retries-on-cancel-on", seed)
    qwen = PAPER["diagnostic"]["qwen25"]
    record("accepted_x", run["accepted_x"], qwen["accepted_x_retries_on_cancel_on"])
    record("completed_pct_of_chat", 100 * run["completed_x"], qwen["completed_pct_of_chat_retries_on_cancel_on"])
    record("mean_waiting_pct_of_littles_law", run["mean_waiting_pct_of_littles_law"],
           qwen["mean_waiting_pct_of_littles_law"])
    assert run["accepted_x"] > 2.0
    assert 100 * run["completed_x"] < 1.0
    low, high = qwen["mean_waiting_pct_of_littles_law"]
    assert near(run["mean_waiting_pct_of_littles_law"], low, high)


# -- trigger sweep (Section 4.2, Table 3) -------------------------------------------------------------

def _sweep_cell(model: str, retries: str, pulse_x: float) -> list[float]:
    pulses = SWEEP["pulses_x"]
    value: list[float] = SWEEP[model][retries][pulses.index(pulse_x)]
    return value


@pytest.mark.parametrize(("model", "seed"), _runs("trigger-sweep"))
def test_every_model_recovers_after_a_small_pulse_despite_retries(model: str, seed: int, record: Any) -> None:
    run = result(model, "retries-on-cancel-off", seed, pulse_x=1.5)
    record("hold_delivered_pct_and_recovery_s", [run["hold_delivered_pct"], run["recovery_s"]],
           _sweep_cell(model, "retries_on", 1.5))
    assert run["recovered"] is True


@pytest.mark.parametrize(("model", "seed"), _runs("trigger-sweep"))
def test_no_model_recovers_after_the_large_pulse_with_retries(model: str, seed: int, record: Any) -> None:
    run = result(model, "retries-on-cancel-off", seed, pulse_x=2.7)
    record("hold_delivered_pct_and_recovery_s", [run["hold_delivered_pct"], run["recovery_s"]],
           _sweep_cell(model, "retries_on", 2.7))
    assert run["recovered"] is False


@pytest.mark.parametrize("pulse_x", SWEEP["pulses_x"])
@pytest.mark.parametrize(("model", "seed"), _runs("trigger-sweep"))
def test_without_retries_service_recovers_after_every_pulse(model: str, seed: int, pulse_x: float,
                                                            record: Any) -> None:
    run = result(model, "retries-off-cancel-off", seed, pulse_x=pulse_x)
    record("hold_delivered_pct_and_recovery_s", [run["hold_delivered_pct"], run["recovery_s"]],
           _sweep_cell(model, "retries_off", pulse_x))
    assert run["recovered"] is True


@pytest.mark.parametrize(("model", "seed"), _runs("trigger-sweep"))
def test_the_2x_pulse_with_retries_is_recorded_not_asserted(model: str, seed: int, record: Any) -> None:
    """Section 4.2: at 2 C-hat the outcomes split and the paper draws no boundary, so this cell is
    recorded for the report; the test checks only that the run completed and was classified."""
    run = result(model, "retries-on-cancel-off", seed, pulse_x=2.0)
    record("hold_delivered_pct_and_recovery_s", [run["hold_delivered_pct"], run["recovery_s"]],
           _sweep_cell(model, "retries_on", 2.0))
    assert isinstance(run["recovered"], bool)
    assert run["recovered"] == (run["recovery_s"] is not None)


# -- mixed prompts (Section 4.2) ------------------------------------------------------------------------

MIXED = PAPER["mixed_prompts"]


@pytest.mark.parametrize(("model", "seed"), _runs("mixed-prompts", (PRIMARY,)))
def test_mixed_prompts_reproduce_the_recovery_outcomes(model: str, seed: int, record: Any) -> None:
    runs = {c: result(model, c, seed, mixed_prompts=True) for c in BLOCKS["mixed-prompts"].conditions}
    record("hold_delivered_pct_retries_on_cancel_on", runs["retries-on-cancel-on"]["hold_delivered_pct"],
           MIXED["hold_delivered_pct_retries_on_cancel_on"])
    record("recovery_s_retries_off_cancel_on", runs["retries-off-cancel-on"]["recovery_s"],
           MIXED["recovery_s_retries_off_cancel_on"])
    record("recovery_s_retries_off_cancel_off", runs["retries-off-cancel-off"]["recovery_s"],
           MIXED["recovery_s_retries_off_cancel_off"])
    assert runs["retries-on-cancel-off"]["recovered"] is False
    assert runs["retries-on-cancel-on"]["recovered"] is False
    assert runs["retries-off-cancel-on"]["recovered"] is True
    assert runs["retries-off-cancel-off"]["recovered"] is True
    assert runs["retries-off-cancel-on"]["recovery_s"] < runs["retries-off-cancel-off"]["recovery_s"]
