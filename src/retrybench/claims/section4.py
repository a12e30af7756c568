"""Section 4's claims (Finding 1): the collapse, Table 2's diagnostic block, Table 3's trigger sweep and the
mixed-prompt repeat."""

from __future__ import annotations

from retrybench.claims.model import Check, Claim, Variant, number
from retrybench.claims.paper import near, paper_values
from retrybench.claims.rows import FINDING1, SECTION42_2X
from retrybench.plan.blocks import BLOCKS, PRIMARY_MODEL

__all__ = ["CLAIMS"]

P = paper_values()
TABLE2 = P["diagnostic"]["hold_delivered_pct"]
QWEN = P["diagnostic"]["qwen25"]
SWEEP = P["trigger_sweep"]
MIXED = P["mixed_prompts"]
ALL_MODELS = BLOCKS["diagnostic"].models
SWEEP_MODELS = BLOCKS["trigger-sweep"].models

OVER_TWICE_CAPACITY = 2.0  # "accepts executions at over twice C-hat" (x C-hat)
UNDER_ONE_PCT = 1.0  # "completion falls to under 1% of C-hat" (% of C-hat)


def _table2(model: str, condition: str) -> float:
    value: float = TABLE2[model][condition.replace("-", "_")]
    return value


def _sweep_cell(model: str, retries: str, pulse_x: float) -> list[float]:
    """Table 3's cell: hold delivered %, and the recovery time in s (-1 where the run did not recover)."""
    cell: list[float] = SWEEP[model][f"retries_{retries}"][SWEEP["pulses_x"].index(pulse_x)]
    return cell


# -- the diagnostic block (Section 4.1, Table 2) ----------------------------------------------------------

def _no_hold_call_without_cancellation(c: Check) -> None:
    run = c.run("retries-on-cancel-off")
    c.figure("hold_delivered_pct", run["hold_delivered_pct"], _table2(c.subject.model, "retries-on-cancel-off"))
    c.figure("recovered", run["recovered"], False)
    c.expect("no hold call delivered", run["hold_delivered_pct"] == 0.0)
    c.expect("not recovered", run["recovered"] is False)


def _cancellation_alone_does_not_restore(c: Check) -> None:
    run = c.run("retries-on-cancel-on")
    c.figure("hold_delivered_pct", run["hold_delivered_pct"], _table2(c.subject.model, "retries-on-cancel-on"))
    c.figure("recovered", run["recovered"], False)
    c.expect("not recovered", run["recovered"] is False)


def _recovers_without_retries(c: Check) -> None:
    run = c.run(c.subject.condition)
    c.figure("hold_delivered_pct", run["hold_delivered_pct"], _table2(c.subject.model, c.subject.condition))
    c.figure("recovered", run["recovered"], True)
    c.figure("recovery_s", run["recovery_s"])
    c.expect("recovered within the hold", run["recovered"] is True)


def _cancellation_recovers_earlier(c: Check) -> None:
    on, off = c.run("retries-off-cancel-on"), c.run("retries-off-cancel-off")
    c.figure("recovery_s_cancel_on", on["recovery_s"], QWEN["recovery_s_retries_off_cancel_on"])
    c.figure("recovery_s_cancel_off", off["recovery_s"], QWEN["recovery_s_retries_off_cancel_off"])
    both = on["recovered"] and off["recovered"]
    c.expect("both recovered", both)
    c.expect("cancellation recovered earlier",
             both and number("recovery_s", on["recovery_s"]) < number("recovery_s", off["recovery_s"]))


def _accepting_over_twice_capacity(c: Check) -> None:
    run = c.run("retries-on-cancel-off")
    low, high = (v / 100 for v in QWEN["completed_pct_of_chat_retries_on_cancel_off"])
    c.figure("accepted_x", run["accepted_x"], QWEN["accepted_x_retries_on_cancel_off"])
    c.figure("completed_x", run["completed_x"], [low, high])
    c.figure("retry_share_pct", run["retry_share_pct"], QWEN["retry_share_of_executions_pct_retries_on_cancel_off"])
    c.expect("vLLM accepts over twice C-hat", number("accepted_x", run["accepted_x"]) > c.thresholds["accepted_x"])
    c.expect("completes near C-hat", near(number("completed_x", run["completed_x"]), low, high))


