"""What the proxy logs for executions still running when it stops: never a cancellation.

A live run stops its proxy once the load generator is done; with cancellation off (coalescing,
say) the engine may still be running orphaned executions then. Those were logged as "cancelled",
so a run whose policy never cancels reported cancelled executions (74 in one coalescing run on a
real vLLM). They are logged as the simulator records an execution live at a run's end: orphaned
when nobody waits for it, unfinished when a client still does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fixtures.stack import policy, proxy_stack
from fixtures.stub_upstream import StubUpstream
from fixtures.waiting import until

from retrybench.loadgen.assemble import _FATES
from retrybench.records.runlog import FATE_ORPHANED, FATE_UNFINISHED
from retrybench.serving.aio import run_event_loop

pytestmark = pytest.mark.live


def body(n: int, **stub: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": [101, 102, 103, 104], "max_tokens": n, "stream": True, "stub": stub}


def test_executions_running_at_shutdown_are_orphaned_or_unfinished_not_cancelled() -> None:
    events: list[dict[str, Any]] = []

    async def main() -> None:
        async with proxy_stack(policy("coalescing"), StubUpstream()) as s:
            left = await s.post(body(2000, interval_ms=20), key="left").__aenter__()  # 40 s: outlives the test
            await left.content.readuntil(b"\n\n")
            left.close()  # its client gave up; cancellation is off, so the execution runs on, orphaned
            await s.logged("left", call=0, attempt=0)
            waiting = await s.post(body(2000, interval_ms=20), key="waiting").__aenter__()
            await waiting.content.readuntil(b"\n\n")  # a client still reading when the proxy stops
            await until(lambda: len(s.proxy.relays) == 2, "both executions to run")
            await s.proxy.stop()  # as `retrybench proxy` does on SIGTERM, with the second client still there
            events.extend(s.proxy.log.events)
            waiting.close()

    run_event_loop(main)
    fates = {e["execution"]: e["fate"] for e in events if e["ev"] == "end"}
    assert fates == {0: "orphaned", 1: "unfinished"}, f"fates logged at shutdown: {fates}"
    assert not [e for e in events if e["ev"] in ("left", "timer") and e["actions"]], "the policy decided a cancel"
    assert _FATES["orphaned"] == FATE_ORPHANED and _FATES["unfinished"] == FATE_UNFINISHED


def test_a_cancellation_the_policy_decides_is_still_logged_as_cancelled() -> None:
    events: list[dict[str, Any]] = []

    async def main() -> None:
        async with proxy_stack(policy("retries-on-cancel-on"), StubUpstream()) as s:
            left = await s.post(body(2000, interval_ms=20), key="left").__aenter__()
            await left.content.readuntil(b"\n\n")
            left.close()
            await s.logged("end", execution=0)
            events.extend(s.proxy.log.events)
        await asyncio.sleep(0)

    run_event_loop(main)
    assert [e["fate"] for e in events if e["ev"] == "end"] == ["cancelled"]
