"""The figures the report's summary shows for each row: which measured figure of which claims, by id."""

from __future__ import annotations

from dataclasses import dataclass

from retrybench.claims import Subject

__all__ = ["HEADLINES", "Headline"]


@dataclass(frozen=True)
class Headline:
    """A figure the summary shows: `metric` over the checks of the claims `claims` (ids) whose subject
    matches the given model, step size and condition (any, where not given)."""

    label: str
    claims: tuple[str, ...]
    metric: str
    model: str = ""
    steps: int | None = None
    condition: str = ""

    def matches(self, claim_id: str, subject: Subject) -> bool:
        return (claim_id in self.claims and self.model in ("", subject.model)
                and self.steps in (None, subject.steps) and self.condition in ("", subject.condition))


Q, Q3, LLAMA = "qwen2.5-7b-instruct", "qwen3-14b", "llama-3.1-8b-instruct"
H = Headline
HEADLINES: dict[str, tuple[Headline, ...]] = {
    "finding1": (
        H("Qwen2.5-7B hold delivered %, retries on, cancellation off", ("f1-no-hold-call-without-cancellation",),
          "hold_delivered_pct", Q),
        H("Qwen2.5-7B hold delivered %, retries and cancellation on", ("f1-cancellation-alone-does-not-restore",),
          "hold_delivered_pct", Q),
        H("recovered with retries on, 2.7 C-hat (all models, either cancellation)",
          ("f1-no-hold-call-without-cancellation", "f1-cancellation-alone-does-not-restore"), "recovered"),
        H("recovered with retries off (all models)", ("f1-recovers-without-retries",), "recovered"),
        H("vLLM acceptance ×C, retries on, cancellation off", ("f1-accepting-over-twice-capacity",), "accepted_x"),
        H("vLLM completion ×C, retries on, cancellation off", ("f1-accepting-over-twice-capacity",), "completed_x"),
        H("completion % of C-hat, retries and cancellation on", ("f1-completion-far-below-capacity",),
          "completed_pct_of_chat"),
        H("recovered after a 1.5 C-hat pulse despite retries", ("f1-small-pulse-recovers",), "recovered"),
        H("recovered after a 2.7 C-hat pulse with retries (sweep)", ("f1-large-pulse-does-not-recover",),
          "recovered"),
        H("recovered without retries after every pulse (sweep)", ("f1-recovers-after-every-pulse-without-retries",),
          "recovered"),
    ),
    "finding2": (
        H("aborted share of computed prompt tokens %, 8K", ("f2-aborted-hold-most-prompt-work",),
          "aborted_prompt_share_pct", steps=8192),
        H("aborted share of computed prompt tokens %, 2K", ("f2-aborted-hold-most-prompt-work",),
          "aborted_prompt_share_pct", steps=2048),
        H("in-flight share of aborted work %, 8K", ("f2-in-flight-half-at-8k-cut-at-2k",), "in_flight_share_pct_8k"),
        H("in-flight share of aborted work %, 2K", ("f2-in-flight-half-at-8k-cut-at-2k",), "in_flight_share_pct_2k"),
        H("aborted share of step time %, 8K (five rules)", ("f2-step-time-majority-under-every-rule",),
          "step_time_aborted_share_pct", steps=8192),
    ),
    "finding3": (
        H("retry's time left at first step, median s, 8K", ("f3-first-scheduled-near-deadline",),
          "retry_time_left_at_first_step_median_s", steps=8192),
        H("retry first scheduled after predecessor's abort, median s, 8K", ("f3-first-scheduled-near-deadline",),
          "retry_first_scheduled_after_abort_median_s", steps=8192),
        H("same, 2K", ("f3-first-scheduled-near-deadline",), "retry_first_scheduled_after_abort_median_s",
          steps=2048),
        H("hold delivered %, 8K", ("f3-smaller-steps-keep-timing",), "hold_delivered_pct_8k"),
        H("hold delivered %, 2K", ("f3-smaller-steps-keep-timing",), "hold_delivered_pct_2k"),
        H("recovered at 2K", ("f3-smaller-steps-keep-timing",), "recovered_2k"),
    ),
    "finding4": (
        H("counter's error against its rule %", ("f4-counter-follows-rule",), "counter_rule_error_pct"),
        H("counter gap %, Qwen2.5-7B", ("f4-counter-gap",), "counter_gap_pct", Q),
        H("counter gap %, Qwen3-14B", ("f4-counter-gap",), "counter_gap_pct", Q3),
        H("counter gap %, Llama-3.1-8B", ("f4-counter-gap",), "counter_gap_pct", LLAMA),
    ),
    "finding5": (
        H("retry budget recovered (all models)", ("f5-budget-restores-service",), "recovered"),
        H("coalescing recovered (all models)", ("f5-coalescing-restores-service",), "recovered"),
        H("Qwen2.5-7B pulse delivered %, retry budget", ("f5-budget-restores-service",), "pulse_delivered_pct", Q),
        H("Qwen2.5-7B pulse delivered %, no control", ("f5-budget-restores-service",),
          "no_control_pulse_delivered_pct", Q),
        H("Qwen2.5-7B pulse delivered %, coalescing", ("f5-coalescing-restores-service",), "pulse_delivered_pct", Q),
        H("pulse delivered late under coalescing %", ("f5-only-coalescing-rescues-pulse",), "pulse_late_pct"),
        H("Qwen2.5-7B primary within 120 s %, coalescing", ("f5-coalescing-more-timely-than-budget",),
          "coalescing_primary_timely_pct", Q),
        H("Qwen2.5-7B primary within 120 s %, retry budget", ("f5-coalescing-more-timely-than-budget",),
          "budget_primary_timely_pct", Q),
        H("primary within 120 s %, budget with cancellation", ("f5-budget-with-cancellation",),
          "budget_cancel_on_primary_timely_pct"),
    ),
    "finding6": (
        H("Q = 100 recovered", ("f6-engine-cap-100",), "recovered"),
        H("Q = 100 pulse delivered %", ("f6-engine-cap-100",), "pulse_delivered_pct"),
        H("LIFO recovered", ("f6-lifo-under-proxy-cap",), "recovered"),
        H("LIFO pulse delivered %", ("f6-lifo-under-proxy-cap",), "pulse_delivered_pct"),
        H("no control pulse delivered % (queue-policy block)", ("f6-lifo-under-proxy-cap",),
          "no_control_pulse_delivered_pct"),
        H("proxy cap, arrival order: recovered", ("f6-arrival-order-does-not-restore",), "recovered",
          condition="proxy-cap"),
        H("deadline check: recovered", ("f6-arrival-order-does-not-restore",), "recovered",
          condition="deadline-check"),
    ),
    "finding7": (
        H("coalescing, cancellation on: retries attached", ("f7-immediate-cancellation-leaves-nothing",),
          "retries_attached"),
        H("coalescing, cancellation on: recovered", ("f7-immediate-cancellation-leaves-nothing",), "recovered"),
        H("deferred cancellation: retries attached %", ("f7-deferred-cancellation-restores",),
          "retries_attached_pct"),
        H("deferred cancellation: recovered", ("f7-deferred-cancellation-restores",), "recovered"),
        H("deferred cancellation: pulse delivered %", ("f7-deferred-cancellation-restores",), "pulse_delivered_pct"),
        H("deferred cancellation: executions cancelled", ("f7-deferred-cancellation-restores",),
          "executions_cancelled"),
    ),
    "section64": (
        H("budget-first retries refused per run", ("s64-budget-first-refuses-live",), "retries_refused"),
        H("of them with a live execution", ("s64-budget-first-refuses-live",), "retries_refused_live"),
        H("lookup-first retries refused (all models)", ("s64-lookup-first-refuses-none",), "retries_refused"),
        H("lookup-first pulse delivered % (all models)", ("s64-lookup-first-refuses-none",), "pulse_delivered_pct"),
        H("lookup-first gain by 840 s, points, Qwen2.5-7B", ("s64-lookup-first-refuses-none",), "gain_by_840_points",
          Q),
    ),
    "section42-2x": (
        H("Qwen2.5-7B recovered", ("s42-two-x-pulse-recorded",), "recovered", Q),
        H("Qwen2.5-7B hold delivered %", ("s42-two-x-pulse-recorded",), "hold_delivered_pct", Q),
        H("Qwen3-14B recovered", ("s42-two-x-pulse-recorded",), "recovered", Q3),
        H("Llama-3.1-8B recovered", ("s42-two-x-pulse-recorded",), "recovered", LLAMA),
    ),
    "section62-q338": (
        H("Q = 338, cancellation off: recovered", ("s62-engine-cap-338-recorded",), "recovered",
          condition="engine-cap-338"),
        H("Q = 338, cancellation on: recovered", ("s62-engine-cap-338-recorded",), "recovered",
          condition="engine-cap-338-cancel-on"),
        H("Q = 338, cancellation on: created ×C", ("s62-engine-cap-338-recorded",), "created_x",
          condition="engine-cap-338-cancel-on"),
    ),
}
