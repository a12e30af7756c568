"""One paper run, live: load generator -> proxy -> engine over real HTTP on loopback, then the run log.

The engine server and the proxy run as processes of their own (as they would be deployed); the
load generator and a 1-per-trace-second scraper of both /metrics endpoints share this process's
event loop. Every clock runs `time_scale` wall seconds per trace second, so a 947-s paper run
takes 947 x time_scale wall seconds and the same trace meets the same engine model as in the
simulator. The engine may be external (`engine_url`): a vLLM, or an engine server started elsewhere. The proxy
is a process by default (`proxy_process`); a `ProxyLauncher` starts it otherwise (the proxy container,
proxy.proxy_container).

`drive` and `deployment_run_log` do the same for a deployment someone else started (several engines
behind several proxy instances behind a front balancer, docs/replicas.md): the load goes to the front,
the scraper sums the engines' and the instances' gauges, as the simulator samples a deployment, and the
instances' decision logs are merged into one run log.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

import aiohttp

from retrybench.conditions.config import ClientPolicy, load_condition
from retrybench.engine.profiles import profile_for
from retrybench.engine_server.engine_server import EngineServerSettings, engine_server_command
from retrybench.loadgen.assemble import Scrape, assemble_run_log, merge_proxy_logs
from retrybench.loadgen.loadgen import LoadgenSettings, LoadResult, run_load
from retrybench.plan.recorded import trace_for
from retrybench.plan.spec import DEFAULT_GPU_MEMORY_UTILIZATION, RunSpec, engine_config_for
from retrybench.plan.stack_spec import client_stack_for
from retrybench.proxy.eventlog import PROXY_LOG, read_event_log
from retrybench.records.runlog import RunLog, RunMeta
from retrybench.serving.aio import metric_sums, run_event_loop
from retrybench.serving.launch import ServerProcess, free_port
from retrybench.traffic.workload import Trace

__all__ = ["LiveRun", "ProxyLauncher", "deployment_run_log", "drive", "proxy_process", "run_live"]



class ProxyLauncher(Protocol):
    """Starts the proxy of one run in front of `engine_url` with `policy` (a condition name) and
    clocks at `time_scale`, writing its decision log to `workdir / PROXY_LOG` by the time the
    context exits; the context yields the proxy's base URL."""

    def __call__(self, *, engine_url: str, policy: str, time_scale: float,
                 workdir: Path) -> AbstractContextManager[str]: ...


@contextlib.contextmanager
def proxy_process(*, engine_url: str, policy: str, time_scale: float, workdir: Path) -> Iterator[str]:
    """`retrybench proxy` as a process of its own on a free loopback port."""
    port = free_port()
    argv = [sys.executable, "-m", "retrybench", "proxy", "--engine", engine_url, "--port", str(port),
            "--condition", policy, "--log", str(workdir / PROXY_LOG), "--time-scale", repr(time_scale)]
    url = f"http://127.0.0.1:{port}"
    # SIGINT at the end: the run is over, and nothing it did may wait for a drain
    with ServerProcess(argv, health_url=url + "/health", log_path=workdir / "proxy.log", stop_signal=signal.SIGINT):
        yield url


@dataclass(frozen=True, kw_only=True)
class LiveRun:
    log: RunLog
    load: LoadResult
    workdir: Path


async def _sums(session: aiohttp.ClientSession, urls: Sequence[str], names: Sequence[str]) -> dict[str, int]:
    """Each metric of `names` summed over the /metrics of every URL."""
    total = dict.fromkeys(names, 0)
    for url in urls:
        async with session.get(url + "/metrics") as response:
            sums = metric_sums(await response.read())
        for name in names:
            total[name] += int(sums.get(name, 0))
    return total