def _completion_far_below_capacity(c: Check) -> None:
    run = c.run("retries-on-cancel-on")
    completed_pct = 100 * number("completed_x", run["completed_x"])
    low, high = QWEN["mean_waiting_pct_of_littles_law"]
    c.figure("accepted_x", run["accepted_x"], QWEN["accepted_x_retries_on_cancel_on"])
    c.figure("completed_pct_of_chat", round(completed_pct, 2), QWEN["completed_pct_of_chat_retries_on_cancel_on"])
    c.figure("mean_waiting_pct_of_littles_law", run["mean_waiting_pct_of_littles_law"], [low, high])
    c.expect("vLLM accepts over twice C-hat", number("accepted_x", run["accepted_x"]) > c.thresholds["accepted_x"])
    c.expect("completion under 1% of C-hat", completed_pct < c.thresholds["completed_pct_of_chat"])
    c.expect("the waiting queue is the Little's-law one",
             near(number("mean_waiting_pct_of_littles_law", run["mean_waiting_pct_of_littles_law"]), low, high))


DIAGNOSTIC = "diagnostic"
NO_HOLD_CALL_WITHOUT_CANCELLATION = Claim(
    id="f1-no-hold-call-without-cancellation", row=FINDING1, section="4.1", block=DIAGNOSTIC, models=ALL_MODELS,
    wording="retries on, cancellation off: no hold call delivered, not recovered",
    predicate=_no_hold_call_without_cancellation)
CANCELLATION_ALONE_DOES_NOT_RESTORE = Claim(
    id="f1-cancellation-alone-does-not-restore", row=FINDING1, section="4.1", block=DIAGNOSTIC, models=ALL_MODELS,
    wording="retries on, cancellation on: not recovered", predicate=_cancellation_alone_does_not_restore)
RECOVERS_WITHOUT_RETRIES = Claim(
    id="f1-recovers-without-retries", row=FINDING1, section="4.1", block=DIAGNOSTIC, models=ALL_MODELS,
    variants=(Variant(condition="retries-off-cancel-off"), Variant(condition="retries-off-cancel-on")),
    wording="retries off: recovers within the hold", predicate=_recovers_without_retries)
CANCELLATION_RECOVERS_EARLIER = Claim(
    id="f1-cancellation-recovers-earlier", row=FINDING1, section="4.1", block=DIAGNOSTIC, models=(PRIMARY_MODEL,),
    wording="without retries, cancellation recovers earlier", predicate=_cancellation_recovers_earlier)
ACCEPTING_OVER_TWICE_CAPACITY = Claim(
    id="f1-accepting-over-twice-capacity", row=FINDING1, section="4.1", block=DIAGNOSTIC, models=(PRIMARY_MODEL,),
    thresholds={"accepted_x": OVER_TWICE_CAPACITY},
    wording="retries keep vLLM accepting over 2 C-hat, completing near C-hat",
    predicate=_accepting_over_twice_capacity)
COMPLETION_FAR_BELOW_CAPACITY = Claim(
    id="f1-completion-far-below-capacity", row=FINDING1, section="4.1", block=DIAGNOSTIC, models=(PRIMARY_MODEL,),
    thresholds={"accepted_x": OVER_TWICE_CAPACITY, "completed_pct_of_chat": UNDER_ONE_PCT},
    wording="with cancellation, completion under 1% of C-hat, Little's-law queue",
    predicate=_completion_far_below_capacity)


# -- the trigger sweep (Section 4.2, Table 3) ---------------------------------------------------------------

def _sweep_figures(c: Check, retries: str, pulse_x: float) -> bool:
    """Records the run's Table 3 cell beside the paper's and returns whether it recovered."""
    run = c.run(f"retries-{retries}-cancel-off", pulse_x=pulse_x)
    delivered, recovery = _sweep_cell(c.subject.model, retries, pulse_x)
    c.figure("recovered", run["recovered"], recovery >= 0)
    c.figure("hold_delivered_pct", run["hold_delivered_pct"], delivered)
    c.figure("recovery_s", run["recovery_s"], recovery if recovery >= 0 else None)
    return run["recovered"]


def _small_pulse_recovers(c: Check) -> None:
    c.expect("recovered", _sweep_figures(c, "on", 1.5) is True)


def _large_pulse_does_not_recover(c: Check) -> None:
    c.expect("not recovered", _sweep_figures(c, "on", 2.7) is False)


def _recovers_after_every_pulse_without_retries(c: Check) -> None:
    assert c.subject.pulse_x is not None
    c.expect("recovered", _sweep_figures(c, "off", c.subject.pulse_x) is True)


def _two_x_pulse_recorded(c: Check) -> None:
    """The paper draws no boundary at 2 C-hat: recorded; checked only that the run was classified."""
    run = c.run("retries-on-cancel-off", pulse_x=2.0)
    cell = _sweep_cell(c.subject.model, "on", 2.0)
    c.figure("recovered", run["recovered"], cell[1] >= 0)
    c.figure("hold_delivered_pct", run["hold_delivered_pct"], cell[0])
    c.figure("recovery_s", run["recovery_s"], cell[1] if cell[1] >= 0 else None)
    c.expect("classified: recovered exactly when it has a recovery time",
             run["recovered"] == (run["recovery_s"] is not None))


