"""What a proxy in front of a streaming upstream costs: time to first token and CPU per streamed chunk.

The upstream (the stub: no engine work), the proxy under test (retrybench's, or nginx where it is
installed) and this client run as separate processes on loopback; "direct" is the client against
the upstream itself, so `route - direct` is what the proxy adds, and `route / direct` what it costs
relative to the path without it. CPU is read from /proc for the proxy's whole process tree, so it
counts the proxy alone. `measure_alternating` takes one stream at a time through every route in
turn, so that each route's samples come from the same moments of a machine whose load changes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
from fixtures.nginx_front import nginx_binary, nginx_command, nginx_conf

from retrybench.serving.launch import ServerProcess, free_port

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass
class Route:
    name: str
    url: str
    pid: int | None = None  # the proxy's process (None for direct)


@dataclass
class StreamStats:
    ttft_ms: list[float] = field(default_factory=list)
    chunks: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the proxy's CPU time during the run

    def summary(self) -> dict[str, float]:
        ttft = np.asarray(self.ttft_ms)
        return {"ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p99_ms": float(np.percentile(ttft, 99)),
                "requests": float(ttft.size), "chunks": float(self.chunks),
                "chunks_per_s": self.chunks / self.wall_s if self.wall_s else 0.0,
                "cpu_us_per_chunk": 1e6 * self.cpu_s / self.chunks if self.chunks else 0.0}


def _tree(pid: int) -> set[int]:
    """`pid` and its children (nginx's workers)."""
    pids = {pid}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                pids.add(int(entry.name))
    return pids


def _runtime_s(pid: int) -> float | None:
    """The CPU time of `pid`'s threads to the nanosecond, from the scheduler's own count
    (/proc/PID/task/TID/sched, se.sum_exec_runtime in ms); None where the kernel does not show it."""
    total = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0  # gone
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/sched").read_text()
        except FileNotFoundError:
            return None
        except OSError:
            continue
        line = next((line for line in text.splitlines() if line.startswith("se.sum_exec_runtime")), None)
        if line is None:
            return None
        total += float(line.split(":", 1)[1]) / 1e3
    return total


def _ticks_s(pid: int) -> float:
    """utime + stime of `pid` from /proc/PID/stat: counted in 10 ms ticks."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def tree_cpu_s(pid: int | None) -> float:
    """CPU seconds of `pid` and its children: the scheduler's nanosecond count where the kernel
    shows it (a 20 s run of the proxy is about 0.5 s of CPU, so 10 ms ticks would be 2% steps),
    else utime + stime."""
    if pid is None:
        return 0.0
    total = 0.0
    for p in _tree(pid):
        runtime = _runtime_s(p)
        total += _ticks_s(p) if runtime is None else runtime
    return total


DONE = b"data: [DONE]\n\n"


def _body(tokens: int, interval_ms: float) -> bytes:
    return json.dumps({"model": "m", "prompt": [101, 102, 103, 104], "max_tokens": tokens, "stream": True,
                       "stub": {"interval_ms": interval_ms}}).encode()


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, stats: StreamStats) -> None:
    start = time.perf_counter()
    async with session.post(url + "/v1/completions", data=body,
                            headers={"Content-Type": "application/json"}) as response:
        first = await response.content.readany()
        stats.ttft_ms.append(1e3 * (time.perf_counter() - start))
        count, tail = first.count(b"data: "), first[-len(DONE):]
        async for data in response.content.iter_any():
            count += data.count(b"data: ")
            tail = (tail + data)[-len(DONE):]  # the end marker may straddle two reads
        if response.status != 200 or tail != DONE:
            raise RuntimeError(f"{url}: bad stream (status {response.status}, ends {tail!r})")
        stats.chunks += count


async def _run(route: Route, streams: int, duration_s: float, requests: int | None, tokens: int,
               interval_ms: float) -> StreamStats:
    stats = StreamStats()
    body = _body(tokens, interval_ms)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _one(session, route.url, body, StreamStats())  # warm the connection pools
        cpu0, t0 = tree_cpu_s(route.pid), time.perf_counter()
        stop = t0 + duration_s

        stream_s = tokens * interval_ms / 1000

        async def worker(i: int) -> None:
            await asyncio.sleep(i * stream_s / streams)  # spread the streams out: no synchronized bursts
            while time.perf_counter() < stop and (requests is None or len(stats.ttft_ms) < requests):
                await _one(session, route.url, body, stats)

        await asyncio.gather(*(worker(i) for i in range(streams)))
        stats.wall_s = time.perf_counter() - t0
        stats.cpu_s = tree_cpu_s(route.pid) - cpu0
    return stats


def measure(route: Route, *, streams: int, duration_s: float, tokens: int, interval_ms: float,
            requests: int | None = None) -> StreamStats:
    """`streams` clients, each sending its next streamed request when the last one ends."""
    return asyncio.run(_run(route, streams, duration_s, requests, tokens, interval_ms))


async def _alternate(found: list[Route], requests: int, tokens: int, interval_ms: float) -> dict[str, StreamStats]:
    body = _body(tokens, interval_ms)
    stats = {route.name: StreamStats() for route in found}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for route in found:
            await _one(session, route.url, body, StreamStats())  # warm the connection pools
        cpu0 = {route.name: tree_cpu_s(route.pid) for route in found}
        t0 = time.perf_counter()
        for _ in range(requests):
            for route in found:
                await _one(session, route.url, body, stats[route.name])
        wall = time.perf_counter() - t0
    for route in found:
        stats[route.name].wall_s = wall
        stats[route.name].cpu_s = tree_cpu_s(route.pid) - cpu0[route.name]
    return stats


def measure_alternating(found: list[Route], *, requests: int, tokens: int,
                        interval_ms: float) -> dict[str, StreamStats]:
    """One stream at a time, `requests` per route, the routes taking turns request by request."""
    return asyncio.run(_alternate(found, requests, tokens, interval_ms))


# -- the processes ----------------------------------------------------------------------------------


@contextmanager
def routes(workdir: Path) -> Iterator[list[Route]]:
    """Start the stub upstream, the retrybench proxy and (where installed) nginx in front of it."""
    with ExitStack() as stack:
        up_port = free_port()
        stack.enter_context(ServerProcess(
            [sys.executable, "-m", "fixtures.stub_upstream", "--port", str(up_port)],
            health_url=f"http://127.0.0.1:{up_port}/health", log_path=workdir / "stub.log"))
        upstream = f"http://127.0.0.1:{up_port}"
        found = [Route("direct", upstream)]
        nginx = nginx_binary()
        if nginx is not None:
            port = free_port()
            conf = nginx_conf(workdir, port, [up_port])
            process = stack.enter_context(ServerProcess(
                nginx_command(nginx, conf), health_url=f"http://127.0.0.1:{port}/health",
                log_path=workdir / "nginx.log"))
            found.append(Route("nginx", f"http://127.0.0.1:{port}", process.pid))
        port = free_port()
        process = stack.enter_context(ServerProcess(
            [sys.executable, "-m", "retrybench", "proxy", "--engine", upstream, "--port", str(port),
             "--condition", "retries-on-cancel-on"],
            health_url=f"http://127.0.0.1:{port}/health", log_path=workdir / "proxy.log"))
        found.append(Route("retrybench", f"http://127.0.0.1:{port}", process.pid))
        yield found


def nginx_available() -> bool:
    return nginx_binary() is not None