async def _scrape(session: aiohttp.ClientSession, engines: Sequence[str], proxies: Sequence[str]) -> Scrape:
    e = await _sums(session, engines, ("vllm:num_requests_waiting", "vllm:num_requests_running",
                                       "vllm:prompt_tokens_total", "vllm:prefix_cache_queries_total"))
    proxy_waiting, breaker = await _proxy_gauges(session, proxies)
    return Scrape(at_unix=time.time(), engine_waiting=e["vllm:num_requests_waiting"],
                  engine_running=e["vllm:num_requests_running"], proxy_waiting=proxy_waiting,
                  prompt_tokens_total=e["vllm:prompt_tokens_total"],
                  prefix_cache_queries_total=e["vllm:prefix_cache_queries_total"], breaker_state=breaker)


async def _proxy_gauges(session: aiohttp.ClientSession, proxies: Sequence[str]) -> tuple[int, int | None]:
    """The proxies' queue depth (summed) and their circuit breaker's state, from one read of each /metrics:
    None where no proxy has a breaker, else the highest code any shows (any not closed shows)."""
    waiting = 0
    states: list[int] = []
    for url in proxies:
        async with session.get(url + "/metrics") as response:
            sums = metric_sums(await response.read())
        waiting += int(sums.get("retrybench_proxy_queue_depth", 0))
        if "retrybench_proxy_breaker_state" in sums:
            states.append(int(sums["retrybench_proxy_breaker_state"]))
    return waiting, (max(states) if states else None)


async def _drive(trace: Trace, settings: LoadgenSettings, engines: Sequence[str], proxies: Sequence[str],
                 every_s: float) -> tuple[LoadResult, list[Scrape]]:
    scrapes: list[Scrape] = []
    done = asyncio.Event()

    async def scraper() -> None:
        async with aiohttp.ClientSession() as session:
            next_at = time.monotonic()
            while not done.is_set():
                # A missed scrape leaves the previous sample in place, as Prometheus would.
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    scrapes.append(await _scrape(session, engines, proxies))
                next_at += every_s
                await asyncio.sleep(max(next_at - time.monotonic(), 0.0))

    task = asyncio.create_task(scraper())
    try:
        load = await run_load(trace, settings)
    finally:
        done.set()
        await task
    return load, scrapes


def run_live(spec: RunSpec, *, time_scale: float, workdir: Path, chat: float, stream_interval: int = 64,
             engine_url: str | None = None, trace: Trace | None = None, client: ClientPolicy | None = None,
             proxy: ProxyLauncher = proxy_process) -> LiveRun:
    """Run `spec` live and return its run log (the same schema the simulator writes). `trace` and
    `client` replace the spec's trace and its condition's client (the calibration's stages); `proxy`
    starts the proxy (a process by default)."""
    condition = load_condition(spec.condition)
    if client is not None:
        condition = replace(condition, client=client)
    engine_config, cap = engine_config_for(spec, condition, chat)
    trace = trace if trace is not None else trace_for(spec, chat)
    workload = trace.spec
    workdir.mkdir(parents=True, exist_ok=True)
    proxy_log = workdir / PROXY_LOG
    with _engine(spec, engine_url, time_scale, cap, stream_interval, workdir) as engine, \
            proxy(engine_url=engine, policy=spec.condition, time_scale=time_scale, workdir=workdir) as proxy_url:
        settings = LoadgenSettings(target=proxy_url, client=condition.client, seed=spec.seed, time_scale=time_scale,
                                   stack=client_stack_for(spec))
        box: list[tuple[LoadResult, list[Scrape]]] = []

        async def main() -> None:
            box.append(await _drive(trace, settings, [engine], [proxy_url], time_scale))

        run_event_loop(main)
    load, scrapes = box[0]
    (workdir / "loadgen.json").write_text(load.to_json())
    header, events = read_event_log(proxy_log)
    ends = [c.delivered_s or c.failed_s or 0.0 for c in load.calls]
    end_s = max([trace.end_s, *ends])
    meta: RunMeta = {
        **asdict(spec), "chat": chat, "pulse_start_s": workload.pulse_start_s, "pulse_end_s": workload.pulse_end_s,
        "hold_end_s": workload.hold_end_s, "attempt_timeout_s": condition.client.attempt_timeout_s,
        "delivery_horizon_s": 840.0, "engine_cap": cap,
        "kv_blocks": profile_for(spec.model, spec.gpu, engine_config).kv_blocks,
        "engine_url": engine_url or "engine-server", "stream_interval": stream_interval,
    }
    if "stack" in load.meta:
        meta["stack"] = load.meta["stack"]
    log = assemble_run_log(load_meta=load.meta, calls=load.calls, attempts=load.attempts,
                           call_ids=[c.call_id for c in trace.calls], proxy_header=header, proxy_events=events,
                           scrapes=scrapes, meta=meta, end_s=end_s)
    (workdir / "runlog.json").write_text(log.to_json())
    return LiveRun(log=log, load=load, workdir=workdir)


