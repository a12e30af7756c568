"""Section 6's claims: shedding or attaching retries (Finding 5, Section 6.4), queue caps and order
(Finding 6), deferred cancellation (Finding 7), and Section 6.5's rule over every run."""

from __future__ import annotations

from retrybench.claims.model import Check, Claim, Pairs, Subject, Variant, number
from retrybench.claims.paper import FAR, near, paper_values
from retrybench.claims.rows import FINDING5, FINDING6, FINDING7, SECTION62_Q338, SECTION64, SECTION65
from retrybench.plan.blocks import BLOCKS, PRIMARY_MODEL, TABLE1

__all__ = ["CLAIMS"]

P = paper_values()
COMPOSITION = P["composition"]["qwen25"]
BUDGET_CANCEL = P["budget_with_cancellation"]["qwen25"]
ORDER = P["order"]["qwen25"]
QUEUE = P["queue_policy"]["qwen25"]
CAP = P["engine_cap"]["qwen25"]
DEFERRAL = P["deferral"]["qwen25"]
ALL_MODELS = BLOCKS["composition"].models
PRIMARY = (PRIMARY_MODEL,)

A_THIRD_PCT, HALF_PCT = 100 / 3, 50.0  # "a third to half of them late"
NEARLY_EVERY_PCT = 95.0  # Finding 7: "nearly every retry" attaches (the paper saw 99.6%)
ALMOST_NOTHING = 0.01  # Finding 7: the proxy cancels at most this share of executions
EVERY_PCT = 100.0  # "every pulse and hold call"


# -- Finding 5 (Section 6.1) ----------------------------------------------------------------------------------

def _budget_restores_service(c: Check) -> None:
    budget, none = c.run("retry-budget"), c.run("no-control")
    pulse = number("pulse_delivered_pct", budget["pulse_delivered_pct"])
    none_pulse = number("pulse_delivered_pct", none["pulse_delivered_pct"])
    c.figure("recovered", budget["recovered"], True)
    c.figure("retries_refused_pct", round(100 * budget["retries_refused"] / budget["retries"], 4)
             if budget["retries"] else None, COMPOSITION["budget_retries_refused_pct"])
    c.figure("pulse_delivered_pct", pulse, COMPOSITION["budget_pulse_by_840_pct"])
    c.figure("no_control_pulse_delivered_pct", none_pulse, COMPOSITION["no_control_pulse_by_840_pct"])
    c.figure("primary_timely_pct", budget["primary_timely_pct"], COMPOSITION["budget_primary_within_120_pct"])
    c.figure("primary_delivered_pct", budget["primary_delivered_pct"], COMPOSITION["budget_primary_by_840_pct"])
    c.expect("the budget restores service", budget["recovered"] is True)
    c.expect("no control does not, delivering no primary call",
             none["recovered"] is False and none["primary_delivered_pct"] == 0.0)
    c.expect("the budget delivers about as many pulse calls as no control", near(pulse, none_pulse, none_pulse))


def _coalescing_restores_service(c: Check) -> None:
    run = c.run("coalescing")
    c.figure("recovered", run["recovered"], True)
    c.figure("pulse_delivered_pct", run["pulse_delivered_pct"], COMPOSITION["coalescing_pulse_by_840_pct"])
    c.figure("hold_delivered_pct", run["hold_delivered_pct"])
    c.figure("retries_attached_pct", run["retries_attached_pct"], COMPOSITION["coalescing_retries_attached_pct"])
    c.figure("primary_timely_pct", run["primary_timely_pct"], COMPOSITION["coalescing_primary_within_120_pct"])
    c.expect("coalescing restores service", run["recovered"] is True)
    c.expect("every pulse call delivered", run["pulse_delivered_pct"] == EVERY_PCT)
    c.expect("every hold call delivered", run["hold_delivered_pct"] == EVERY_PCT)


