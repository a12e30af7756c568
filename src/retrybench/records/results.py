"""The shape of a run's result: one typed, read-only record that analysis produces and the claims, the
report, the command line and the tests read.

A result stays a plain dict at run time (it is cached as JSON, sent between pytest-xdist workers and
printed by `retrybench run --json` with these very keys), but its keys and value types are declared
here, so a mistyped key is a type error, not a KeyError after an hour of runs.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from typing_extensions import ReadOnly, TypeIs

__all__ = ["FailedRun", "HostCosts", "LiveFields", "Metrics", "PromptWork", "Result", "RetryTiming", "RunSummary",
           "Series", "SpecFields", "StackFields", "StackSummary", "is_failed"]


class SpecFields(TypedDict):
    """The run's spec (spec.RunSpec's fields); `engine_cap` is the resolved cap in a summary."""

    model: ReadOnly[str]
    condition: ReadOnly[str]
    seed: ReadOnly[int]
    gpu: ReadOnly[str]
    pulse_x: ReadOnly[float]
    max_batched_tokens: ReadOnly[int]
    mixed_prompts: ReadOnly[bool]
    engine_cap: ReadOnly[int | None]
    trace: ReadOnly[bool]
    token_scale: ReadOnly[float]
    # The deployment (spec.DEPLOYMENT_DEFAULTS), present only where it is not one engine behind one proxy.
    replicas: NotRequired[ReadOnly[int]]
    replica_gpus: NotRequired[ReadOnly[str]]
    router: NotRequired[ReadOnly[str]]
    proxies: NotRequired[ReadOnly[int]]
    proxy_state: NotRequired[ReadOnly[str]]
    front: NotRequired[ReadOnly[str]]
    step_model: NotRequired[ReadOnly[str]]  # how the engine priced a step, where not the GPU's default
    # A recorded workload (spec.WORKLOAD_DEFAULTS), present only where the run replays one.
    workload_file: NotRequired[ReadOnly[str]]
    workload_digest: NotRequired[ReadOnly[str]]
    workload_format: NotRequired[ReadOnly[str]]
    rate_x: NotRequired[ReadOnly[float]]
    pulses: NotRequired[ReadOnly[list[list[float]]]]
    gpu_memory_utilization: NotRequired[ReadOnly[float]]  # present only where not vLLM's default (0.90)
    engine_speed: NotRequired[ReadOnly[float]]  # present only where the engine is not the calibrated one's speed


class Metrics(TypedDict):
    """Section 3.2's metrics of one run log (analysis.summarize): recovery, cohort delivery, rates, and
    the raw counts they come from, with what the overload controls did."""

    recovered: ReadOnly[bool]
    recovery_s: ReadOnly[float | None]
    primary_delivered_pct: ReadOnly[float | None]
    primary_timely_pct: ReadOnly[float | None]
    pulse_delivered_pct: ReadOnly[float | None]
    pulse_timely_pct: ReadOnly[float | None]
    hold_delivered_pct: ReadOnly[float | None]
    hold_timely_pct: ReadOnly[float | None]
    created_x: ReadOnly[float | None]
    accepted_x: ReadOnly[float | None]
    completed_x: ReadOnly[float | None]
    retry_share_pct: ReadOnly[float | None]
    mean_waiting: ReadOnly[float | None]
    littles_law_waiting: ReadOnly[float | None]
    mean_waiting_pct_of_littles_law: ReadOnly[float | None]
    attempts: ReadOnly[int]
    retries: ReadOnly[int]
    executions_created: ReadOnly[int]
    executions_accepted: ReadOnly[int]
    executions_refused: ReadOnly[int]
    executions_cancelled: ReadOnly[int]
    calls: ReadOnly[int]
    calls_delivered: ReadOnly[int]
    calls_failed: ReadOnly[int]
    retries_refused: ReadOnly[int]
    retries_refused_live: ReadOnly[int]
    retries_attached: ReadOnly[int]
    retries_attached_pct: ReadOnly[float | None]
    attempts_refused_deadline: ReadOnly[int]
    executions_dropped: ReadOnly[int]
    engine_refused: ReadOnly[int]
    gave_up_retry_after: ReadOnly[int]
    attempts_served_retained: NotRequired[int]  # answered from a retained response (result retention only)
    attempts_refused_breaker: NotRequired[int]  # answered by a circuit breaker (with one only)
    drain_to_full_service_s: NotRequired[int | None]  # with a circuit breaker only (analysis/breaker.py)
    breaker_not_closed_s: NotRequired[int]  # seconds its breaker was open or half-open


class RetryTiming(TypedDict):
    """Section 5.2's retry timing and 5.3's counter check, from the run log (analysis.section5)."""

    retries_never_scheduled_pct: ReadOnly[float | None]
    retry_first_scheduled_after_abort_median_s: ReadOnly[float | None]
    retry_time_left_at_first_step_median_s: ReadOnly[float | None]
    retry_time_left_at_first_step_p90_s: ReadOnly[float | None]
    abort_after_first_step_median_s: ReadOnly[float | None]
    counter_rule_error_pct: ReadOnly[float | None]
    counter_gap_pct: ReadOnly[float | None]


class PromptWork(TypedDict, total=False):
    """Section 5.1's attribution of prompt work and step time, from the engine trace: only traced runs
    have these keys."""

    aborted_prompt_share_pct: ReadOnly[float | None]
    in_flight_share_pct: ReadOnly[float | None]
    missed_share_pct: ReadOnly[float | None]
    missed_share_last240_pct: ReadOnly[float | None]
    aborted_unscheduled: ReadOnly[int]
    preempted_execution_prompt_tokens: ReadOnly[int]
    step_time_aborted_share_pct: ReadOnly[list[float | None]]  # [lowest, highest] over the rules
    step_time_aborted_share_by_rule_pct: ReadOnly[dict[str, float | None]]


class Series(TypedDict):
    """Figure 1's time series."""

    delivered_per_60s: ReadOnly[list[int]]
    waiting_step_s: ReadOnly[int]
    waiting: ReadOnly[list[int]]


