"""One run spec on the simulated engine at a known C-hat -> its run log and its summary.

No cache and no calibration here: the caller resolves C-hat first (runs/plan.py), so that a run is a
pure function of its spec and C-hat, the same in this process, a pool's worker or a Ray cluster's.
The summary's shape is shared with live runs (`run_summary`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from retrybench.analysis import section5, summarize
from retrybench.analysis.delivery import delivered_per_window, waiting_total
from retrybench.conditions.config import ConfigError
from retrybench.engine.profiles import profile_for
from retrybench.plan.recorded import trace_for
from retrybench.plan.spec import RunSpec, condition_for, engine_config_for
from retrybench.plan.stack_spec import client_stack_for
from retrybench.records.cache import code_version
from retrybench.records.results import HostCosts, LiveFields, PromptWork, RunSummary, Series, SpecFields, StackSummary
from retrybench.records.runlog import RunLog
from retrybench.records.tracefile import write_trace
from retrybench.sim.deployment import simulate_deployment
from retrybench.sim.replica_runs import deployment_of, replica_profiles
from retrybench.sim.run import simulate
from retrybench.sim.speed import at_speed

__all__ = ["SERIES_STEP_S", "TracedRun", "run_summary", "run_traced", "series", "simulate_spec", "summarize_spec"]

SERIES_STEP_S = 10  # one waiting-queue sample kept per this many seconds (Figure 1(b))
TraceEvents = list[dict[str, Any]]  # the engine trace's events (records/tracefile.py)


def simulate_spec(spec: RunSpec, chat: float, trace: TraceEvents | None = None) -> RunLog:
    """The run log of one spec at C-hat `chat` on the simulated engine (on its deployment, when it has
    several replicas or proxy instances), each engine at the spec's speed; the engine's events appended
    to `trace` when given."""
    condition = condition_for(spec)
    engine, cap = engine_config_for(spec, condition, chat)
    profile = at_speed(profile_for(spec.model, spec.gpu, engine, step_model=spec.step_model), spec.engine_speed)
    trace_of_calls = trace_for(spec, chat)
    workload, calls = trace_of_calls.spec, trace_of_calls.calls
    meta = {
        **spec.as_dict(), "chat": chat, "pulse_start_s": workload.pulse_start_s,
        "pulse_end_s": workload.pulse_end_s, "hold_end_s": workload.hold_end_s,
        "attempt_timeout_s": condition.client.attempt_timeout_s, "delivery_horizon_s": 840.0,
        "engine_cap": cap, "kv_blocks": profile.kv_blocks,
    }
    if profile.host_costs_from not in (None, spec.gpu):
        meta["host_costs_from"] = profile.host_costs_from
    stack = client_stack_for(spec)
    if stack is not None and spec.deployed:
        raise ConfigError("a stacked client profile runs on one engine behind one proxy, not on a deployment")
    if spec.deployed:
        if condition.breaker is not None:
            raise ConfigError(f"{spec.condition}: a [breaker] runs in front of one proxy, not a deployment")
        cap_given = spec.engine_cap if spec.engine_cap is not None else condition.engine_cap
        return simulate_deployment(replica_profiles(spec, cap_given), calls, client=condition.client,
                                   proxy=condition.proxy, seed=spec.seed, meta=meta, deployment=deployment_of(spec),
                                   prefix_tokens=workload.shared_prefix_tokens, trace=trace)
    return simulate(profile, calls, client=condition.client, proxy=condition.proxy, seed=spec.seed,
                    meta=meta, prefix_tokens=workload.shared_prefix_tokens, trace=trace, stack=stack,
                    breaker=condition.breaker)


def series(log: RunLog) -> Series:
    """Figure 1's time series: calls delivered per 60 s, and executions waiting in the proxy plus the
    engine every SERIES_STEP_S seconds (the 1-s sample at each multiple), both from the run's start."""
    waiting = waiting_total(log)[::SERIES_STEP_S]
    return Series(delivered_per_60s=[n for _, n in delivered_per_window(log, 60.0)],
                  waiting_step_s=SERIES_STEP_S, waiting=[int(w) for w in waiting])


def stack_summary(log: RunLog) -> StackSummary:
    """A stacked client's per-layer attempts (the run log's meta), for a run that had one."""
    stack = log.meta.get("stack")
    return StackSummary(stack=cast(Any, stack)) if stack is not None else StackSummary()


def run_summary(spec: RunSpec, chat: float, log: RunLog, started: float,
                events: TraceEvents | None = None, live: LiveFields | None = None) -> RunSummary:
    """A run's summary (the paper's Section 3.2 metrics) from its log, simulated or live, in one shape;
    with the engine trace's `events`, also where the prompt work went (Section 5); with `live`, where a
    live run ran. `wall_s` counts from `started` (time.perf_counter) to the summary's end."""
    given = cast(SpecFields, spec.as_dict())  # as given; the top-level engine_cap is the resolved one
    resolved: SpecFields = {**given, "engine_cap": log.meta["engine_cap"]}
    traced = section5.trace_summary(events, log) if events is not None else PromptWork()
    host = HostCosts(host_costs_from=str(log.meta["host_costs_from"])) if "host_costs_from" in log.meta else HostCosts()
    summary: RunSummary = {**resolved, "chat": round(chat, 4), **summarize(log), **section5.timing_and_counters(log),
                           **traced, **(live or LiveFields()), **host, **stack_summary(log), "spec": given,
                           "series": series(log),
                           "wall_s": round(time.perf_counter() - started, 3), "code_version": code_version()}
    return summary


def summarize_spec(spec: RunSpec, chat: float) -> RunSummary:
    """The summary of one run computed afresh at C-hat `chat` (its engine trace read when the spec is
    traced), touching no cache: what any worker computes, for the caller to store."""
    started = time.perf_counter()
    events: TraceEvents | None = [] if spec.trace else None
    log = simulate_spec(spec, chat, trace=events)
    return run_summary(spec, chat, log, started, events)


@dataclass(frozen=True)
class TracedRun:
    """A traced run computed afresh: its summary, and where its engine trace and run log were written."""

    summary: RunSummary
    trace: Path
    run_log: Path

    def record(self) -> dict[str, object]:
        """What `retrybench run --trace FILE --json` prints: the summary, with the trace's path in place of
        its `trace` flag, and the run log's path."""
        return {**self.summary, "trace": str(self.trace), "run_log": str(self.run_log)}


def run_traced(spec: RunSpec, chat: float, trace_path: Path) -> TracedRun:
    """One run computed afresh at C-hat `chat`, its engine trace written to `trace_path` (JSONL) and its run
    log beside it (.runlog.json)."""
    started = time.perf_counter()
    events: TraceEvents = []
    log = simulate_spec(spec, chat, trace=events)
    write_trace(trace_path, events, {"spec": log.meta})
    runlog_path = trace_path.with_suffix(".runlog.json")
    runlog_path.write_text(log.to_json())
    return TracedRun(run_summary(spec, chat, log, started, events), trace_path, runlog_path)
