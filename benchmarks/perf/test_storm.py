"""A disconnect storm of 10,000 clients against the deployed proxy (`retrybench proxy` in its own process,
fixtures/storm.py): five bursts of 2,000, each with a fifth of its clients in every state the proxy has
(streaming, waiting for a first token, attached to another call's execution, joining during the replay of
a coalesced prefix, queued in the proxy), all reset at once. A warm-up burst of the same size comes first,
so the baseline is the proxy's memory once its allocator has served a burst, not its start-up size.

Recorded (pytest-benchmark's extra_info and the printed line): the storm's wall time, the proxy's peak
memory and its CPU time. Checked: after each burst it holds nothing (no execution, subscriber, upstream
stream or queued call: fixtures.storm.settled), its open files are back where they were, and its memory is
within MEMORY_GROWTH of the baseline. Each distinct call id is remembered (bounded by the proxy's
remembered_calls) to tell its retries from first attempts, so some growth per distinct call is by design.

Run on its own: pytest benchmarks/perf/test_storm.py -p no:xdist -s
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fixtures.storm import STATES, ProxyProcess, proxy_process, raise_open_file_limit, storm_burst, until_async

BURST = 2_000
BURSTS = 5
MEMORY_GROWTH = 0.05  # the most the proxy's RSS may grow over the storm, as a share of the baseline


async def _storm(proxy: ProxyProcess) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        await storm_burst(proxy, session, BURST, "warm")
        baseline_rss, baseline_files = proxy.rss_kib(), proxy.open_files()
        cpu_before, started = proxy.cpu_s(), time.monotonic()
        left: dict[str, int] = dict.fromkeys(STATES, 0)
        for n in range(BURSTS):
            for state, count in (await storm_burst(proxy, session, BURST, f"b{n}")).items():
                left[state] += count
        wall_s, cpu_s = time.monotonic() - started, proxy.cpu_s() - cpu_before

        async def files_back() -> bool:
            return proxy.open_files() <= baseline_files

        await until_async(files_back, True, f"the proxy's open files to fall back to {baseline_files}")
        return {"clients": sum(left.values()), "left_per_state": left, "wall_s": round(wall_s, 2),
                "proxy_cpu_s": round(cpu_s, 2), "baseline_rss_kib": baseline_rss, "rss_after_kib": proxy.rss_kib(),
                "peak_rss_kib": proxy.peak_rss_kib(), "open_files": baseline_files}


def test_a_storm_of_ten_thousand_clients(benchmark: Any, tmp_path: Path) -> None:
    reason = raise_open_file_limit(4 * BURST + 1024)
    if reason is not None:
        pytest.skip(reason)
    with proxy_process(tmp_path, {"cancellation": "immediate", "coalescing": True,
                                  "max_outstanding": 2 * BURST // 5}) as proxy:
        figures = benchmark.pedantic(lambda: asyncio.run(_storm(proxy)), rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    growth = figures["rss_after_kib"] / figures["baseline_rss_kib"] - 1
    print(f"\nstorm of {figures['clients']} clients in {BURSTS} bursts of {BURST}: {figures['wall_s']} s, proxy CPU "
          f"{figures['proxy_cpu_s']} s ({figures['proxy_cpu_s'] / figures['clients'] * 1e6:.0f} us per client); "
          f"RSS {figures['baseline_rss_kib']} KiB after the warm-up burst, {figures['rss_after_kib']} KiB after "
          f"({growth:+.1%}), peak {figures['peak_rss_kib']} KiB")
    assert figures["clients"] == BURST * BURSTS and set(figures["left_per_state"]) == set(STATES)
    assert growth <= MEMORY_GROWTH, (
        f"the proxy's RSS grew {growth:.1%} over the storm ({figures['baseline_rss_kib']} -> "
        f"{figures['rss_after_kib']} KiB), over the {MEMORY_GROWTH:.0%} allowed")
