"""Section 5's claims (Findings 2-4), on Qwen2.5-7B-Instruct's traced runs at 8,192 and 2,048 batched
tokens, and Finding 4's counter gap on the diagnostic block of every model."""

from __future__ import annotations

from retrybench.claims.model import Check, Claim, Variant, number
from retrybench.claims.paper import near, paper_values
from retrybench.claims.rows import FINDING2, FINDING3, FINDING4
from retrybench.plan.blocks import BLOCKS, PRIMARY_MODEL
from retrybench.records.results import RunSummary

__all__ = ["CLAIMS"]

P = paper_values()
TRACING = P["tracing"]
DEADLINE_S = float(P["workload"]["attempt_timeout_s"])

MAJORITY_PCT = 50.0  # "most" of the work: over half
CLOSE_TO_DEADLINE = 0.05  # "close to their deadline": median time left at most this share of it
A_FIFTH_PCT, TWO_THIRDS_PCT = 100 / 5, 200 / 3  # Finding 4's counter gap: "a fifth to two thirds"

BOTH_STEP_SIZES = (Variant(steps=8192), Variant(steps=2048))
PRIMARY = (PRIMARY_MODEL,)


def _size(steps: int | None) -> str:
    return "8k" if steps == 8192 else "2k"


def _traced(c: Check, steps: int | None, condition: str = "retries-on-cancel-on") -> RunSummary:
    return c.run(condition, max_batched_tokens=steps or 8192, trace=True)


# -- Finding 2 (Section 5.1) ----------------------------------------------------------------------------------

def _aborted_hold_most_prompt_work(c: Check) -> None:
    run, key = _traced(c, c.subject.steps), _size(c.subject.steps)
    c.figure("aborted_prompt_share_pct", run["aborted_prompt_share_pct"],
             TRACING[f"aborted_share_of_computed_prompt_pct_{key}"])
    c.figure("aborted_unscheduled", run["aborted_unscheduled"],
             TRACING[f"aborted_before_first_scheduled_per_run_{key}"])
    c.figure("missed_share_pct", run["missed_share_pct"], TRACING[f"aborted_before_first_output_share_pct_{key}"])
    c.figure("missed_share_last240_pct", run["missed_share_last240_pct"],
             TRACING[f"aborted_before_first_output_share_last_240s_pct_{key}"])
    c.expect("aborted executions hold over half the computed prompt tokens",
             number("aborted_prompt_share_pct", run["aborted_prompt_share_pct"]) > c.thresholds["share_pct"])


def _in_flight_half_at_8k(c: Check) -> None:
    big, small = _traced(c, 8192), _traced(c, 2048)
    low, high = TRACING["in_flight_share_of_aborted_pct_8k"]
    at_8k = number("in_flight_share_pct", big["in_flight_share_pct"])
    c.figure("in_flight_share_pct_8k", big["in_flight_share_pct"], [low, high])
    c.figure("in_flight_share_pct_2k", small["in_flight_share_pct"], TRACING["in_flight_share_of_aborted_pct_2k"])
    c.expect("about half in flight at 8K", near(at_8k, low, high))
    c.expect("2K steps cut the in-flight share", number("in_flight_share_pct", small["in_flight_share_pct"]) < at_8k)


def _step_time_majority(c: Check) -> None:
    run, key = _traced(c, c.subject.steps), _size(c.subject.steps)
    by_rule = run["step_time_aborted_share_by_rule_pct"]
    c.figure("step_time_aborted_share_pct", run["step_time_aborted_share_pct"],
             TRACING[f"aborted_share_of_step_time_pct_{key}"])
    c.figure("step_time_aborted_share_by_rule_pct", by_rule)
    c.expect("over half the step time under every rule",
             all(number(rule, share) > c.thresholds["share_pct"] for rule, share in by_rule.items()))


def _nothing_missed_without_cancellation(c: Check) -> None:
    run = _traced(c, 2048, "retries-on-cancel-off")
    c.figure("aborted_prompt_share_pct", run["aborted_prompt_share_pct"])
    c.figure("missed_share_pct", run["missed_share_pct"], TRACING["missed_share_pct"]["k2_cancel_off"])
    c.expect("nothing aborted", run["aborted_prompt_share_pct"] == 0.0)
    c.expect("nothing missed", run["missed_share_pct"] == 0.0)


TRACING_BLOCK = "tracing"
ABORTED_HOLD_MOST_PROMPT_WORK = Claim(
    id="f2-aborted-hold-most-prompt-work", row=FINDING2, section="5.1", block=TRACING_BLOCK, models=PRIMARY,
    variants=BOTH_STEP_SIZES, thresholds={"share_pct": MAJORITY_PCT},
    wording="aborted executions hold most computed prompt tokens", predicate=_aborted_hold_most_prompt_work)
STEP_TIME_MAJORITY = Claim(
    id="f2-step-time-majority-under-every-rule", row=FINDING2, section="5.1", block=TRACING_BLOCK, models=PRIMARY,
    variants=BOTH_STEP_SIZES, thresholds={"share_pct": MAJORITY_PCT},
    wording="aborted prompt work takes most step time under every rule", predicate=_step_time_majority)
IN_FLIGHT_HALF_AT_8K = Claim(
    id="f2-in-flight-half-at-8k-cut-at-2k", row=FINDING2, section="5.1", block=TRACING_BLOCK, models=PRIMARY,
    wording="at 8K about half the aborted work was in flight; 2K steps cut it", predicate=_in_flight_half_at_8k)
NOTHING_MISSED_WITHOUT_CANCELLATION = Claim(
    id="f2-nothing-missed-without-cancellation", row=FINDING2, section="5.1", block=TRACING_BLOCK, models=PRIMARY,
    wording="without cancellation no prompt work is missed", predicate=_nothing_missed_without_cancellation)


