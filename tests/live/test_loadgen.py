"""The live load generator against a tiny aiohttp upstream told, per attempt, how to answer."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from retrybench.client import RetryingClient
from retrybench.config import ClientPolicy, WorkloadSpec
from retrybench.live.loadgen import LoadgenSettings, LoadResult, run_load, run_loadgen
from retrybench.runlog import COMPLETED, ERROR, REFUSED_429, REFUSED_503, TIMED_OUT
from retrybench.workload import Call, Trace

SPEC = WorkloadSpec(chat_calls_per_s=1.0, prompt_tokens_mean=200.0, prompt_tokens_sd=0.0, shared_prefix_tokens=64)
FAST = ClientPolicy(max_retries=2, attempt_timeout_s=5.0, backoff_min_s=0.1, backoff_max_s=0.1)
_CHUNK = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" t"}]}\n\n'
_DONE = b"data: [DONE]\n\n"
# Wall-clock slack for a busy CI machine; every check below tells apart outcomes at least 0.2 s apart.
SLACK_S = 0.05
_BUSY = {"error": {"message": "busy", "type": "ServiceUnavailableError", "param": None, "code": 503}}


@dataclass
class Upstream:
    """Answers attempt (call id, attempt no) as `plan` says: ok (default), slow:S, hang, 429:MS, 429s:S,
    503, 503sse, drop (connection closed mid-stream), nodone (stream ends without [DONE]), 500."""

    plan: dict[tuple[str, int], str] = field(default_factory=dict)
    chunks: int = 3
    seen: list[tuple[str, int, float, bytes, dict[str, str]]] = field(default_factory=list)  # id, no, unix t
    disconnects: int = 0
    runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0, backlog=4096).start()
        host, port = self.runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        call_id, attempt = request.headers["Idempotency-Key"], int(request.headers["X-Retrybench-Attempt"])
        self.seen.append((call_id, attempt, time.time(), body, dict(request.headers)))
        action = self.plan.get((call_id, attempt), "ok")
        ids = {"X-Retrybench-Execution": str(len(self.seen)), "X-Retrybench-Attached": "1" if attempt else "0"}
        if action.startswith("429"):
            kind, value = action.split(":")
            wait = {"Retry-After-Ms": value, "Retry-After": "7"} if kind == "429" else {"Retry-After": value}
            return web.json_response({"error": {"code": 429}}, status=429, headers={**ids, **wait})
        if action in ("503", "500"):
            return web.json_response(_BUSY, status=int(action), headers=ids)
        if action.startswith("slow:"):
            await asyncio.sleep(float(action[5:]))
        if action == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.disconnects += 1  # the client closed the connection
                raise
        if not json.loads(body)["stream"]:
            return web.json_response({"choices": [{"text": "t" * self.chunks}]}, headers=ids)
        response = web.StreamResponse(headers={**ids, "Content-Type": "text/event-stream"})
        await response.prepare(request)
        if action == "503sse":
            await response.write(b"data: " + json.dumps(_BUSY).encode() + b"\n\n" + _DONE)
            return response
        for _ in range(self.chunks):
            await response.write(_CHUNK)
        if action == "drop":
            assert request.transport is not None
            request.transport.close()
            return response
        if action != "nodone":
            await response.write(_DONE)
        return response


def _trace(arrivals: list[float], prompt_tokens: int = 150, response_tokens: int = 3) -> Trace:
    calls = tuple(Call(index=i, call_id=f"call-0-{i:06d}", arrival_s=t, prompt_tokens=prompt_tokens,
                       response_tokens=response_tokens, phase="base") for i, t in enumerate(arrivals))  # fmt: skip
    return Trace(spec=SPEC, seed=0, calls=calls)


def _run(trace: Trace, upstream: Upstream, **settings: object) -> LoadResult:
    async def main() -> LoadResult:
        target = await upstream.start()
        try:
            result = await run_load(trace, LoadgenSettings(target=target, **{"client": FAST, **settings}))  # type: ignore[arg-type]
            pending = [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "").startswith("_Load.")]
            assert pending == [], "the load generator left tasks behind"
            return result
        finally:
            await upstream.stop()

    result = asyncio.run(main())
    _check_consistent(result)
    return result


def _check_consistent(result: LoadResult) -> None:
    """Every call's attempts count matches its records, numbered 0..n-1, each ended after it was sent."""
    by_call: dict[int, list[int]] = {}
    for a in result.attempts:
        by_call.setdefault(a.call_index, []).append(a.attempt_no)
        assert a.ended_s >= a.sent_s
    for c in result.calls:
        assert sorted(by_call.get(c.index, [])) == list(range(c.attempts))
        assert (c.delivered_s is None) != (c.failed_s is None)
        last = max((a for a in result.attempts if a.call_index == c.index), key=lambda a: a.attempt_no)
        assert (last.outcome == COMPLETED) == (c.delivered_s is not None)


