"""A small builder of hand-made RunLogs, so each test states only the records it is about."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from retrybench.runlog import (
    COMPLETED,
    FATE_COMPLETED,
    AttemptRecord,
    CallRecord,
    ExecutionRecord,
    QueueSamples,
    RunLog,
)

# The paper's protocol (values.toml [protocol]), with C-hat of Qwen2.5-7B-Instruct.
PAPER_META: dict[str, Any] = {
    "chat": 2.78,
    "pulse_start_s": 120.0,
    "pulse_end_s": 227.0,
    "hold_end_s": 947.0,
    "attempt_timeout_s": 120.0,
    "delivery_horizon_s": 840.0,
}


class LogBuilder:
    """Accumulates calls, attempts, executions and queue samples, then freezes them into a RunLog."""

    def __init__(self, **meta: Any) -> None:
        self.meta = {**PAPER_META, **meta}
        self.calls: list[CallRecord] = []
        self.attempts: list[AttemptRecord] = []
        self.executions: list[ExecutionRecord] = []
        self.engine_waiting: list[int] = [0] * 1800
        self.proxy_waiting: list[int] = [0] * 1800
        self.end_s = 1787.0

    def call(self, arrival_s: float, took_s: float | None = None, *, failed: bool = False) -> LogBuilder:
        """A call planned at arrival_s, delivered took_s later (None: never delivered)."""
        self.calls.append(
            CallRecord(
                index=len(self.calls),
                arrival_s=arrival_s,
                prompt_tokens=12000,
                response_tokens=300,
                attempts=1,
                delivered_s=None if took_s is None else arrival_s + took_s,
                failed_s=arrival_s + 840.0 if failed else None,
                failed_reason="attempts_exhausted" if failed else None,
            )
        )
        return self

    def calls_at(self, arrivals: Sequence[float], took_s: float | None) -> LogBuilder:
        for arrival in arrivals:
            self.call(arrival, took_s)
        return self

    def attempt(self, sent_s: float, attempt_no: int = 0) -> LogBuilder:
        self.attempts.append(
            AttemptRecord(
                call_index=0,
                attempt_no=attempt_no,
                sent_s=sent_s,
                ended_s=sent_s + 1.0,
                outcome=COMPLETED,
                execution_id=None,
            )
        )
        return self

    def execution(
        self,
        created_s: float,
        *,
        attempt_no: int = 0,
        accepted_s: float | None = None,
        refused_s: float | None = None,
        finished_s: float | None = None,
        fate: str = FATE_COMPLETED,
    ) -> LogBuilder:
        self.executions.append(
            ExecutionRecord(
                execution_id=len(self.executions),
                call_index=0,
                attempt_no=attempt_no,
                created_s=created_s,
                accepted_s=accepted_s,
                refused_s=refused_s,
                first_scheduled_s=None,
                first_token_s=None,
                finished_s=finished_s,
                abort_requested_s=None,
                aborted_s=None,
                fate=fate,
            )
        )
        return self

    def engine_queue(self, start_s: int, values: Sequence[int]) -> LogBuilder:
        """Set engine_waiting[t] for t = start_s, start_s + 1, ..."""
        self.engine_waiting[start_s : start_s + len(values)] = list(values)
        return self

    def proxy_queue(self, start_s: int, values: Sequence[int]) -> LogBuilder:
        self.proxy_waiting[start_s : start_s + len(values)] = list(values)
        return self

    def build(self) -> RunLog:
        return RunLog(
            meta=dict(self.meta),
            calls=list(self.calls),
            attempts=list(self.attempts),
            executions=list(self.executions),
            samples=QueueSamples(
                engine_waiting=list(self.engine_waiting),
                proxy_waiting=list(self.proxy_waiting),
            ),
            end_s=self.end_s,
        )


@pytest.fixture
def builder() -> LogBuilder:
    """A fresh builder on the paper's protocol, with empty queues over a 1,800-s run."""
    return LogBuilder()