def _only_coalescing_rescues_pulse(c: Check) -> None:
    coalescing, budget = c.run("coalescing"), c.run("retry-budget")
    delivered = number("pulse_delivered_pct", coalescing["pulse_delivered_pct"])
    late = delivered - number("pulse_timely_pct", coalescing["pulse_timely_pct"])
    budget_pulse = number("pulse_delivered_pct", budget["pulse_delivered_pct"])
    c.figure("pulse_late_pct", round(late, 4), [round(A_THIRD_PCT, 1), HALF_PCT])
    c.figure("budget_pulse_delivered_pct", budget_pulse, COMPOSITION["budget_pulse_by_840_pct"])
    c.expect("the budget delivers far fewer pulse calls", budget_pulse <= c.thresholds["far_fraction"] * delivered)
    c.expect("a third to half of the pulse delivered late",
             near(late, c.thresholds["late_low_pct"], c.thresholds["late_high_pct"]))


def _coalescing_more_timely_than_budget(c: Check) -> None:
    coalescing, budget = c.run("coalescing"), c.run("retry-budget")
    ours, theirs = (number("primary_timely_pct", coalescing["primary_timely_pct"]),
                    number("primary_timely_pct", budget["primary_timely_pct"]))
    c.figure("coalescing_primary_timely_pct", ours, COMPOSITION["coalescing_primary_within_120_pct"])
    c.figure("budget_primary_timely_pct", theirs, COMPOSITION["budget_primary_within_120_pct"])
    c.expect("coalescing delivers more of the primary cohort within 120 s", ours > theirs)


def _budget_with_cancellation(c: Check) -> None:
    alone, on = c.run("retries-on-cancel-on"), c.run("retry-budget-cancel-on")
    off, deferred = c.run("retry-budget"), c.run("deferred-cancellation")
    on_pulse, off_pulse = (number("pulse_delivered_pct", on["pulse_delivered_pct"]),
                           number("pulse_delivered_pct", off["pulse_delivered_pct"]))
    on_timely = number("primary_timely_pct", on["primary_timely_pct"])
    c.figure("budget_cancel_on_pulse_delivered_pct", on_pulse, BUDGET_CANCEL["budget_cancel_on_pulse_by_840_pct"])
    c.figure("budget_cancel_on_primary_timely_pct", on_timely,
             BUDGET_CANCEL["budget_cancel_on_primary_within_120_pct"])
    c.figure("budget_cancel_off_primary_timely_pct", off["primary_timely_pct"],
             BUDGET_CANCEL["budget_cancel_off_primary_within_120_pct"])
    c.figure("deferred_primary_timely_pct", deferred["primary_timely_pct"],
             BUDGET_CANCEL["deferred_primary_within_120_pct"])
    c.figure("deferred_pulse_delivered_pct", deferred["pulse_delivered_pct"],
             BUDGET_CANCEL["deferred_pulse_by_840_pct"])
    c.expect("cancellation alone does not restore service", alone["recovered"] is False)
    c.expect("the budget with cancellation does", on["recovered"] is True)
    c.expect("it delivers about as many pulse calls as without cancellation", near(on_pulse, off_pulse, off_pulse))
    c.expect("more primary calls within 120 s than without cancellation",
             on_timely > number("primary_timely_pct", off["primary_timely_pct"]))
    c.expect("more primary calls within 120 s than deferred cancellation",
             on_timely > number("primary_timely_pct", deferred["primary_timely_pct"]))
    c.expect("deferred cancellation delivers every pulse call", deferred["pulse_delivered_pct"] == EVERY_PCT)


COMPOSITION_BLOCK = "composition"
BUDGET_RESTORES_SERVICE = Claim(
    id="f5-budget-restores-service", row=FINDING5, section="6.1", block=COMPOSITION_BLOCK, models=ALL_MODELS,
    wording="the retry budget restores service, delivers as many pulse calls as no control",
    predicate=_budget_restores_service)
COALESCING_RESTORES_SERVICE = Claim(
    id="f5-coalescing-restores-service", row=FINDING5, section="6.1", block=COMPOSITION_BLOCK, models=ALL_MODELS,
    wording="coalescing restores service, delivers every pulse and hold call", predicate=_coalescing_restores_service)
ONLY_COALESCING_RESCUES_PULSE = Claim(
    id="f5-only-coalescing-rescues-pulse", row=FINDING5, section="6.1", block=COMPOSITION_BLOCK, models=ALL_MODELS,
    thresholds={"late_low_pct": A_THIRD_PCT, "late_high_pct": HALF_PCT, "far_fraction": FAR},
    wording="only coalescing rescues the pulse, a third to half of it late", predicate=_only_coalescing_rescues_pulse)