def drive(trace: Trace, *, target: str, client: ClientPolicy, seed: int, time_scale: float,
          engines: Sequence[str], proxies: Sequence[str]) -> tuple[LoadResult, list[Scrape]]:
    """Send `trace` to `target` (a front, a proxy) in this process's event loop, scraping every engine
    and proxy instance once per trace second (their gauges summed); returns the load and the scrapes."""
    settings = LoadgenSettings(target=target, client=client, seed=seed, time_scale=time_scale)
    box: list[tuple[LoadResult, list[Scrape]]] = []

    async def main() -> None:
        box.append(await _drive(trace, settings, engines, proxies, time_scale))

    run_event_loop(main)
    return box[0]


def deployment_run_log(trace: Trace, load: LoadResult, scrapes: Sequence[Scrape], proxy_logs: Sequence[Path],
                       meta: RunMeta) -> RunLog:
    """The run log of a load `drive` sent through several proxy instances, from their decision logs
    (read once the instances have stopped and flushed them); `meta` adds to the trace's phase times."""
    header, events = merge_proxy_logs([read_event_log(path) for path in proxy_logs])
    ends = [c.delivered_s or c.failed_s or 0.0 for c in load.calls]
    workload = trace.spec
    meta = {"pulse_start_s": workload.pulse_start_s, "pulse_end_s": workload.pulse_end_s,
            "hold_end_s": workload.hold_end_s, "delivery_horizon_s": 840.0, **meta}
    return assemble_run_log(load_meta=load.meta, calls=load.calls, attempts=load.attempts,
                            call_ids=[c.call_id for c in trace.calls], proxy_header=header, proxy_events=events,
                            scrapes=scrapes, meta=meta, end_s=max([trace.end_s, *ends]))


class _engine:
    """The engine's base URL: an external one, or an engine server started for this run."""

    def __init__(self, spec: RunSpec, url: str | None, time_scale: float, cap: int | None, stream_interval: int,
                 workdir: Path) -> None:
        self.url = url
        self.process: ServerProcess | None = None
        if url is None:
            port = free_port()
            settings = EngineServerSettings(model=spec.model, gpu=spec.gpu, time_scale=time_scale,
                                            max_num_queued_reqs=cap, stream_interval=stream_interval)
            if spec.max_batched_tokens != 8192:
                raise ValueError("the engine server serves the default max_num_batched_tokens (8192) only")
            if spec.gpu_memory_utilization != DEFAULT_GPU_MEMORY_UTILIZATION:
                raise ValueError("the engine server serves vLLM's default gpu_memory_utilization (0.90) only")
            self.url = f"http://127.0.0.1:{port}"
            self.process = ServerProcess(engine_server_command(settings, port), health_url=self.url + "/health",
                                         log_path=workdir / "engine.log")

    def __enter__(self) -> str:
        if self.process is not None:
            self.process.__enter__()
        assert self.url is not None
        return self.url.rstrip("/")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.__exit__(None, None, None)