class HostCosts(TypedDict, total=False):
    """The GPU whose fitted host costs the engine's steps add, present only where it is not the run's own
    GPU (one without a fit of its own reads the H100's: engine.profiles.kernel_host_costs)."""

    host_costs_from: ReadOnly[str]


class LiveFields(TypedDict, total=False):
    """Where a live run ran: only live runs have these keys."""

    engine: ReadOnly[str]
    workdir: ReadOnly[str]


class StackFields(TypedDict):
    """What each layer of a stacked client did (docs/stacks.md), outermost first: its name, its timeout kind,
    its attempts over the run's calls and the most it made for one call."""

    layers: ReadOnly[list[str]]
    timeout_kinds: ReadOnly[list[str]]
    attempts: ReadOnly[list[int]]
    max_attempts: ReadOnly[list[int]]


class StackSummary(TypedDict, total=False):
    """Only a run with a stacked client has this key."""

    stack: ReadOnly[StackFields]


class RunSummary(SpecFields, Metrics, RetryTiming, PromptWork, LiveFields, HostCosts, StackSummary):
    """One run's result: its spec (top-level engine_cap resolved; `spec` as given), C-hat, the metrics."""

    chat: ReadOnly[float]
    spec: ReadOnly[SpecFields]
    series: ReadOnly[Series]
    wall_s: ReadOnly[float]
    code_version: ReadOnly[str]



class FailedRun(SpecFields):
    """A run that raised: its spec and the error; reported, never dropped."""

    error: ReadOnly[str]


Result = RunSummary | FailedRun

def is_failed(result: Result) -> TypeIs[FailedRun]:
    """Whether this result is a failed run's record."""
    return "error" in result
