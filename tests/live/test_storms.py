"""Storms against the deployed proxy (its own process, fixtures/storm.py): clients leaving in every state at
once, and thousands of calls waiting in its queue. Afterwards it must hold nothing, and its memory and
open files must be back where they were.

The disconnect storm here is 1,000 clients (a warm-up burst of 250, then three more); the benchmark
in benchmarks/perf/test_storm.py drives 10,000.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from fixtures.storm import (
    STATES,
    Client,
    ProxyProcess,
    gauges,
    proxy_process,
    raise_open_file_limit,
    settled,
    storm_burst,
    until_async,
)

pytestmark = pytest.mark.live

BURST = 250
BURSTS = 3  # after the warm-up burst
MEMORY_GROWTH = 0.05  # the most the proxy's RSS may grow over the storm, as a share of the warm baseline
WAITING = 5_000
HOLD_S = 60.0  # how long the waiting calls wait (the scenario's own length, not a wait for a state)
OCCUPIERS = 10


def _limit_or_skip(needed: int) -> None:
    reason = raise_open_file_limit(needed)
    if reason is not None:
        pytest.skip(reason)


async def _files_back(proxy: ProxyProcess, baseline: int) -> None:
    """The proxy's open files drop back to `baseline` (sockets close a little after their resets)."""
    async def files() -> bool:
        return proxy.open_files() <= baseline

    await until_async(files, True, f"the proxy's open files to fall back to {baseline}")


def test_a_disconnect_storm_in_every_state_leaves_nothing_behind(tmp_path: Path) -> None:
    _limit_or_skip(4 * BURST + 1024)

    async def storm(proxy: ProxyProcess) -> None:
        async with aiohttp.ClientSession() as session:
            await storm_burst(proxy, session, BURST, "warm")
            baseline_rss, baseline_files = proxy.rss_kib(), proxy.open_files()
            for n in range(BURSTS):
                left = await storm_burst(proxy, session, BURST, f"b{n}")
                assert set(left) == set(STATES) and sum(left.values()) == BURST
            await _files_back(proxy, baseline_files)
            rss = proxy.rss_kib()
            print(f"storm: {BURST * (BURSTS + 1)} clients; proxy RSS {baseline_rss} KiB after the warm-up burst, "
                  f"{rss} KiB after the storm, peak {proxy.peak_rss_kib()} KiB; open files {baseline_files}")
            assert rss <= baseline_rss * (1 + MEMORY_GROWTH), (
                f"the proxy's RSS grew from {baseline_rss} to {rss} KiB over {BURSTS} bursts of {BURST}")

    with proxy_process(tmp_path, {"cancellation": "immediate", "coalescing": True,
                                  "max_outstanding": 2 * BURST // 5}) as proxy:
        asyncio.run(storm(proxy))


def test_thousands_of_calls_wait_in_the_proxys_queue_and_are_all_answered(tmp_path: Path) -> None:
    """5,000 calls wait a minute behind ten endless streams that fill the proxy's cap; once those leave,
    every waiting call is served whole."""
    _limit_or_skip(3 * WAITING + 1024)

    async def wait(proxy: ProxyProcess) -> None:
        async with aiohttp.ClientSession() as session:
            before = proxy.rss_kib()
            occupiers = [await Client.send(proxy, f"occupier-{i}", {"interval_ms": 1000}, 100_000)
                         for i in range(OCCUPIERS)]
            await asyncio.gather(*(c.read_first_event() for c in occupiers))
            waiting = [await Client.send(proxy, f"waiting-{i}", {}, 2) for i in range(WAITING)]

            async def depth() -> float:
                return (await gauges(session, proxy)).get("retrybench_proxy_queue_depth", 0.0)

            await until_async(depth, WAITING, f"{WAITING} calls to wait in the proxy's queue")
            held = proxy.rss_kib()
            await asyncio.sleep(HOLD_S)
            assert await depth() == WAITING  # still waiting, none lost
            for client in occupiers:  # the cap lifts: the occupiers leave and their slots free
                client.reset()
            bodies = await asyncio.gather(*(c.read_whole_stream() for c in waiting))
            answered = sum(1 for b in bodies if b.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in b)
            per_call = (held - before) * 1024 / WAITING
            print(f"{WAITING} calls waiting: proxy RSS {before} -> {held} KiB, {per_call:.0f} bytes per waiting "
                  f"call; {answered} answered whole")
            assert answered == WAITING, [b[:80] for b in bodies if b"data: [DONE]" not in b][:3]
            for client in waiting:
                client.close()
            await settled(session, proxy)

    with proxy_process(tmp_path, {"cancellation": "immediate", "max_outstanding": OCCUPIERS}) as proxy:
        asyncio.run(wait(proxy))
