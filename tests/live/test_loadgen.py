"""The live load generator against a tiny aiohttp upstream told, per attempt, how to answer.

Send times are checked against the load generator's own measure of its lateness in the same run:
an attempt due at time T is sent at T plus at most the run's largest send lateness, and never
before T. So a check tells a wrong schedule from a right one (the differences are tenths of a second
or more) without assuming how fast this machine is today; the lateness itself is the benchmark's
business (benchmarks/perf/test_loadgen_lateness.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
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
from fixtures.waiting import GENEROUS_S, until

from retrybench.conditions.config import ClientPolicy, WorkloadSpec
from retrybench.loadgen.loadgen import LoadgenSettings, LoadResult, run_load, run_loadgen
from retrybench.records.runlog import COMPLETED, ERROR, REFUSED_429, REFUSED_503, TIMED_OUT
from retrybench.serving.app import new_app, start_app
from retrybench.traffic.client import RetryingClient
from retrybench.traffic.workload import Call, Trace

SPEC = WorkloadSpec(chat_calls_per_s=1.0, prompt_tokens_mean=200.0, prompt_tokens_sd=0.0, shared_prefix_tokens=64)
FAST = ClientPolicy(max_retries=2, attempt_timeout_s=5.0, backoff_min_s=0.1, backoff_max_s=0.1)
_CHUNK = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" t"}]}\n\n'
_DONE = b"data: [DONE]\n\n"
_BUSY = {"error": {"message": "busy", "type": "ServiceUnavailableError", "param": None, "code": 503}}


@dataclass
class Upstream:
    """Answers attempt (call id, attempt no) as `plan` says: ok (default), slow:S, hang, 429:MS, 429s:S,
    503, 503sse, drop (connection closed mid-stream), nodone (stream ends without [DONE]), 500."""

    plan: dict[tuple[str, int], str] = field(default_factory=dict)
    chunks: int = 3
    seen: list[tuple[str, int, float, bytes, dict[str, str]]] = field(default_factory=list)  # id, no, unix t
    disconnects: int = 0
    active: int = 0  # handlers running
    runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = new_app([web.post("/v1/completions", self.handle)], client_max_size=1 << 20)
        self.runner, port = await start_app(app, "127.0.0.1", 0)
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.active += 1
        try:
            return await self._handle(request)
        finally:
            self.active -= 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
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
            await until(lambda: upstream.active == 0, "the upstream's handlers to end (a closed connection "
                         "cancels its handler)", seen=lambda: f"{upstream.active} running")
            return result
        finally:
            await upstream.stop()

    result = asyncio.run(main())
    _check_consistent(result)
    return result


def _late_s(result: LoadResult) -> float:
    """The run's largest send lateness, in trace seconds."""
    return float(result.meta["send_lateness"]["max_ms"]) / 1e3 / float(result.meta["time_scale"])


def _sent_on_time(result: LoadResult, sent_s: float, due_s: float, what: str) -> None:
    """Sent at its due time or after it, by no more than the run's largest send lateness."""
    late = _late_s(result)
    assert 0 <= sent_s - due_s <= late + 1e-9, (
        f"{what}: sent at {sent_s:.4f} s, due at {due_s:.4f} s; the run's largest send lateness was {late:.4f} s")


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
    """Calls 0 and 1 take 2 s and 1.5 s to answer; the others are sent on schedule all the same, and
    answered first."""
    upstream = Upstream(plan={("call-0-000000", 0): "slow:2.0", ("call-0-000001", 0): "slow:1.5"})
    arrivals = [0.0, 0.05, 0.1, 0.15, 0.2, 0.3]
    result = _run(_trace(arrivals), upstream)
    for a in result.attempts:
        _sent_on_time(result, a.sent_s, arrivals[a.call_index], f"call {a.call_index}")
    late = _late_s(result)
    assert late < 1.0, f"a send was {late:.3f} s late: held up by the slow calls (1.5 s and 2 s)?"
    assert sorted(call_id for call_id, _, _, _, _ in upstream.seen) == [f"call-0-{i:06d}" for i in range(6)]
    assert all(c.attempts == 1 and c.delivered_s is not None for c in result.calls)
    delivered = [c.delivered_s or 0.0 for c in result.calls]  # every one is set: asserted above
    assert max(delivered[2:]) < min(delivered[:2]), delivered  # they did not wait for calls 0 and 1
    assert result.meta["send_lateness"]["n"] == len(arrivals)


