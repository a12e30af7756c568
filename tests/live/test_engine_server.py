"""The engine server: vLLM's completions API over the simulated engine, stepped in wall-clock time.

Servers run in-process (asyncio.run per test) at a small time scale, except the one test that
starts `retrybench engine-server` as a subprocess.

Nothing here depends on this machine's speed: a test waits for the state it needs (with a timeout
generous enough for a loaded machine, whose message says what was seen), and where a request must
still be in a given state when the test acts (waiting, in prefill, streaming), the engine's time
scale and the request's length keep it there for a second or more of wall time. At time scale 1 a
30,000-token prompt takes four prefill steps of about 0.25 s, and a reply streams a token each 5.5 ms.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fixtures.openai_client import fetch_engine_state, sse_events
from fixtures.waiting import GENEROUS_S, until, within
from prometheus_client.parser import text_string_to_metric_families

from retrybench.engine_server.engine_server import EngineServer, EngineServerSettings, engine_server_command
from retrybench.records.tracefile import FORMAT, read_trace
from retrybench.serving.launch import ServerProcess, free_port

pytestmark = pytest.mark.live

MODEL = "qwen2.5-7b-instruct"
LONG = list(range(30_000))  # four prefill steps of 8192 tokens: time to disconnect before the first token

Body = Callable[[EngineServer, aiohttp.ClientSession, str], Awaitable[None]]


def serve(body: Body, **settings: Any) -> EngineServer:
    """Run `body` against a fresh server; returns the stopped server for inspection."""
    settings.setdefault("time_scale", 0.05)
    server = EngineServer(EngineServerSettings(model=MODEL, **settings))

    async def main() -> None:
        port = await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                await within(body(server, session, f"http://127.0.0.1:{port}"), "the test to finish",
                             seen=lambda: f"the newest requests {sorted(server.core.stats)[-5:]}")
        finally:
            await server.stop()

    asyncio.run(main())
    return server


def tokens_of(chunk: dict[str, Any]) -> int:
    return len(chunk["choices"][0]["text"].split())


async def settled(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """The engine's state once it holds nothing (aborts are applied at the next batch's end)."""
    state: dict[str, Any] = {}

    async def empty() -> bool:
        state.update(await fetch_engine_state(session, url))
        return bool(state["live"] == 0 and state["waiting"] == 0 and state["running"] == 0)

    await until(empty, "the engine to hold no request", seen=lambda: state)
    return state


def latest_rid(server: EngineServer) -> int:
    return max(server.core.stats)


# -- completions -------------------------------------------------------------------------------


@pytest.mark.parametrize(("interval", "max_tokens"), [(1, 30), (8, 40)])
def test_streaming_completion_chunks_tokens_and_done(interval: int, max_tokens: int) -> None:
    result: dict[str, Any] = {}

    async def body(server: EngineServer, session: aiohttp.ClientSession, url: str) -> None:
        request = {"model": "any", "prompt": list(range(3000)), "max_tokens": max_tokens, "stream": True,
                   "ignore_eos": True, "stream_options": {"include_usage": True}}
        async with session.post(f"{url}/v1/completions", json=request) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            result["events"] = sse_events(await response.read())
        result["state"] = await fetch_engine_state(session, url)

    serve(body, stream_interval=interval)
    events = result["events"]
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3000, "completion_tokens": max_tokens,
                                                         "total_tokens": 3000 + max_tokens}
    chunks = events[:-2]
    assert all(c["id"] == chunks[0]["id"] and c["object"] == "text_completion" for c in chunks)
    assert sum(tokens_of(c) for c in chunks) == max_tokens
    assert tokens_of(chunks[0]) == 1  # the first token always goes out alone
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert all(tokens_of(c) >= interval for c in chunks[1:-1])
    assert len(chunks) <= 1 + -(-(max_tokens - 1) // interval)
    if interval == 1:
        assert len(chunks) > 1 + -(-(max_tokens - 1) // 8)  # tokens are streamed as they come
    state = result["state"]
    assert state["pending"] == 0 and state["live"] == 0 and state["successes"] == 1


def test_non_streaming_completion_answers_once_with_usage() -> None:
    result: dict[str, Any] = {}

    async def body(server: EngineServer, session: aiohttp.ClientSession, url: str) -> None:
        async with session.post(f"{url}/v1/completions", json={"prompt": "one two three four",
                                                               "max_tokens": 12}) as response:
            assert response.status == 200
            result["body"] = await response.json()
        async with session.get(f"{url}/v1/models") as response:
            result["models"] = await response.json()
        async with session.get(f"{url}/health") as response:
            result["health"] = response.status

    serve(body)
    answer = result["body"]
    assert answer["object"] == "text_completion" and answer["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert len(answer["choices"][0]["text"].split()) == 12
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert [m["id"] for m in result["models"]["data"]] == ["Qwen/Qwen2.5-7B-Instruct"]
    assert result["health"] == 200


@pytest.mark.parametrize(("raw", "param"), [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b'{"prompt": [1, 2, 3]}', "max_tokens"),
    (b'{"prompt": [1, 2, 3], "max_tokens": 0}', "max_tokens"),
    (b'{"prompt": [1, 2, 3], "max_tokens": true}', "max_tokens"),
    (b'{"max_tokens": 5}', "prompt"),
    (b'{"prompt": [], "max_tokens": 5}', "prompt"),
    (b'{"prompt": ["a", 1], "max_tokens": 5}', "prompt"),
    (b'{"prompt": [1], "max_tokens": 5, "stream": "yes"}', "stream"),
    (b'{"prompt": [1], "max_tokens": 40000}', "max_tokens"),
])
def test_bad_requests_get_openai_style_400(raw: bytes, param: str | None) -> None:
    result: dict[str, Any] = {}

    async def body(server: EngineServer, session: aiohttp.ClientSession, url: str) -> None:
        async with session.post(f"{url}/v1/completions", data=raw,
                                headers={"Content-Type": "application/json"}) as response:
            result["status"] = response.status
            result["body"] = await response.json()

    server = serve(body)
    assert result["status"] == 400
    error = result["body"]["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["param"] == param
    assert error["message"]
    assert not server.core.stats  # nothing reached the engine


# -- disconnects ---------------------------------------------------------------------------------


def test_disconnect_while_waiting_aborts_an_unscheduled_request(tmp_path: Path) -> None:
    result: dict[str, Any] = {}

    async def body(server: EngineServer, session: aiohttp.ClientSession, url: str) -> None:
        first = await session.post(f"{url}/v1/completions", json={"prompt": LONG, "max_tokens": 50, "stream": True})
        second = await session.post(f"{url}/v1/completions",
                                    json={"prompt": [7] * 3000, "max_tokens": 50, "stream": True})
        rid = latest_rid(server)
        stats = server.core.stats[rid]
        assert stats.first_scheduled_s is None and server.core.num_waiting == 1  # behind the long prefill (1 s)
        second.close()
        await until(lambda: stats.abort_requested_s is not None, "the engine to see the disconnect")
        await until(lambda: stats.aborted_s is not None, "the abort (at the batch's end)")
        result["rid"] = rid
        result["waiting_after"] = server.core.num_waiting
        result["unscheduled"] = stats.first_scheduled_s is None
        first.close()
        result["state"] = await settled(session, url)

    server = serve(body, trace_path=tmp_path / "trace.jsonl", time_scale=1.0)
    rid = result["rid"]
    assert result["waiting_after"] == 0 and result["unscheduled"]
    assert result["state"]["aborted"] == 2 and result["state"]["pending"] == 0
    _, events = read_trace(tmp_path / "trace.jsonl")
    mine = [e for e in events if e.get("execution") == rid]
    assert [e["event"] for e in mine] == ["queued", "abort_requested", "aborted"]
    assert mine[-1]["unscheduled"] is True
    assert server.core.stats[rid].aborted_s is not None


def test_disconnect_before_first_token_counts_in_queries_not_prompt_tokens() -> None:
    result: dict[str, Any] = {}

    async def body(server: EngineServer, session: aiohttp.ClientSession, url: str) -> None:
        response = await session.post(f"{url}/v1/completions", json={"prompt": LONG, "max_tokens": 50, "stream": True})
        stats = server.core.stats[latest_rid(server)]
        await until(lambda: stats.first_scheduled_s is not None, "its prefill to start")
        assert stats.first_token_s is None and server.core.num_running == 1  # for the prefill's 1 s
        response.close()
        result["state"] = await settled(session, url)
        async with session.get(f"{url}/metrics") as metrics:
            result["metrics"] = await metrics.text()
        result["computed"] = stats.computed_prompt_tokens

    serve(body, time_scale=1.0)
    samples = {s.name: s for family in text_string_to_metric_families(result["metrics"]) for s in family.samples}
    assert samples["vllm:prompt_tokens_total"].value == 0  # no first token: vLLM never counts it
    assert samples["vllm:prefix_cache_queries_total"].value == len(LONG)  # counted at admission
    assert samples["vllm:request_success_total"].value == 0
    assert samples["vllm:num_requests_running"].value == 0
    assert samples["vllm:num_requests_waiting"].labels["model_name"] == "Qwen/Qwen2.5-7B-Instruct"
    assert "vllm:generation_tokens_total" in samples and "vllm:prefix_cache_hits_total" in samples
    assert result["computed"] > 0  # prompt work was done all the same
    assert result["state"]["aborted"] == 1


def test_disconnect_mid_stream_aborts_and_frees_the_engine(tmp_path: Path) -> None:
    result: dict[str, Any] = {}

    async def body(server: EngineServer, session: aiohttp.ClientSession, url: str) -> None:
        response = await session.post(f"{url}/v1/completions",  # 20,000 tokens: 5 s at time scale 0.05
                                      json={"prompt": list(range(2000)), "max_tokens": 20_000, "stream": True})
        seen = 0
        async for line in response.content:
            if line.startswith(b"data: "):
                seen += 1
                if seen == 3:
                    break
        assert (await fetch_engine_state(session, url))["running"] == 1
        response.close()
        result["state"] = await settled(session, url)
        result["rid"] = latest_rid(server)

    server = serve(body, trace_path=tmp_path / "trace.jsonl")
    state = result["state"]
    assert state["aborted"] == 1 and state["successes"] == 0 and state["pending"] == 0
    stats = server.core.stats[result["rid"]]
    assert stats.first_token_s is not None and stats.aborted_s is not None and stats.finished_s is None
    _, events = read_trace(tmp_path / "trace.jsonl")
    kinds = [e["event"] for e in events if e.get("execution") == result["rid"]]
    assert kinds[:2] == ["queued", "first_token"] and kinds[-2:] == ["abort_requested", "aborted"]


# -- queue cap -----------------------------------------------------------------------------------


def test_queue_cap_refuses_with_503_json_and_an_sse_error_event() -> None:
    result: dict[str, Any] = {}

    async def body(server: EngineServer, session: aiohttp.ClientSession, url: str) -> None:
        holder = await session.post(f"{url}/v1/completions", json={"prompt": [1] * 100, "max_tokens": 30_000,
                                                                   "stream": True})  # 8 s at time scale 0.05
        async with session.post(f"{url}/v1/completions", json={"prompt": [2] * 100, "max_tokens": 5}) as response:
            result["plain"] = (response.status, await response.json(), response.headers.get("Retry-After"))
        async with session.post(f"{url}/v1/completions",
                                json={"prompt": [3] * 100, "max_tokens": 5, "stream": True}) as response:
            result["stream"] = (response.status, sse_events(await response.read()))
        holder.close()
        result["state"] = await settled(session, url)

    server = serve(body, max_num_queued_reqs=1)
    status, error, retry_after = result["plain"]
    assert status == 503 and retry_after is None
    assert error["error"]["code"] == 503 and error["error"]["type"] == "ServiceUnavailableError"
    status, events = result["stream"]
    assert status == 200
    assert events[0]["error"]["code"] == 503 and events[1:] == ["[DONE]"]
    assert result["state"]["refused"] == 2
    assert len(server.core.stats) == 1  # refused requests never reached the scheduler


# -- trace and subprocess ------------------------------------------------------------------------


def test_trace_is_flushed_while_running_and_valid_jsonl_after_stop(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    result: dict[str, Any] = {}

    async def body(server: EngineServer, session: aiohttp.ClientSession, url: str) -> None:
        async with session.post(f"{url}/v1/completions", json={"prompt": [5] * 3000, "max_tokens": 8}) as response:
            assert response.status == 200

        def lines() -> int:
            return len(path.read_text().splitlines()) if path.exists() else 0

        await until(lambda: lines() > 1, "a periodic flush of the trace", seen=lines)  # every 0.5 s
        result["lines_before_stop"] = lines()

    serve(body, trace_path=path)
    assert result["lines_before_stop"] > 1  # events reach the file before stop (SIGKILL loses < 0.5 s)
    lines = path.read_text().splitlines()
    assert all(json.loads(line) for line in lines)
    header, events = read_trace(path)
    assert header["format"] == FORMAT and header["model"] == MODEL
    kinds = {e["event"] for e in events}
    assert {"queued", "step", "first_token", "finished", "step_done"} <= kinds
    times = [e["t"] for e in events]
    assert times == sorted(times)  # engine time never goes backwards


def test_server_process_serves_health_and_terminates_cleanly(tmp_path: Path) -> None:
    port = free_port()
    settings = EngineServerSettings(model=MODEL, time_scale=0.05, trace_path=tmp_path / "trace.jsonl",
                                    max_num_queued_reqs=4, async_scheduling=False)
    argv = engine_server_command(settings, port)
    assert argv[:4] == [sys.executable, "-m", "retrybench", "engine-server"]
    assert "--sync-scheduling" in argv and argv[argv.index("--max-num-queued-reqs") + 1] == "4"
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(argv, health_url=f"{url}/health", log_path=tmp_path / "engine.log")
    with server:
        with urllib.request.urlopen(f"{url}/health", timeout=GENEROUS_S) as response:
            assert response.status == 200
        request = urllib.request.Request(f"{url}/v1/completions", method="POST",
                                         data=json.dumps({"prompt": [1, 2, 3], "max_tokens": 4}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=GENEROUS_S) as response:
            assert json.load(response)["usage"]["completion_tokens"] == 4
        process = server._process
        assert process is not None and process.poll() is None
    assert process.returncode == 0  # SIGTERM is handled: a clean exit, not a kill
    assert "ready" in server.log_text()
    header, events = read_trace(tmp_path / "trace.jsonl")
    assert header["async_scheduling"] is False
    assert any(e["event"] == "finished" for e in events)


def test_server_process_reports_an_early_exit_with_the_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"]
    server = ServerProcess(argv, health_url=f"http://127.0.0.1:{free_port()}/health", log_path=tmp_path / "x.log")
    with pytest.raises(RuntimeError, match="no such model"), server:
        pass