COALESCING_MORE_TIMELY = Claim(
    id="f5-coalescing-more-timely-than-budget", row=FINDING5, section="6.1", block=COMPOSITION_BLOCK,
    models=ALL_MODELS, wording="coalescing delivers more of the primary cohort within 120 s than the budget",
    predicate=_coalescing_more_timely_than_budget)
BUDGET_WITH_CANCELLATION = Claim(
    id="f5-budget-with-cancellation", row=FINDING5, section="6.1", block="budget-with-cancellation",
    models=PRIMARY, wording="with cancellation the budget restores service and favours timely delivery",
    predicate=_budget_with_cancellation)


# -- Section 6.4: the order of budget and lookup ---------------------------------------------------------------

def _budget_first_refuses_live(c: Check) -> None:
    run = c.run("budget-first")
    c.figure("retries_refused", run["retries_refused"], ORDER["budget_first_refused_per_run"])
    c.figure("retries_refused_live", run["retries_refused_live"], "more than half")
    c.expect("over half the refused retries' calls still had a live execution",
             run["retries_refused_live"] > run["retries_refused"] / 2)


def _lookup_first_refuses_none(c: Check) -> None:
    run, first = c.run("lookup-first"), c.run("budget-first")
    c.figure("retries_refused", run["retries_refused"], ORDER["lookup_first_refused_per_run"])
    c.figure("pulse_delivered_pct", run["pulse_delivered_pct"], [EVERY_PCT, EVERY_PCT])
    c.figure("gain_within_120_points", round(number("primary_timely_pct", run["primary_timely_pct"])
                                             - number("primary_timely_pct", first["primary_timely_pct"]), 2),
             ORDER["lookup_first_gain_within_120_points"])
    c.figure("gain_by_840_points", round(number("primary_delivered_pct", run["primary_delivered_pct"])
                                         - number("primary_delivered_pct", first["primary_delivered_pct"]), 2),
             ORDER["lookup_first_gain_by_840_points"])
    c.expect("no retry refused", run["retries_refused"] == 0)
    c.expect("every pulse call delivered", run["pulse_delivered_pct"] == EVERY_PCT)
    c.expect("every hold call delivered", run["hold_delivered_pct"] == EVERY_PCT)


BUDGET_FIRST_REFUSES_LIVE = Claim(
    id="s64-budget-first-refuses-live", row=SECTION64, section="6.4", block=COMPOSITION_BLOCK, models=PRIMARY,
    wording="budget-first refuses retries, over half while their call had a live execution",
    predicate=_budget_first_refuses_live)
LOOKUP_FIRST_REFUSES_NONE = Claim(
    id="s64-lookup-first-refuses-none", row=SECTION64, section="6.4", block=COMPOSITION_BLOCK, models=ALL_MODELS,
    wording="lookup-first refuses no retry, delivers every pulse and hold call", predicate=_lookup_first_refuses_none)


# -- Finding 6 (Section 6.2) ----------------------------------------------------------------------------------

def _engine_cap_100(c: Check) -> None:
    capped, none = c.run("engine-cap-100"), c.run("no-control")
    pulse = number("pulse_delivered_pct", capped["pulse_delivered_pct"])
    none_pulse = number("pulse_delivered_pct", none["pulse_delivered_pct"])
    c.figure("recovered", capped["recovered"], True)
    c.figure("pulse_delivered_pct", pulse, CAP["q100_pulse_by_840_pct"])
    c.figure("no_control_pulse_delivered_pct", none_pulse)
    c.figure("calls_failed", capped["calls_failed"], CAP["q100_failed_calls_per_run"])
    c.figure("recovery_s", capped["recovery_s"])
    c.expect("the cap restores service", capped["recovered"] is True)
    c.expect("it delivers fewer pulse calls than no control", pulse < none_pulse)