def test_deadline_closes_the_connection_and_the_client_retries() -> None:
    upstream = Upstream(plan={("call-0-000000", 0): "hang"})
    policy = replace(FAST, attempt_timeout_s=0.3)
    result = _run(_trace([0.0]), upstream, client=policy)
    first, second = sorted(result.attempts, key=lambda a: a.attempt_no)
    assert first.outcome == TIMED_OUT and first.ended_s == pytest.approx(0.3)  # recorded at the deadline
    assert upstream.disconnects == 1  # the upstream saw its stream closed
    assert second.outcome == COMPLETED
    _sent_on_time(result, second.sent_s, first.ended_s + 0.1, "the retry, 0.1 s of backoff after the deadline")
    assert result.calls[0].delivered_s == second.ended_s


def test_429_retry_is_sent_retry_after_ms_later() -> None:
    upstream = Upstream(plan={("call-0-000000", 0): "429:250"})
    result = _run(_trace([0.0]), upstream)
    first, second = sorted(result.attempts, key=lambda a: a.attempt_no)
    assert first.outcome == REFUSED_429 and first.retry_after_s == 0.25  # ms wins over Retry-After: 7
    _sent_on_time(result, second.sent_s, first.ended_s + 0.25, "the retry, Retry-After-Ms 250 after the 429")
    assert second.outcome == COMPLETED


def test_time_scale_scales_arrivals_and_retry_after() -> None:
    """At time scale 0.25 the schedule (arrivals at 0, 1 and 2 trace s; a retry 1 trace s after a 429)
    takes 0.5 s of wall time, and the records are in trace seconds."""
    upstream = Upstream(plan={("call-0-000000", 0): "429s:1"})  # Retry-After: 1 trace second
    result = _run(_trace([0.0, 1.0, 2.0]), upstream, time_scale=0.25)
    firsts = {a.call_index: a for a in result.attempts if a.attempt_no == 0}
    for index, due in ((1, 1.0), (2, 2.0)):
        _sent_on_time(result, firsts[index].sent_s, due, f"call {index}")
    retry = next(a for a in result.attempts if a.call_index == 0 and a.attempt_no == 1)
    _sent_on_time(result, retry.sent_s, firsts[0].ended_s + 1.0, "the retry, 1 trace s after the 429")
    assert len(upstream.seen) == 4 and result.meta["time_scale"] == 0.25
    wall = result.meta["wall_s"]
    assert 0.5 <= wall < 2.0, f"the run took {wall:.3f} s of wall time: 0.5 s scaled, 2 s unscaled"


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
        backoff = rng.uniform(0.05, 0.3)
        _sent_on_time(result, after.sent_s, before.ended_s + backoff, f"attempt {after.attempt_no}, "
                      f"{backoff:.4f} s of backoff after attempt {before.attempt_no}")


def test_progress_is_logged(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("retrybench.loadgen.loadgen._PROGRESS_S", 0.1)
    with caplog.at_level(logging.INFO, logger="retrybench.loadgen.loadgen"):
        _run(_trace([0.0, 1.0]), Upstream())  # a second: ten lines at 0.1 s each, when all is well
    lines = [r.getMessage() for r in caplog.records if "calls started" in r.getMessage()]
    assert len(lines) >= 2 and "send lateness p99" in lines[0], lines


@contextmanager
def _upstream_process(chunks: int = 3) -> Iterator[str]:
    """The upstream in its own process, so that its work does not share the load generator's loop or GIL."""
    root = Path(__file__).resolve().parents[2]  # so that the script imports `fixtures` as the tests do
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, __file__, str(chunks)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        target = proc.stdout.readline().strip()
        assert target.startswith("http://"), (
            f"the upstream process printed {target!r} instead of its URL (exit code {proc.poll()}; see its stderr)")
        yield target
    finally:
        proc.terminate()
        proc.wait(timeout=GENEROUS_S)
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


@pytest.mark.beyond
def test_the_deadline_is_sent_only_by_a_client_that_sends_one() -> None:
    """Request-Timeout-Ms carries the time left to the attempt's deadline, in wall milliseconds."""
    for sends in (False, True):
        upstream = Upstream()
        _run(_trace([0.0]), upstream, client=replace(FAST, sends_deadline=sends), time_scale=0.5)
        header = upstream.seen[0][4].get("Request-Timeout-Ms")
        if not sends:
            assert header is None
        else:
            assert header is not None and 0 < int(header) <= FAST.attempt_timeout_s * 0.5 * 1000
