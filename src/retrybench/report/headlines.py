"""The figures the report's summary shows for each finding: which metric of which claim checks."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HEADLINES", "Headline"]


@dataclass(frozen=True)
class Headline:
    """A figure the summary shows: `metric` over the checks whose claim starts with `claim` and whose
    subject contains `subject`."""

    label: str
    claim: str
    metric: str
    subject: str = ""



Q = "qwen2.5-7b-instruct"
H = Headline
HEADLINES: dict[str, tuple[Headline, ...]] = {
    "finding1": (
        H("Qwen2.5-7B hold delivered %, retries on, cancellation off", "retries on, cancellation off",
          "hold_delivered_pct", Q),
        H("Qwen2.5-7B hold delivered %, retries and cancellation on", "retries on, cancellation on",
          "hold_delivered_pct", Q),
        H("recovered with retries on, 2.7 C-hat (all models, either cancellation)", "retries on, cancellation",
          "recovered"),
        H("recovered with retries off (all models)", "retries-off-cancel", "recovered"),
        H("vLLM acceptance ×C, retries on, cancellation off", "retries keep vLLM", "accepted_x"),
        H("vLLM completion ×C, retries on, cancellation off", "retries keep vLLM", "completed_x"),
        H("completion % of C-hat, retries and cancellation on", "with cancellation, completion",
          "completed_pct_of_chat"),
        H("recovered after a 1.5 C-hat pulse despite retries", "retries on, pulse 1.5", "recovered"),
        H("recovered after a 2.7 C-hat pulse with retries (sweep)", "retries on, pulse 2.7", "recovered"),
        H("recovered without retries after every pulse (sweep)", "retries off, pulse", "recovered"),
    ),
    "finding2": (
        H("aborted share of computed prompt tokens %, 8K", "aborted executions hold", "aborted_prompt_share_pct",
          "8192"),
        H("aborted share of computed prompt tokens %, 2K", "aborted executions hold", "aborted_prompt_share_pct",
          "2048"),
        H("in-flight share of aborted work %, 8K", "at 8K", "in_flight_share_pct_8k"),
        H("in-flight share of aborted work %, 2K", "at 8K", "in_flight_share_pct_2k"),
        H("aborted share of step time %, 8K (five rules)", "aborted prompt work", "step_time_aborted_share_pct",
          "8192"),
    ),
    "finding3": (
        H("retry's time left at first step, median s, 8K", "retries are first",
          "retry_time_left_at_first_step_median_s", "8192"),
        H("retry first scheduled after predecessor's abort, median s, 8K", "retries are first",
          "retry_first_scheduled_after_abort_median_s", "8192"),
        H("same, 2K", "retries are first", "retry_first_scheduled_after_abort_median_s", "2048"),
        H("hold delivered %, 8K", "2K steps", "hold_delivered_pct_8k"),
        H("hold delivered %, 2K", "2K steps", "hold_delivered_pct_2k"),
        H("recovered at 2K", "2K steps", "recovered_2k"),
    ),
    "finding4": (
        H("counter's error against its rule %", "the prompt-token counter", "counter_rule_error_pct"),
        H("counter gap %, Qwen2.5-7B", "the counter misses", "counter_gap_pct", Q),
        H("counter gap %, Qwen3-14B", "the counter misses", "counter_gap_pct", "qwen3-14b"),
        H("counter gap %, Llama-3.1-8B", "the counter misses", "counter_gap_pct", "llama"),
    ),
    "finding5": (
        H("retry budget recovered (all models)", "the retry budget", "recovered"),
        H("coalescing recovered (all models)", "coalescing restores", "recovered"),
        H("Qwen2.5-7B pulse delivered %, retry budget", "the retry budget", "pulse_delivered_pct", Q),
        H("Qwen2.5-7B pulse delivered %, no control", "the retry budget", "no_control_pulse_delivered_pct", Q),
        H("Qwen2.5-7B pulse delivered %, coalescing", "coalescing restores", "pulse_delivered_pct", Q),
        H("pulse delivered late under coalescing %", "only coalescing", "pulse_late_pct"),
        H("Qwen2.5-7B primary within 120 s %, coalescing", "coalescing delivers more", "coalescing_primary_timely_pct",
          Q),
        H("Qwen2.5-7B primary within 120 s %, retry budget", "coalescing delivers more", "budget_primary_timely_pct",
          Q),
        H("primary within 120 s %, budget with cancellation", "with cancellation the budget",
          "budget_cancel_on_primary_timely_pct"),
    ),
    "finding6": (
        H("Q = 100 recovered", "vLLM's cap at 100", "recovered"),
        H("Q = 100 pulse delivered %", "vLLM's cap at 100", "pulse_delivered_pct"),
        H("LIFO recovered", "LIFO", "recovered"),
        H("LIFO pulse delivered %", "LIFO", "pulse_delivered_pct"),
        H("no control pulse delivered % (queue-policy block)", "LIFO", "no_control_pulse_delivered_pct"),
        H("proxy cap, arrival order: recovered", "proxy-cap", "recovered"),
        H("deadline check: recovered", "deadline-check", "recovered"),
    ),
    "finding7": (
        H("coalescing, cancellation on: retries attached", "immediate cancellation", "retries_attached"),
        H("coalescing, cancellation on: recovered", "immediate cancellation", "recovered"),
        H("deferred cancellation: retries attached %", "deferred cancellation", "retries_attached_pct"),
        H("deferred cancellation: recovered", "deferred cancellation", "recovered"),
        H("deferred cancellation: pulse delivered %", "deferred cancellation", "pulse_delivered_pct"),
        H("deferred cancellation: executions cancelled", "deferred cancellation", "executions_cancelled"),
    ),
    "section64": (
        H("budget-first retries refused per run", "budget-first", "retries_refused"),
        H("of them with a live execution", "budget-first", "retries_refused_live"),
        H("lookup-first retries refused (all models)", "lookup-first", "retries_refused"),
        H("lookup-first pulse delivered % (all models)", "lookup-first", "pulse_delivered_pct"),
        H("lookup-first gain by 840 s, points, Qwen2.5-7B", "lookup-first", "gain_by_840_points", Q),
    ),
    "section42-2x": (
        H("Qwen2.5-7B recovered", "retries on, pulse 2", "recovered", Q),
        H("Qwen2.5-7B hold delivered %", "retries on, pulse 2", "hold_delivered_pct", Q),
        H("Qwen3-14B recovered", "retries on, pulse 2", "recovered", "qwen3-14b"),
        H("Llama-3.1-8B recovered", "retries on, pulse 2", "recovered", "llama"),
    ),
    "section62-q338": (
        H("Q = 338, cancellation off: recovered", "engine-cap-338:", "recovered"),
        H("Q = 338, cancellation on: recovered", "engine-cap-338-cancel-on", "recovered"),
        H("Q = 338, cancellation on: created ×C", "engine-cap-338-cancel-on", "created_x"),
    ),
}
