"""Join a live run's records into the simulator's run-log schema, so one analysis serves both.

Three clocks meet here: the load generator's (trace seconds since its t0), the proxy's (policy
seconds since its start) and the scrapes' (unix time). All are mapped to trace seconds. The proxy
sees executions as the paper's proxy did, from outside the engine: an execution counts as
accepted when its upstream stream opened and was not refused.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from retrybench.loadgen.loadgen import LoadMeta
from retrybench.records import runlog
from retrybench.records.decisionlog import DecisionEvent, DecisionLogHeader
from retrybench.records.runlog import ExecutionRecord, QueueSamples, RunLog, RunMeta
from retrybench.serving.openai_api import call_digest

__all__ = ["Scrape", "assemble_run_log", "merge_proxy_logs", "resample"]

_FATES: dict[str, runlog.Fate] = {
    "completed": runlog.FATE_COMPLETED, "orphaned": runlog.FATE_ORPHANED, "cancelled": runlog.FATE_CANCELLED,
    "dropped": runlog.FATE_DROPPED, "refused": runlog.FATE_REFUSED, "failed": runlog.FATE_REFUSED,
    "unfinished": runlog.FATE_UNFINISHED}


@dataclass(frozen=True, slots=True)
class Scrape:
    """The gauges and counters read at one moment (unix time)."""

    at_unix: float
    engine_waiting: int
    engine_running: int
    proxy_waiting: int
    prompt_tokens_total: int
    prefix_cache_queries_total: int
    breaker_state: int | None = None  # the proxy's circuit breaker, where it has one (beyond the paper)


def resample(scrapes: Sequence[Scrape], t0_unix: float, time_scale: float, end_s: float) -> QueueSamples:
    """The latest scrape at or before each whole trace second 0, 1, ... < end_s, as the simulator samples."""
    times = [s.at_unix for s in scrapes]
    samples = QueueSamples()
    for second in range(math.ceil(end_s)):
        i = bisect.bisect_right(times, t0_unix + second * time_scale) - 1
        if i < 0:
            i = 0  # before the first scrape the system was idle; the first scrape says so
        s = scrapes[i]
        samples.engine_waiting.append(s.engine_waiting)
        samples.engine_running.append(s.engine_running)
        samples.proxy_waiting.append(s.proxy_waiting)
        samples.prompt_tokens_total.append(s.prompt_tokens_total)
        samples.prefix_cache_queries_total.append(s.prefix_cache_queries_total)
        if s.breaker_state is not None:
            samples.breaker_state.append(s.breaker_state)
    return samples


@dataclass(slots=True)
class _Execution:
    execution_id: int
    call_index: int
    attempt_no: int
    created_s: float
    prompt_tokens: int
    dispatched_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    refused_s: float | None = None
    abort_requested_s: float | None = None
    fate: runlog.Fate = runlog.FATE_QUEUED

    def record(self) -> ExecutionRecord:
        accepted = self.dispatched_s if self.refused_s is None else None
        fate = self.fate
        if fate == runlog.FATE_QUEUED and self.dispatched_s is not None:
            fate = runlog.FATE_UNFINISHED
        return ExecutionRecord(
            execution_id=self.execution_id, call_index=self.call_index, attempt_no=self.attempt_no,
            created_s=self.created_s, accepted_s=accepted, refused_s=self.refused_s,
            first_scheduled_s=None, first_token_s=self.first_token_s, finished_s=self.finished_s,
            abort_requested_s=self.abort_requested_s, aborted_s=None, fate=fate, prompt_tokens=self.prompt_tokens)


def _executions(events: Sequence[DecisionEvent], offset_s: float, call_index: dict[str, int]
                ) -> list[ExecutionRecord]:
    executions: dict[int, _Execution] = {}

    def act(actions: list[list[Any]], t: float) -> None:
        for kind, execution_id in actions:
            execution = executions.get(execution_id)
            if execution is None:
                continue
            if kind == "dispatch":
                execution.dispatched_s = t
            elif kind == "cancel":
                execution.abort_requested_s = t

    for event in events:
        t = event["t"] + offset_s
        kind = event["ev"]
        if kind == "attempt" and event.get("decision") == "create":
            index = call_index.get(event["call_id"], -1)
            attempt = event.get("client_attempt")
            execution = _Execution(event["execution"], index, int(attempt) if attempt is not None else event["attempt"],
                                   t, event["prompt_tokens"])
            if event.get("dispatch"):
                execution.dispatched_s = t
            executions[execution.execution_id] = execution
        elif kind == "engine":
            reported = executions.get(event["execution"])
            if reported is not None:
                if event["kind"] == "first_token":
                    reported.first_token_s = t
                elif event["kind"] == "completed":
                    reported.finished_s = t
                elif event["kind"] == "refused":
                    reported.refused_s = t
            act(event.get("actions", []), t)
        elif kind in ("left", "timer", "expire"):
            act(event.get("actions", []), t)
        elif kind == "end":
            ended = executions.get(event["execution"])
            if ended is not None:
                ended.fate = _FATES.get(event["fate"]) or event["fate"]  # an unknown fate as logged
    return [e.record() for e in sorted(executions.values(), key=lambda e: e.execution_id)]


def merge_proxy_logs(logs: Sequence[tuple[DecisionLogHeader, Sequence[DecisionEvent]]]
                     ) -> tuple[DecisionLogHeader, list[DecisionEvent]]:
    """Several proxy instances' decision logs as one: (the first's header, every event on its clock).

    Each instance numbers its executions from 0, so instance i's execution e becomes e * M + i (M
    instances), in its events and their actions alike; each instance's times are shifted by the
    difference of its start from the first's (policy seconds, as the headers' time scale says)."""
    if not logs:
        raise ValueError("no proxy log to merge")
    first = logs[0][0]
    if len(logs) == 1:
        return first, list(logs[0][1])
    m = len(logs)
    merged: list[DecisionEvent] = []
    for instance, (header, events) in enumerate(logs):
        shift = (float(header["t0_unix"]) - float(first["t0_unix"])) / float(header["time_scale"])
        for event in events:
            moved = {**event, "t": event["t"] + shift, "instance": instance}
            if "execution" in event:
                moved["execution"] = event["execution"] * m + instance
            if "actions" in event:
                moved["actions"] = [[kind, eid * m + instance] for kind, eid in event["actions"]]
            merged.append(moved)
    merged.sort(key=lambda event: event["t"])  # stable: an instance's own order is kept at equal times
    return {**first, "instances": m}, merged


def assemble_run_log(*, load_meta: LoadMeta, calls: list[runlog.CallRecord],
                     attempts: list[runlog.AttemptRecord], call_ids: Sequence[str], proxy_header: DecisionLogHeader,
                     proxy_events: Sequence[DecisionEvent], scrapes: Sequence[Scrape], meta: RunMeta,
                     end_s: float) -> RunLog:
    """The run log of a live run: calls and attempts from the load generator, executions from the
    proxy's decision log, queue samples from the scrapes."""
    scale = float(load_meta["time_scale"])
    t0 = float(load_meta["t0_unix"])
    offset_s = (float(proxy_header["t0_unix"]) - t0) / scale
    index = {call_digest(call_id): i for i, call_id in enumerate(call_ids)}  # the proxy logs digests
    executions = _executions(proxy_events, offset_s, index)
    counters: dict[str, int] = {}
    if scrapes:
        counters = {"prompt_tokens_total": scrapes[-1].prompt_tokens_total,
                    "prefix_cache_queries_total": scrapes[-1].prefix_cache_queries_total}
    return RunLog(meta={**meta, "live": True, "time_scale": scale, "send_lateness": load_meta.get("send_lateness")},
                  calls=calls, attempts=attempts, executions=executions,
                  samples=resample(scrapes, t0, scale, end_s) if scrapes else QueueSamples(), end_s=end_s,
                  counters=counters)