def _attempts(result: LoadResult, index: int) -> list[str]:
    return [a.outcome for a in sorted(result.attempts, key=lambda a: a.attempt_no) if a.call_index == index]


def test_open_loop_sends_on_schedule_while_earlier_calls_are_slow() -> None:
    upstream = Upstream(plan={("call-0-000000", 0): "slow:0.6", ("call-0-000001", 0): "slow:0.4"})
    arrivals = [0.0, 0.05, 0.1, 0.15, 0.2, 0.3]
    result = _run(_trace(arrivals), upstream)
    t0 = result.meta["t0_unix"]
    received = {call_id: t for call_id, no, t, _, _ in upstream.seen if no == 0}
    for call, planned in zip(result.calls, arrivals, strict=True):
        assert abs(received[f"call-0-{call.index:06d}"] - t0 - planned) < SLACK_S
    for a in result.attempts:
        assert a.sent_s - arrivals[a.call_index] == pytest.approx(0, abs=SLACK_S)
    assert all(c.attempts == 1 and c.delivered_s is not None for c in result.calls)
    assert result.calls[2].delivered_s is not None and result.calls[0].delivered_s is not None
    assert result.calls[2].delivered_s < result.calls[0].delivered_s  # it did not wait for call 0
    assert result.meta["send_lateness"]["n"] == len(arrivals)


def test_deadline_closes_the_connection_and_the_client_retries() -> None:
    upstream = Upstream(plan={("call-0-000000", 0): "hang"})
    policy = replace(FAST, attempt_timeout_s=0.3)
    result = _run(_trace([0.0]), upstream, client=policy)
    first, second = sorted(result.attempts, key=lambda a: a.attempt_no)
    assert first.outcome == TIMED_OUT and first.ended_s == pytest.approx(0.3)
    assert upstream.disconnects == 1  # the upstream saw its stream closed
    assert second.outcome == COMPLETED
    assert second.sent_s == pytest.approx(first.ended_s + 0.1, abs=0.005)  # the backoff after the deadline
    assert result.calls[0].delivered_s == second.ended_s


def test_429_retry_is_sent_retry_after_ms_later() -> None:
    upstream = Upstream(plan={("call-0-000000", 0): "429:250"})
    result = _run(_trace([0.0]), upstream)
    first, second = sorted(result.attempts, key=lambda a: a.attempt_no)
    assert first.outcome == REFUSED_429 and first.retry_after_s == 0.25  # ms wins over Retry-After: 7
    assert second.sent_s - first.ended_s == pytest.approx(0.25, abs=SLACK_S)
    assert second.outcome == COMPLETED


def test_time_scale_scales_arrivals_and_retry_after() -> None:
    upstream = Upstream(plan={("call-0-000000", 0): "429s:1"})  # Retry-After: 1 trace second
    result = _run(_trace([0.0, 1.0, 2.0]), upstream, time_scale=0.25)
    t0 = result.meta["t0_unix"]
    received = {(call_id, no): t - t0 for call_id, no, t, _, _ in upstream.seen}
    assert received[("call-0-000001", 0)] == pytest.approx(0.25, abs=SLACK_S)
    assert received[("call-0-000002", 0)] == pytest.approx(0.5, abs=SLACK_S)
    assert received[("call-0-000000", 1)] == pytest.approx(0.25, abs=SLACK_S)  # 1 trace s after the 429
    retry = next(a for a in result.attempts if a.call_index == 0 and a.attempt_no == 1)
    assert retry.sent_s == pytest.approx(1.0, abs=SLACK_S / 0.25)  # records are in trace seconds
    assert result.meta["wall_s"] < 1.0 and result.meta["time_scale"] == 0.25


def test_both_503_forms_are_refused_503() -> None:
    plan = {(f"call-0-{i:06d}", no): form for i, form in enumerate(("503", "503sse")) for no in range(3)}
    result = _run(_trace([0.0, 0.0]), Upstream(plan=plan))
    assert _attempts(result, 0) == [REFUSED_503] * 3
    assert _attempts(result, 1) == [REFUSED_503] * 3
    assert all(c.failed_reason == "attempts_exhausted" for c in result.calls)
    assert all(a.first_token_s is None for a in result.attempts)  # an error event is not a token