# -- Finding 3 (Section 5.2) ----------------------------------------------------------------------------------

def _timing_parts(c: Check, run: RunSummary) -> None:
    low, high = TRACING["retry_first_scheduled_after_predecessor_abort_median_s"]
    left = number("retry_time_left_at_first_step_median_s", run["retry_time_left_at_first_step_median_s"])
    after = number("retry_first_scheduled_after_abort_median_s", run["retry_first_scheduled_after_abort_median_s"])
    c.expect("median time left at first step within 5% of the deadline",
             left <= c.thresholds["deadline_fraction"] * DEADLINE_S)
    c.expect("first scheduled about one deadline after the predecessor's abort", near(after, low, high))


def _first_scheduled_near_deadline(c: Check) -> None:
    run, key = _traced(c, c.subject.steps), _size(c.subject.steps)
    c.figure("retry_time_left_at_first_step_median_s", run["retry_time_left_at_first_step_median_s"],
             TRACING["scheduled_retry_time_left_at_first_step_median_s"])
    c.figure("retry_time_left_at_first_step_p90_s", run["retry_time_left_at_first_step_p90_s"],
             TRACING["scheduled_retry_time_left_at_first_step_p90_s"])
    c.figure("retry_first_scheduled_after_abort_median_s", run["retry_first_scheduled_after_abort_median_s"],
             TRACING["retry_first_scheduled_after_predecessor_abort_median_s"])
    c.figure("abort_after_first_step_median_s", run["abort_after_first_step_median_s"],
             TRACING["abort_after_first_step_began_median_s"])
    c.figure("retries_never_scheduled_pct", run["retries_never_scheduled_pct"],
             TRACING[f"retries_never_scheduled_pct_{key}"])
    _timing_parts(c, run)


def _smaller_steps_keep_timing(c: Check) -> None:
    big, small = _traced(c, 8192), _traced(c, 2048)
    c.figure("hold_delivered_pct_8k", big["hold_delivered_pct"], TRACING["hold_delivered_pct_8k_cancel_on"])
    c.figure("hold_delivered_pct_2k", small["hold_delivered_pct"], TRACING["hold_delivered_pct_2k_cancel_on"])
    c.figure("recovered_2k", small["recovered"], False)
    _timing_parts(c, small)
    c.expect("not recovered at 2K", small["recovered"] is False)
    c.expect("2K steps raise hold delivery",
             number("hold_delivered_pct", small["hold_delivered_pct"])
             > number("hold_delivered_pct", big["hold_delivered_pct"]))


FIRST_SCHEDULED_NEAR_DEADLINE = Claim(
    id="f3-first-scheduled-near-deadline", row=FINDING3, section="5.2", block=TRACING_BLOCK, models=PRIMARY,
    variants=BOTH_STEP_SIZES, thresholds={"deadline_fraction": CLOSE_TO_DEADLINE},
    wording="retries are first scheduled close to their deadline", predicate=_first_scheduled_near_deadline)
SMALLER_STEPS_KEEP_TIMING = Claim(
    id="f3-smaller-steps-keep-timing", row=FINDING3, section="5.2", block=TRACING_BLOCK, models=PRIMARY,
    thresholds={"deadline_fraction": CLOSE_TO_DEADLINE},
    wording="2K steps keep the timing, do not restore service, raise hold delivery",
    predicate=_smaller_steps_keep_timing)


# -- Finding 4 (Section 5.3) ----------------------------------------------------------------------------------

def _counter_follows_rule(c: Check) -> None:
    run = _traced(c, c.subject.steps)
    within = c.thresholds["rule_error_pct"]
    c.figure("counter_rule_error_pct", run["counter_rule_error_pct"], [0.0, within])
    c.expect("the counter's increase matches its rule",
             number("counter_rule_error_pct", run["counter_rule_error_pct"]) <= within)


def _counter_gap(c: Check) -> None:
    gap = number("counter_gap_pct", c.run("retries-on-cancel-on")["counter_gap_pct"])
    c.figure("counter_gap_pct", gap, P["counter_gap"][c.subject.model])
    c.expect("the counter misses a fifth to two thirds of admitted prompt tokens",
             near(gap, c.thresholds["gap_low_pct"], c.thresholds["gap_high_pct"]))


COUNTER_FOLLOWS_RULE = Claim(
    id="f4-counter-follows-rule", row=FINDING4, section="5.3", block=TRACING_BLOCK, models=PRIMARY,
    variants=BOTH_STEP_SIZES, thresholds={"rule_error_pct": float(TRACING["counter_matches_rule_within_pct"])},
    wording="the prompt-token counter follows its rule", predicate=_counter_follows_rule)
COUNTER_GAP = Claim(
    id="f4-counter-gap", row=FINDING4, section="5.3", block="diagnostic", models=BLOCKS["diagnostic"].models,
    thresholds={"gap_low_pct": A_FIFTH_PCT, "gap_high_pct": TWO_THIRDS_PCT},
    wording="the counter misses a fifth to two thirds of admitted prompt tokens", predicate=_counter_gap)

CLAIMS: tuple[Claim, ...] = (
    ABORTED_HOLD_MOST_PROMPT_WORK, STEP_TIME_MAJORITY, IN_FLIGHT_HALF_AT_8K, NOTHING_MISSED_WITHOUT_CANCELLATION,
    FIRST_SCHEDULED_NEAR_DEADLINE, SMALLER_STEPS_KEEP_TIMING, COUNTER_FOLLOWS_RULE, COUNTER_GAP,
)
