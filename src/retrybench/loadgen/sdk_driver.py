"""Replay a trace open-loop through the official `openai` SDK, which retries on its own.

The built-in load generator (loadgen.py) decides every retry with the project's client model; this
driver hands each call to `AsyncOpenAI.completions.create` instead, so the retries are the SDK's own
code: its timeout, backoff, jitter and Retry-After handling. The policy gives only what a user would
set: the timeout and the retry count. Attempts are read from the wire with httpx event hooks (the
SDK marks each with `x-stainless-retry-count`), so the result is the same run-log record as the
built-in generator's and the same analysis reads it.

Runs in real time only: the SDK sleeps its backoff on the wall clock, which a time scale cannot
stretch. Each call sends its trace call id as `Idempotency-Key` (the SDK sends none by default), so
the proxy can tell a call's attempts apart.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrybench.conditions.config import ClientPolicy
from retrybench.loadgen.loadgen import AttemptInFlight, LoadMeta, LoadResult, note_proxy_headers, retry_after_s
from retrybench.records.atomicfile import write_atomic
from retrybench.records.runlog import (
    COMPLETED,
    ERROR,
    REFUSED_429,
    REFUSED_503,
    REFUSED_529,
    TIMED_OUT,
    AttemptOutcome,
    AttemptRecord,
    CallRecord,
)
from retrybench.traffic.workload import Trace

__all__ = ["MissingSdk", "SdkLoadSettings", "run_sdk_load", "run_sdk_loadgen"]

RETRY_COUNT = "x-stainless-retry-count"
CALL_ID = "idempotency-key"


class MissingSdk(RuntimeError):
    """The openai package is not installed."""


@dataclass(frozen=True, kw_only=True)
class SdkLoadSettings:
    target: str  # base URL (proxy or engine)
    client: ClientPolicy  # attempt_timeout_s and max_retries are given to the SDK; it decides the rest
    api_key: str = "retrybench"
    max_calls: int | None = None
    extra_body: dict[str, Any] | None = None  # more request fields (a test upstream's knobs)


def _outcome(status: int) -> AttemptOutcome:
    if status == 529:  # beyond the paper: "overloaded"
        return REFUSED_529
    return COMPLETED if status == 200 else REFUSED_429 if status == 429 else REFUSED_503 if status == 503 else ERROR


class _SdkLoad:
    def __init__(self, trace: Trace, settings: SdkLoadSettings) -> None:
        self.trace = trace
        self.settings = settings
        self.calls = trace.calls if settings.max_calls is None else trace.calls[: settings.max_calls]
        self.index = {call.call_id: i for i, call in enumerate(self.calls)}
        self.attempts: dict[tuple[int, int], AttemptInFlight] = {}
        self.delivered: dict[int, float] = {}
        self.failed: dict[int, float] = {}
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def on_request(self, request: Any) -> None:
        """Every attempt the SDK sends, as it goes out."""
        index = self.index.get(request.headers.get(CALL_ID, ""))
        if index is not None:
            number = int(request.headers.get(RETRY_COUNT, "0"))
            self.attempts[(index, number)] = AttemptInFlight(index, number, self.now())

    async def on_response(self, response: Any) -> None:
        """Its response head; an attempt with none timed out (or lost its connection)."""
        headers = response.request.headers
        index = self.index.get(headers.get(CALL_ID, ""))
        record = self.attempts.get((index, int(headers.get(RETRY_COUNT, "0")))) if index is not None else None
        if record is None:
            return
        record.ended_s = self.now()
        record.outcome = _outcome(response.status_code)
        record.retry_after_s = retry_after_s(response.headers)
        note_proxy_headers(record, response.headers)

    async def one_call(self, client: Any, index: int) -> None:
        call = self.calls[index]
        await asyncio.sleep(max(call.arrival_s - self.now(), 0.0))
        try:
            await client.completions.create(
                model="retrybench", prompt=self.trace.prompt_token_ids(index), max_tokens=call.response_tokens,
                extra_body={"ignore_eos": True, **(self.settings.extra_body or {})},
                extra_headers={"Idempotency-Key": call.call_id})
        except Exception:  # the SDK gave the call up (its retries spent, or a status it does not retry)
            self.failed[index] = self.now()
        else:
            self.delivered[index] = self.now()

    async def run(self) -> LoadResult:
        try:
            import openai
        except ImportError as error:
            raise MissingSdk("the openai-sdk driver needs the openai package: pip install openai") from error

        policy = self.settings.client
        http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [self.on_request],
                                                           "response": [self.on_response]})
        client = openai.AsyncOpenAI(base_url=self.settings.target.rstrip("/") + "/v1", api_key=self.settings.api_key,
                                    timeout=policy.attempt_timeout_s, max_retries=policy.max_retries,
                                    http_client=http)
        self.t0 = time.monotonic()
        try:
            await asyncio.gather(*(self.one_call(client, i) for i in range(len(self.calls))))
        finally:
            await client.close()
        return self.result(policy)

    def result(self, policy: ClientPolicy) -> LoadResult:
        attempts = []
        for (index, number), a in sorted(self.attempts.items()):
            ended = a.ended_s
            outcome = a.outcome
            if outcome is None:  # no response head: the SDK's timeout ended it
                outcome, ended = TIMED_OUT, a.sent_s + policy.attempt_timeout_s
            elif outcome == COMPLETED and index in self.delivered:
                ended = self.delivered[index]  # the whole response, not its head
            attempts.append(AttemptRecord(call_index=index, attempt_no=number, sent_s=a.sent_s,
                                          ended_s=ended if ended is not None else a.sent_s, outcome=outcome,
                                          execution_id=a.execution_id, retry_after_s=a.retry_after_s,
                                          attached=a.attached, retained=a.retained))
        calls = [CallRecord(index=i, arrival_s=c.arrival_s, prompt_tokens=c.prompt_tokens,
                            response_tokens=c.response_tokens,
                            attempts=sum(1 for (index, _) in self.attempts if index == i),
                            delivered_s=self.delivered.get(i), failed_s=self.failed.get(i),
                            failed_reason="attempts_exhausted" if i in self.failed else None)
                 for i, c in enumerate(self.calls)]
        meta: LoadMeta = {"driver": "openai-sdk", "target": self.settings.target, "time_scale": 1.0,
                "client": {"attempt_timeout_s": policy.attempt_timeout_s, "max_retries": policy.max_retries},
                "interrupted": False}
        return LoadResult(meta=meta, calls=calls, attempts=attempts)


async def run_sdk_load(trace: Trace, settings: SdkLoadSettings) -> LoadResult:
    """Replay `trace` against settings.target through the openai SDK, in real time."""
    return await _SdkLoad(trace, settings).run()


def run_sdk_loadgen(trace: Trace, settings: SdkLoadSettings, out: Path | None) -> LoadResult:
    """run_sdk_load; writes `out` atomically."""
    result = asyncio.run(run_sdk_load(trace, settings))
    if out is not None:
        write_atomic(out, result.to_json())
    return result