def test_broken_streams_and_other_statuses_are_errors() -> None:
    plan = {("call-0-000000", 0): "drop", ("call-0-000001", 0): "nodone", ("call-0-000002", 0): "500"}
    result = _run(_trace([0.0, 0.0, 0.0, 0.0]), Upstream(plan=plan), client=replace(FAST, max_retries=0))
    assert [_attempts(result, i) for i in range(4)] == [[ERROR], [ERROR], [ERROR], [COMPLETED]]
    nodone = next(a for a in result.attempts if a.call_index == 1)
    assert nodone.first_token_s is not None and nodone.first_token_s <= nodone.ended_s


def test_bodies_and_headers_are_identical_across_attempts() -> None:
    plan = {("call-0-000001", 0): "503", ("call-0-000001", 1): "429:10"}
    trace = _trace([0.0, 0.01], prompt_tokens=180, response_tokens=5)
    upstream = Upstream(plan=plan)
    result = _run(trace, upstream, api_key="k-1")
    bodies = [body for call_id, _, _, body, _ in upstream.seen if call_id == "call-0-000001"]
    assert len(bodies) == 3 and len(set(bodies)) == 1
    assert json.loads(bodies[0]) == {"model": "retrybench", "prompt": trace.prompt_token_ids(1), "max_tokens": 5,
                                     "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    headers = [(h["Authorization"], h["X-Retrybench-Attempt"], h["Content-Type"])
               for call_id, _, _, _, h in upstream.seen if call_id == "call-0-000001"]  # fmt: skip
    assert headers == [("Bearer k-1", str(n), "application/json") for n in range(3)]
    retries = sorted((a for a in result.attempts if a.call_index == 1), key=lambda a: a.attempt_no)
    assert [a.attached for a in retries] == [False, True, True]
    assert all(a.execution_id is not None and a.execution_id > 0 for a in retries)


def test_non_stream_mode_completes_on_a_json_body() -> None:
    upstream = Upstream()
    result = _run(_trace([0.0, 0.02]), upstream, stream=False, max_calls=1)
    assert len(result.calls) == 1 and _attempts(result, 0) == [COMPLETED]
    body = json.loads(upstream.seen[0][3])
    assert body["stream"] is False and "stream_options" not in body


def test_same_outcomes_give_the_simulators_attempts() -> None:
    """Seeded like the simulator, the retry send times follow the same draws."""
    policy = ClientPolicy(max_retries=2, attempt_timeout_s=5.0, backoff_min_s=0.05, backoff_max_s=0.3)
    plan = {("call-0-000000", n): "503" for n in range(2)}
    result = _run(_trace([0.0]), Upstream(plan=plan), client=policy, seed=7)
    attempts = sorted(result.attempts, key=lambda a: a.attempt_no)
    rng = np.random.default_rng([7, 10])
    for before, after in itertools.pairwise(attempts):
        assert after.sent_s - before.ended_s == pytest.approx(rng.uniform(0.05, 0.3), abs=0.005)


def test_progress_is_logged(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("retrybench.live.loadgen._PROGRESS_S", 0.1)
    with caplog.at_level(logging.INFO, logger="retrybench.live.loadgen"):
        _run(_trace([0.0, 0.35]), Upstream())
    lines = [r.getMessage() for r in caplog.records if "calls started" in r.getMessage()]
    assert len(lines) >= 2 and "send lateness p99" in lines[0]


@contextmanager
def _upstream_process(chunks: int = 3) -> Iterator[str]:
    """The upstream in its own process, so that its work does not share the load generator's loop or GIL."""
    proc = subprocess.Popen([sys.executable, __file__, str(chunks)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_run_loadgen_writes_the_result_atomically(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    with _upstream_process() as target:
        result = run_loadgen(_trace([0.0, 0.01, 0.02]), LoadgenSettings(target=target, client=FAST), out)
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary file left behind
    assert LoadResult.from_json(out.read_text()) == result
    assert result.meta["interrupted"] is False and len(result.attempts) == 3


def test_a_crashed_run_still_writes_what_it_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(RetryingClient, "on_outcome", broken)
    out = tmp_path / "run.json"
    with _upstream_process() as target, pytest.raises(RuntimeError, match="boom"):
        run_loadgen(_trace([0.0, 5.0]), LoadgenSettings(target=target, client=FAST), out)
    saved = LoadResult.from_json(out.read_text())
    assert saved.meta["interrupted"] is True
    assert [c.attempts for c in saved.calls] == [1, 0] and len(saved.attempts) == 1


async def _serve(chunks: int) -> None:
    target = await Upstream(chunks=chunks).start()
    print(target, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1])))