def _lifo(c: Check) -> None:
    lifo, none = c.run("lifo"), c.run("no-control")
    pulse = number("pulse_delivered_pct", lifo["pulse_delivered_pct"])
    none_pulse = number("pulse_delivered_pct", none["pulse_delivered_pct"])
    c.figure("recovered", lifo["recovered"], True)
    c.figure("pulse_delivered_pct", pulse, QUEUE["lifo_pulse_by_840_pct"])
    c.figure("no_control_pulse_delivered_pct", none_pulse, QUEUE["no_control_pulse_by_840_pct"])
    c.figure("created_x", lifo["created_x"])
    c.expect("newest-first restores service", lifo["recovered"] is True)
    c.expect("it delivers more pulse calls than no control", pulse > none_pulse)
    c.expect("it creates executions below C-hat", number("created_x", lifo["created_x"]) < 1.0)


def _arrival_order(c: Check) -> None:
    run = c.run(c.subject.condition)
    deadline_check = c.subject.condition == "deadline-check"
    c.figure("recovered", run["recovered"], False)
    c.figure("created_x", run["created_x"], QUEUE["deadline_check_creation_x"] if deadline_check else None)
    c.figure("accepted_x", run["accepted_x"], QUEUE["deadline_check_accepted_x"] if deadline_check else None)
    c.expect("not recovered", run["recovered"] is False)


def _engine_cap_338_recorded(c: Check) -> None:
    """The paper draws no conclusion on Q = 338: recorded; checked only that the cap is ceil(120 x C-hat)."""
    run = c.run(c.subject.condition)
    c.figure("recovered", run["recovered"], CAP["q338_recovered_runs"])
    c.figure("pulse_delivered_pct", run["pulse_delivered_pct"])
    c.figure("created_x", run["created_x"])
    c.figure("engine_cap", run["engine_cap"])
    cap = run["engine_cap"]
    c.expect("the cap is ceil(120 C-hat), C-hat rounded",
             cap is not None and -1e-3 <= cap - 120 * run["chat"] < 1 + 1e-3)


ENGINE_CAP_100 = Claim(
    id="f6-engine-cap-100", row=FINDING6, section="6.2", block="engine-cap", models=PRIMARY,
    wording="vLLM's cap at 100 restores service, delivers fewer pulse calls", predicate=_engine_cap_100)
LIFO_UNDER_PROXY_CAP = Claim(
    id="f6-lifo-under-proxy-cap", row=FINDING6, section="6.2", block="queue-policy", models=PRIMARY,
    wording="LIFO under a proxy cap restores service, delivers more pulse calls", predicate=_lifo)
ARRIVAL_ORDER_DOES_NOT_RESTORE = Claim(
    id="f6-arrival-order-does-not-restore", row=FINDING6, section="6.2", block="queue-policy", models=PRIMARY,
    variants=(Variant(condition="proxy-cap"), Variant(condition="deadline-check")),
    wording="arrival order under a proxy cap, with or without a deadline check, does not restore service",
    predicate=_arrival_order)
ENGINE_CAP_338_RECORDED = Claim(
    id="s62-engine-cap-338-recorded", row=SECTION62_Q338, section="6.2", block="engine-cap", models=PRIMARY,
    variants=(Variant(condition="engine-cap-338"), Variant(condition="engine-cap-338-cancel-on")),
    wording="vLLM's cap at ceil(120 C-hat): recorded", predicate=_engine_cap_338_recorded)


# -- Finding 7 (Section 6.3) ----------------------------------------------------------------------------------

def _immediate_cancellation(c: Check) -> None:
    run = c.run("coalescing-cancel-on")
    c.figure("retries_attached", run["retries_attached"], DEFERRAL["coalescing_cancel_on_attached"])
    c.figure("recovered", run["recovered"], False)
    c.figure("executions_cancelled", run["executions_cancelled"], DEFERRAL["coalescing_cancel_on_aborted_per_run"])
    c.expect("no retry attached", run["retries_attached"] == 0)
    c.expect("not recovered", run["recovered"] is False)


