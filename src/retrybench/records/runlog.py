"""The run log: every call, attempt and execution of one run, plus 1-s samples of the queues.

The simulator writes it, and the live load generator will write the same schema, so that one
analysis (analysis/) computes the paper's metrics from either. Times are seconds since the run's
start (the trace's time zero). `None` means "did not happen".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

__all__ = [
    "AttemptOutcome",
    "AttemptRecord",
    "CallRecord",
    "ExecutionRecord",
    "FailedReason",
    "Fate",
    "QueueSamples",
    "RunLog",
    "RunMeta",
    "implied_refusal_source",
]

# Attempt outcomes, as the client saw them.
AttemptOutcome = Literal["completed", "timed_out", "refused_429", "refused_503", "refused_529", "error"]
COMPLETED: Final = "completed"
TIMED_OUT: Final = "timed_out"
REFUSED_429: Final = "refused_429"
REFUSED_503: Final = "refused_503"
REFUSED_529: Final = "refused_529"  # beyond the paper: "overloaded" (a refusal configured to answer 529)
REFUSED_BY_STATUS: Final[dict[int, AttemptOutcome]] = {429: REFUSED_429, 503: REFUSED_503, 529: REFUSED_529}
ERROR: Final = "error"

# Execution fates (the paper's Section 2 vocabulary, plus what can happen before the engine).
Fate = Literal["completed", "orphaned", "cancelled", "refused", "dropped", "queued", "unfinished"]
FATE_COMPLETED: Final = "completed"  # finished while a subscriber was waiting
FATE_ORPHANED: Final = "orphaned"  # ran on (and maybe finished) with no subscriber left
FATE_CANCELLED: Final = "cancelled"  # aborted by the engine after the proxy closed its stream
FATE_REFUSED: Final = "refused"  # refused by the engine's queue cap (503), never queued
FATE_DROPPED: Final = "dropped"  # dropped from the proxy's queue, never reached the engine
FATE_QUEUED: Final = "queued"  # still in the proxy's queue when the run ended
FATE_UNFINISHED: Final = "unfinished"  # still live with a subscriber when the run ended

def implied_refusal_source(outcome: str, execution_id: int | None) -> str | None:
    """What refused an attempt as the paper's proxy answers: a 429 the retry budget, a 503 the engine when
    the attempt had an execution, else the deadline check; None for any other outcome."""
    if outcome == REFUSED_429:
        return "budget"
    if outcome == REFUSED_503:
        return "engine" if execution_id is not None else "deadline"
    return None


# Why a call was given up.
FailedReason = Literal["attempts_exhausted", "retry_after_too_long", "should_retry_false"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CallRecord:
    index: int
    arrival_s: float  # planned arrival = first attempt sent
    prompt_tokens: int
    response_tokens: int
    attempts: int
    delivered_s: float | None  # complete response received
    failed_s: float | None
    failed_reason: FailedReason | None


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptRecord:
    call_index: int
    attempt_no: int  # 0 = first attempt, 1..R = retries
    sent_s: float
    ended_s: float
    outcome: AttemptOutcome
    execution_id: int | None  # the execution that served it (created or attached)
    first_token_s: float | None = None
    retry_after_s: float | None = None
    attached: bool = False  # joined its call's live execution instead of creating one
    refused_live: bool = False  # refused by the budget while its call still had a live execution
    retained: bool = False  # answered from its call's retained response (result retention)
    # What refused it: "budget", "deadline", "engine" or "breaker"; None where its status says so as in the
    # paper (a 429 the budget, a 503 the deadline check, or the engine when it had an execution).
    refused_by: str | None = None

    @property
    def refusal_source(self) -> str | None:
        """What refused the attempt (None: it was not refused)."""
        if self.refused_by is not None:
            return self.refused_by
        return implied_refusal_source(self.outcome, self.execution_id)


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutionRecord:
    execution_id: int
    call_index: int
    attempt_no: int  # the attempt that created it
    created_s: float  # created at the proxy
    accepted_s: float | None  # queued by the engine
    refused_s: float | None  # refused by the engine (503)
    first_scheduled_s: float | None
    first_token_s: float | None
    finished_s: float | None  # last token produced
    abort_requested_s: float | None  # the proxy closed its upstream stream
    aborted_s: float | None  # the engine applied the abort
    fate: Fate
    prompt_tokens: int = 0
    computed_prompt_tokens: int = 0  # prompt tokens computed, not taken from the prefix cache
    preemptions: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueSamples:
    """Gauges sampled once per second, at t = 0, 1, 2, ... s (as a 1-s Prometheus scrape would)."""

    engine_waiting: list[int] = field(default_factory=list)
    engine_running: list[int] = field(default_factory=list)
    proxy_waiting: list[int] = field(default_factory=list)
    prompt_tokens_total: list[int] = field(default_factory=list)
    prefix_cache_queries_total: list[int] = field(default_factory=list)
    # Beyond the paper, with a circuit breaker only: its state, 0 closed, 1 open, 2 half-open.
    breaker_state: list[int] = field(default_factory=list)


# What a run log says of its run, as JSON. Every run: the phase boundaries the metrics read
# (pulse_start_s, pulse_end_s, hold_end_s, attempt_timeout_s, delivery_horizon_s) and C-hat (chat).
# A run of a spec adds the spec's fields (plan.spec.RunSpec.as_dict), engine_cap and kv_blocks; the
# simulator at a chosen speed engine_speed; a deployment routed (executions per replica); a live run
# live, time_scale, send_lateness (the load generator's), engine_url and stream_interval; a
# calibration's stages only calibration. The keys depend on who ran it, so it stays a JSON object;
# its digest covers every key.
RunMeta = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class RunLog:
    meta: RunMeta
    calls: list[CallRecord]
    attempts: list[AttemptRecord]
    executions: list[ExecutionRecord]
    samples: QueueSamples
    end_s: float
    counters: dict[str, int] = field(default_factory=dict)  # engine counters at the run's end

    def to_json(self) -> str:
        data = asdict(self)
        for attempt in data["attempts"]:
            if not attempt["retained"]:
                del attempt["retained"]  # a run without result retention reads as before it existed
            if attempt["refused_by"] in (None, implied_refusal_source(attempt["outcome"], attempt["execution_id"])):
                del attempt["refused_by"]  # nor does one whose refusals answer as the paper's proxy did
        if not data["samples"]["breaker_state"]:
            del data["samples"]["breaker_state"]  # nor does a run without a circuit breaker
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """sha256 of the canonical JSON: the same spec must give the same digest."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> RunLog:
        data = json.loads(text)
        return cls(
            meta=data["meta"],
            calls=[CallRecord(**c) for c in data["calls"]],
            attempts=[AttemptRecord(**a) for a in data["attempts"]],
            executions=[ExecutionRecord(**e) for e in data["executions"]],
            samples=QueueSamples(**data["samples"]),
            end_s=data["end_s"],
            counters=data.get("counters", {}),
        )