SWEEP_BLOCK = "trigger-sweep"
SMALL_PULSE_RECOVERS = Claim(
    id="f1-small-pulse-recovers", row=FINDING1, section="4.2", block=SWEEP_BLOCK, models=SWEEP_MODELS,
    variants=(Variant(pulse_x=1.5),), wording="retries on, pulse 1.5 C-hat: recovers",
    predicate=_small_pulse_recovers)
LARGE_PULSE_DOES_NOT_RECOVER = Claim(
    id="f1-large-pulse-does-not-recover", row=FINDING1, section="4.2", block=SWEEP_BLOCK, models=SWEEP_MODELS,
    variants=(Variant(pulse_x=2.7),), wording="retries on, pulse 2.7 C-hat: does not recover",
    predicate=_large_pulse_does_not_recover)
RECOVERS_AFTER_EVERY_PULSE_WITHOUT_RETRIES = Claim(
    id="f1-recovers-after-every-pulse-without-retries", row=FINDING1, section="4.2", block=SWEEP_BLOCK,
    models=SWEEP_MODELS, variants=tuple(Variant(pulse_x=x) for x in SWEEP["pulses_x"]),
    wording="retries off: recovers after every pulse", predicate=_recovers_after_every_pulse_without_retries)
TWO_X_PULSE_RECORDED = Claim(
    id="s42-two-x-pulse-recorded", row=SECTION42_2X, section="4.2", block=SWEEP_BLOCK, models=SWEEP_MODELS,
    variants=(Variant(pulse_x=2.0),), wording="retries on, pulse 2 C-hat: recorded",
    predicate=_two_x_pulse_recorded)


# -- mixed prompts (Section 4.2) ------------------------------------------------------------------------------

def _mixed_prompts_recovery_outcomes(c: Check) -> None:
    runs = {cond: c.run(cond, mixed_prompts=True) for cond in BLOCKS["mixed-prompts"].conditions}
    on, off = runs["retries-off-cancel-on"], runs["retries-off-cancel-off"]
    c.figure("recovered", {cond: r["recovered"] for cond, r in runs.items()})
    c.figure("hold_delivered_pct_retries_on_cancel_on", runs["retries-on-cancel-on"]["hold_delivered_pct"],
             MIXED["hold_delivered_pct_retries_on_cancel_on"])
    c.figure("recovery_s_retries_off_cancel_on", on["recovery_s"], MIXED["recovery_s_retries_off_cancel_on"])
    c.figure("recovery_s_retries_off_cancel_off", off["recovery_s"], MIXED["recovery_s_retries_off_cancel_off"])
    c.expect("retries on, cancellation off: not recovered", runs["retries-on-cancel-off"]["recovered"] is False)
    c.expect("retries on, cancellation on: not recovered", runs["retries-on-cancel-on"]["recovered"] is False)
    c.expect("retries off, cancellation on: recovered", on["recovered"] is True)
    c.expect("retries off, cancellation off: recovered", off["recovered"] is True)
    c.expect("without retries, cancellation recovered earlier",
             on["recovered"] and off["recovered"]
             and number("recovery_s", on["recovery_s"]) < number("recovery_s", off["recovery_s"]))


MIXED_PROMPTS_RECOVERY_OUTCOMES = Claim(
    id="f1-mixed-prompts-recovery-outcomes", row=FINDING1, section="4.2", block="mixed-prompts",
    models=(PRIMARY_MODEL,), wording="mixed prompts: the diagnostic's recovery outcomes",
    predicate=_mixed_prompts_recovery_outcomes)

CLAIMS: tuple[Claim, ...] = (
    NO_HOLD_CALL_WITHOUT_CANCELLATION, CANCELLATION_ALONE_DOES_NOT_RESTORE, RECOVERS_WITHOUT_RETRIES,
    CANCELLATION_RECOVERS_EARLIER, ACCEPTING_OVER_TWICE_CAPACITY, COMPLETION_FAR_BELOW_CAPACITY,
    SMALL_PULSE_RECOVERS, LARGE_PULSE_DOES_NOT_RECOVER, RECOVERS_AFTER_EVERY_PULSE_WITHOUT_RETRIES,
    TWO_X_PULSE_RECORDED, MIXED_PROMPTS_RECOVERY_OUTCOMES,
)