def _deferred_cancellation(c: Check) -> None:
    run = c.run("deferred-cancellation")
    attached = number("retries_attached_pct", run["retries_attached_pct"])
    c.figure("retries_attached_pct", attached, DEFERRAL["deferred_attached_pct"])
    c.figure("recovered", run["recovered"], True)
    c.figure("pulse_delivered_pct", run["pulse_delivered_pct"], DEFERRAL["deferred_pulse_and_hold_by_840_pct"])
    c.figure("hold_delivered_pct", run["hold_delivered_pct"], DEFERRAL["deferred_pulse_and_hold_by_840_pct"])
    c.figure("executions_cancelled", run["executions_cancelled"], DEFERRAL["deferred_cancelled_executions"])
    c.expect("nearly every retry attaches", attached >= c.thresholds["attached_pct"])
    c.expect("recovered", run["recovered"] is True)
    c.expect("every pulse call delivered", run["pulse_delivered_pct"] == EVERY_PCT)
    c.expect("every hold call delivered", run["hold_delivered_pct"] == EVERY_PCT)
    c.expect("the proxy cancels almost nothing",
             run["executions_cancelled"] <= c.thresholds["cancelled_fraction"] * run["executions_created"])


IMMEDIATE_CANCELLATION_LEAVES_NOTHING = Claim(
    id="f7-immediate-cancellation-leaves-nothing", row=FINDING7, section="6.3", block="deferral", models=PRIMARY,
    wording="immediate cancellation leaves coalescing nothing to attach to", predicate=_immediate_cancellation)
DEFERRED_CANCELLATION_RESTORES = Claim(
    id="f7-deferred-cancellation-restores", row=FINDING7, section="6.3", block="deferral", models=PRIMARY,
    thresholds={"attached_pct": NEARLY_EVERY_PCT, "cancelled_fraction": ALMOST_NOTHING},
    wording="deferred cancellation lets retries attach and restores service", predicate=_deferred_cancellation)


# -- Section 6.5: every recovered run created executions below C-hat ----------------------------------------------

def _every_block_run(claim: Claim, pairs: Pairs) -> list[Subject]:
    """One subject per block, model, seed and pulse: its conditions are read together."""
    return [Subject(model=model, seed=seed, block=name, pulse_x=pulse_x)
            for name, block in TABLE1.items() for pulse_x in block.pulses_x
            for model, seed in pairs(name, block.models)]


def _recovered_runs_below_capacity(c: Check) -> None:
    block = BLOCKS[c.subject.block]
    steps = block.step_tokens or (8192,) * len(block.conditions)
    runs = {f"{cond} ({s})" if block.step_tokens else cond:
            c.run(cond, pulse_x=c.subject.pulse_x, mixed_prompts=block.mixed_prompts, max_batched_tokens=s,
                  trace=block.traced)
            for cond, s in zip(block.conditions, steps, strict=True)}
    created = {name: number("created_x", r["created_x"]) for name, r in runs.items()}
    above = {name: x for name, x in created.items() if runs[name]["recovered"] and x >= 1.0}
    below = {name: x for name, x in created.items() if not runs[name]["recovered"] and x < 1.0}
    c.figure("recovered_at_or_above_chat", above, {})
    c.figure("below_chat_not_recovered", below)
    c.expect("no recovered run created executions at or above C-hat", not above)


RECOVERED_RUNS_BELOW_CAPACITY = Claim(
    id="s65-recovered-runs-below-capacity", row=SECTION65, section="6.5", block="", models=(),
    wording="every recovered run created executions below C-hat", predicate=_recovered_runs_below_capacity,
    expand=_every_block_run)

CLAIMS: tuple[Claim, ...] = (
    BUDGET_RESTORES_SERVICE, COALESCING_RESTORES_SERVICE, ONLY_COALESCING_RESCUES_PULSE, COALESCING_MORE_TIMELY,
    BUDGET_WITH_CANCELLATION, BUDGET_FIRST_REFUSES_LIVE, LOOKUP_FIRST_REFUSES_NONE, ENGINE_CAP_100,
    LIFO_UNDER_PROXY_CAP, ARRIVAL_ORDER_DOES_NOT_RESTORE, ENGINE_CAP_338_RECORDED,
    IMMEDIATE_CANCELLATION_LEAVES_NOTHING, DEFERRED_CANCELLATION_RESTORES, RECOVERED_RUNS_BELOW_CAPACITY,
)
