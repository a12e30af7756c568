"""Proxy overhead (pytest-benchmark): direct, nginx (where installed) and the retrybench proxy, side by
side in one run against the same minimal streaming upstream, each in its own process.

Scenarios: one stream at a time (time to first token, and CPU per request: a 4-token stream's whole
cost, its few chunks included), the routes taking turns request by request; 50 concurrent streams of
200 chunks, 10 ms apart (5,000 chunks/s: TTFT under load); the same at 50 chunks of 10 ms (more
requests per chunk: TTFT); 50 streams of 1,000 chunks of
10 ms, one request each (CPU per chunk: a request's own work is spread over 1,000 chunks, under 3%
of the figure); and 50 streams as fast as the upstream sends (throughput, reported only).

Every target is a ratio to a reference measured in the same run, never an absolute figure: this
machine's speed moves the absolute figures threefold from one run to the next (a shared two-core
machine, other work running), while the ratios move little. The proxy's time to first token is
judged against the upstream's own (direct), its CPU per streamed chunk against nginx's, the
reference proxy. The printed table has the absolute figures beside the ratios (and so does
proxy-overhead.json under pytest's basetemp).

Run-to-run noise on a shared machine is larger than the margins involved, so the scenarios are
measured several times, interleaved: one stream alternates between the routes request by request; the
50-stream runs go route after route (direct, nginx, retrybench), then again; the long streams run as
pairs, nginx and the proxy back to back, in turn first. The one-stream TTFT and the long streams' CPU per
chunk (the ratio nearest its target) are measured `REPEATS` times; TTFT under load (`LOADED`),
`LOADED_REPEATS` times, as its p99 is pooled over every request of those repeats and sits well inside its
target in each. (The long streams once ran after each route's loaded runs, nginx's and the proxy's some
30 s apart; one run's per-repeat ratios then read 1.45, 1.37, 1.31 and 1.34 in the repeats with loaded
runs and 0.88, 0.88 and 1.03 in those without: pairs taken back to back compare like with like.) TTFT
figures are percentiles over the repeats' requests; CPU per chunk is the median of the per-repeat
figures. Every repeat is in the table.

CPU per chunk is read from the long streams directly, not solved from the 200- and 50-chunk runs
(cpu = a * requests + b * chunks): that solve triples the noise of the 200-chunk run's figure (the
process CPU is counted in 10 ms ticks) and hands any misfit of the per-request term to the chunks.
On one machine, in one run each, it gave the proxy 12.8 us and nginx 8.8 us (1.46x; 1.31-1.62 per
repeat) where 800-chunk streams gave 10.0-10.3 us and 7.1-7.3 us (1.37-1.45x).

Run on its own: pytest benchmarks/perf/test_proxy_overhead.py -p no:xdist (not --benchmark-only: that
skips the table and the target checks).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from overhead import Route, StreamStats, measure, measure_alternating, nginx_available, routes

ONE_STREAM: dict[str, Any] = {"requests": 500, "tokens": 4, "interval_ms": 0.0}  # per route, per repeat
SCENARIOS: dict[str, dict[str, Any]] = {
    "fifty_streams": {"streams": 50, "duration_s": 8.0, "tokens": 200, "interval_ms": 10.0},
    "fifty_short_streams": {"streams": 50, "duration_s": 6.0, "tokens": 50, "interval_ms": 10.0},
    # one request per stream (the streams start spread over 10 s): CPU per chunk, proxies only
    "fifty_long_streams": {"streams": 50, "duration_s": 10.0, "tokens": 1000, "interval_ms": 10.0, "requests": 50},
    "throughput": {"streams": 50, "duration_s": 4.0, "tokens": 2000, "interval_ms": 0.0},
}
ROUTES = ["direct", "nginx", "retrybench"]
LOADED = ("fifty_streams", "fifty_short_streams")  # repeated: TTFT under load
PER_CHUNK = "fifty_long_streams"  # repeated, on the proxies: CPU per chunk
REPEATS = 7  # with five, one fresh-clone CI run in three read 1.58x (a whole-module run here: 1.465x)
# TTFT under load: its p99, pooled over every request of these repeats (about 800 each), read 1.4x direct's
# against the 2.0x target with seven repeats (1.2-1.7x in single ones), and 1.55x with four on a machine
# running other work (1.30-2.05x in single ones). Each repeat more adds about 42 s to CI.
LOADED_REPEATS = 4

# The targets: the proxy's figure over the reference's, from REPEATS interleaved repeats. Measured
# (this module, same code): "quiet" is a machine without the busy loop, "hog" with one holding a core.
#
# Time to first token, one stream at a time, median, over direct's. Measured 1.81 quiet and 1.76 with
# the hog (0.81 / 0.45 ms and 0.80 / 0.45 ms; nginx 1.28 and 0.98); requests alternating between the
# routes gave 1.70-1.86 with none, one and two busy loops (runs taking the routes one after the other
# gave 1.72-2.6: the machine's load changes within seconds). The old absolute target (at most 0.5 ms
# added) was 2.5x direct's 0.32 ms on the quiet machine, so 2.5 keeps its strictness there with a third
# to spare; a proxy that waited on a timer or a flush before sending on, or opened an upstream
# connection per request, adds a whole direct round trip or more (ratio 3 and up) and fails.
TTFT_P50_ONE_STREAM_VS_DIRECT = 2.5
# Time to first token at 50 concurrent streams (5,000 chunks/s), 99th percentile over every request
# of the 50-stream runs, over direct's. Measured 1.4 quiet and 1.4 with the hog (per repeat, 1.2-1.7).
# The old absolute target (at most 5 ms added) was 2.2x direct's 4.1 ms; 2.0 fails a proxy whose loop
# stalls (a synchronous write, a scrape, a long GC pause) for about as long as direct's p99.
TTFT_P99_FIFTY_STREAMS_VS_DIRECT = 2.0
# CPU per streamed chunk (the proxy's whole process) over nginx's, medians of the repeats. Measured,
# solved from the 200- and 50-chunk runs on an earlier machine: 1.23 quiet and 1.34 with the hog
# (24.0 / 19.6 us and 22.6 / 17.0 us; the runs: 1.38 and 1.46). The project's target is 1.5x;
# 1.2x is where it would like to be. With whole-chunk reads told by their size line (http1.SIZE_LINES):
# 1.16 in a whole-module run on a busy machine (27.2 / 23.5 us; per repeat 1.04-1.25); interleaved
# (cpu_per_chunk_ab.py), 1.22 against 1.33 before in four repeats and 1.18 against 1.26 in three (per
# repeat 1.11-1.42). With the compiled per-chunk path (proxy/_whole_chunks.c) and the long streams in
# back-to-back pairs: 1.075 (22.2 / 20.6 us; per repeat 0.87-1.41); interleaved, 1.12 and 1.26 in two
# runs (the Python path 1.19 and 1.30 in the same runs). Single runs on this machine span 1.07-1.27, so
# the asserted target stays 1.5 and the goal is reported (docs/live-stack.md, "Cost per chunk").
CPU_PER_CHUNK_VS_NGINX = 1.5
CPU_PER_CHUNK_VS_NGINX_GOAL = 1.2  # reported, not asserted

# route -> repeat (1-based) -> scenario -> stats
RESULTS: dict[str, dict[int, dict[str, StreamStats]]] = {}
PER_CHUNK_PATH = ["unknown"]  # the proxy's per-chunk path, as its /metrics says


def _per_chunk_path(route: Route) -> str:
    """Which per-chunk path the proxy runs (its /metrics gauge): the table says which one it measured."""
    with urllib.request.urlopen(route.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    line = next((line for line in text.splitlines() if line.startswith("retrybench_proxy_compiled_relay ")), None)
    if line is None:
        return "unknown"
    return "compiled" if float(line.split()[1]) == 1.0 else "python"


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Route]]:
    with routes(tmp_path_factory.mktemp("overhead")) as found:
        by_name = {route.name: route for route in found}
        PER_CHUNK_PATH[0] = _per_chunk_path(by_name["retrybench"])
        yield by_name


def _route(started: dict[str, Route], name: str) -> Route:
    if name not in started:
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    return started[name]


def _assert_streamed(route: str, scenario: str, stats: StreamStats) -> None:
    """Every request got its first bytes, and there were at least as many chunks as requests."""
    assert stats.ttft_ms and stats.chunks >= len(stats.ttft_ms), (
        f"{route}/{scenario}: {len(stats.ttft_ms)} requests answered, {stats.chunks} chunks streamed")


@pytest.mark.parametrize("repeat", range(1, REPEATS + 1))
def test_one_stream(benchmark: Any, started: dict[str, Route], repeat: int) -> None:
    """Time to first token, one request at a time, the routes taking turns."""
    found = list(started.values())
    runs = benchmark.pedantic(measure_alternating, args=(found,), kwargs=ONE_STREAM, rounds=1, iterations=1)
    for name, stats in runs.items():
        _assert_streamed(name, "one_stream", stats)
        RESULTS.setdefault(name, {}).setdefault(repeat, {})["one_stream"] = stats
        benchmark.extra_info[f"{name}_ttft_p50_ms"] = round(stats.summary()["ttft_p50_ms"], 4)


# The first repeat of the 50-stream scenarios, and the throughput, interleaved scenario by scenario.
@pytest.mark.parametrize(("scenario", "route_name"), [(scenario, name) for scenario in SCENARIOS
                                                      if scenario != PER_CHUNK for name in ROUTES])
def test_stream_through(benchmark: Any, started: dict[str, Route], route_name: str, scenario: str) -> None:
    route = _route(started, route_name)
    stats = benchmark.pedantic(measure, args=(route,), kwargs=SCENARIOS[scenario], rounds=1, iterations=1)
    RESULTS.setdefault(route_name, {}).setdefault(1, {})[scenario] = stats
    benchmark.extra_info.update({k: round(v, 4) for k, v in stats.summary().items()})
    _assert_streamed(route_name, scenario, stats)


def _scenarios_of(route_name: str, repeat: int) -> list[str]:
    """What one repeat measures on one route: TTFT under load in the first LOADED_REPEATS, CPU per chunk
    (the proxies only) in every one."""
    return [*(LOADED if repeat <= LOADED_REPEATS else ()), *((PER_CHUNK,) if route_name != "direct" else ())]


# Further repeats of the 50-stream scenarios, interleaved route by route.
@pytest.mark.parametrize(("repeat", "route_name"), [(repeat, name) for repeat in range(2, LOADED_REPEATS + 1)
                                                    for name in ROUTES])
def test_repeat(benchmark: Any, started: dict[str, Route], route_name: str, repeat: int) -> None:
    route = _route(started, route_name)

    def loaded() -> dict[str, StreamStats]:
        return {name: measure(route, **SCENARIOS[name]) for name in LOADED}

    runs = benchmark.pedantic(loaded, rounds=1, iterations=1)
    for name, stats in runs.items():
        _assert_streamed(route_name, name, stats)
    RESULTS.setdefault(route_name, {}).setdefault(repeat, {}).update(runs)


# CPU per chunk: the two proxies back to back in each repeat, nginx first in odd repeats and the proxy first
# in even ones, so that each repeat's ratio compares runs a few seconds apart, whatever ran before them.
@pytest.mark.parametrize("repeat", range(1, REPEATS + 1))
def test_cpu_per_chunk_pair(benchmark: Any, started: dict[str, Route], repeat: int) -> None:
    proxies = [started[name] for name in ("nginx", "retrybench") if name in started]

    def pair() -> dict[str, StreamStats]:
        order = proxies if repeat % 2 else proxies[::-1]
        return {route.name: measure(route, **SCENARIOS[PER_CHUNK]) for route in order}

    runs = benchmark.pedantic(pair, rounds=1, iterations=1)
    for name, stats in runs.items():
        _assert_streamed(name, PER_CHUNK, stats)
        RESULTS.setdefault(name, {}).setdefault(repeat, {})[PER_CHUNK] = stats
        benchmark.extra_info[f"{name}_cpu_us_per_chunk"] = round(1e6 * stats.cpu_s / stats.chunks, 3)


def _cpu_us_per_chunk(repeat: dict[str, StreamStats]) -> float:
    """CPU per chunk, in us: the long streams'."""
    long = repeat[PER_CHUNK]
    return 1e6 * long.cpu_s / long.chunks


def _cpu_us_per_request(repeat: dict[str, StreamStats]) -> float:
    """CPU per request, in us: the one-stream runs' (4 tokens each, their chunks included), read directly,
    not solved as the short streams' CPU less their chunks' share at the long streams' rate: that difference
    of two noisy terms goes negative whenever the long streams' figure comes out high."""
    one = repeat["one_stream"]
    return 1e6 * one.cpu_s / len(one.ttft_ms)


def _ttft(runs: list[StreamStats], percentile: float) -> float:
    return float(np.percentile(np.concatenate([np.asarray(run.ttft_ms) for run in runs]), percentile))


def _figures(route: str, repeats: list[dict[str, StreamStats]]) -> dict[str, float]:
    """TTFT percentiles over the requests of `repeats` (under load: of those that measured it), and
    (for a proxy) the median CPU figures."""
    figures = {"ttft_p50_1_ms": _ttft([r["one_stream"] for r in repeats], 50),
               "ttft_p99_1_ms": _ttft([r["one_stream"] for r in repeats], 99)}
    loaded = [r[name] for r in repeats if LOADED[0] in r for name in LOADED]
    if loaded:
        figures |= {"ttft_p50_50_ms": _ttft(loaded, 50), "ttft_p99_50_ms": _ttft(loaded, 99)}
    if route != "direct":  # direct has no proxy process to measure
        figures["cpu_us_per_chunk"] = float(np.median([_cpu_us_per_chunk(r) for r in repeats]))
        figures["cpu_us_per_request"] = float(np.median([_cpu_us_per_request(r) for r in repeats]))
    return figures


_TABLE: dict[str, Any] = {}


def _table() -> dict[str, Any]:
    """Absolute figures per route (over all repeats, and per repeat) and the proxy's ratios to direct
    and nginx; skips when the measurements above are missing (the module was not run whole)."""
    if _TABLE:
        return _TABLE
    wanted = [name for name in ROUTES if name != "nginx" or nginx_available()]
    missing = [f"{name} repeat {r}" for name in wanted for r in range(1, REPEATS + 1)
               if not {"one_stream", *_scenarios_of(name, r)} <= set(RESULTS.get(name, {}).get(r, {}))]
    if missing:
        pytest.skip(f"needs the measurements above (run the whole module); missing: {', '.join(missing)}")
    table: dict[str, Any] = {"repeats": REPEATS, "routes": {}, "ratios": {}, "per_chunk_path": PER_CHUNK_PATH[0]}
    for name in wanted:
        repeats = [RESULTS[name][r] for r in range(1, REPEATS + 1)]
        overall = _figures(name, repeats)
        throughput = RESULTS[name][1].get("throughput")
        if throughput is not None:
            overall["throughput_chunks_per_s"] = throughput.summary()["chunks_per_s"]
        table["routes"][name] = {"overall": overall, "repeats": [_figures(name, [r]) for r in repeats]}
    ours = table["routes"]["retrybench"]
    for ref in ("direct", "nginx"):
        if ref not in table["routes"]:
            continue
        theirs = table["routes"][ref]
        ratios: dict[str, Any] = {key: value / theirs["overall"][key] for key, value in ours["overall"].items()
                                  if theirs["overall"].get(key)}
        ratios["per_repeat"] = [{key: value / other[key] for key, value in mine.items() if other.get(key)}
                                for mine, other in zip(ours["repeats"], theirs["repeats"], strict=True)]
        table["ratios"][f"retrybench_vs_{ref}"] = ratios
    if "nginx" in table["routes"]:  # nginx's own, for scale
        nginx = table["routes"]["nginx"]["overall"]  # a scenario that failed on nginx is left out, not a KeyError
        table["ratios"]["nginx_vs_direct"] = {
            key: nginx[key] / value for key, value in table["routes"]["direct"]["overall"].items()
            if value and key in nginx}
    _TABLE.update(table)
    return _TABLE


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def test_the_overhead_table(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Print (and save) the absolute figures and the ratios the targets check."""
    table = _table()
    columns = ["ttft_p50_1_ms", "ttft_p99_1_ms", "ttft_p50_50_ms", "ttft_p99_50_ms", "cpu_us_per_chunk",
               "cpu_us_per_request", "throughput_chunks_per_s"]
    lines = [f"\nproxy overhead, absolute figures over {REPEATS} interleaved repeats (TTFT: percentiles of every "
             "repeat's requests; CPU: median of the repeats; ms, us, chunks/s); the proxy's per-chunk path: "
             f"{table['per_chunk_path']}",
             f"{'route':<12}" + "".join(f"{c:>24}" for c in columns)]
    for name, row in table["routes"].items():
        lines.append(f"{name:<12}" + "".join(f"{_fmt(row['overall'].get(c)):>24}" for c in columns))
        for i, repeat in enumerate(row["repeats"], 1):
            lines.append(f"{'  repeat ' + str(i):<12}" + "".join(f"{_fmt(repeat.get(c)):>24}" for c in columns[:-1]))
    targets = {("retrybench_vs_direct", "ttft_p50_1_ms"): TTFT_P50_ONE_STREAM_VS_DIRECT,
               ("retrybench_vs_direct", "ttft_p99_50_ms"): TTFT_P99_FIFTY_STREAMS_VS_DIRECT,
               ("retrybench_vs_nginx", "cpu_us_per_chunk"): CPU_PER_CHUNK_VS_NGINX}
    lines.append(f"\n{'ratio':<46}{'measured':>10}{'per repeat':>26}{'target':>10}")
    for ratio, keys in [("retrybench_vs_direct", ["ttft_p50_1_ms", "ttft_p99_50_ms", "throughput_chunks_per_s"]),
                        ("retrybench_vs_nginx", ["ttft_p50_1_ms", "ttft_p99_50_ms", "cpu_us_per_chunk",
                                                 "cpu_us_per_request", "throughput_chunks_per_s"]),
                        ("nginx_vs_direct", ["ttft_p50_1_ms", "ttft_p99_50_ms", "throughput_chunks_per_s"])]:
        if ratio not in table["ratios"]:
            lines.append(f"{ratio:<46}{'nginx is not installed (apt-get install nginx-light)':>46}")
            continue
        for key in keys:
            per_repeat = [round(r[key], 2) for r in table["ratios"][ratio].get("per_repeat", []) if key in r]
            target = targets.get((ratio, key))
            lines.append(f"{ratio + ' ' + key:<46}{_fmt(table['ratios'][ratio].get(key)):>10}"
                         f"{str(per_repeat) if per_repeat else '':>26}{'<= ' + str(target) if target else '':>10}")
    if "retrybench_vs_nginx" in table["ratios"]:
        cpu = table["ratios"]["retrybench_vs_nginx"]["cpu_us_per_chunk"]
        lines.append(f"CPU per chunk: {cpu:.3f}x nginx's: {cpu - CPU_PER_CHUNK_VS_NGINX_GOAL:+.3f} from the "
                     f"{CPU_PER_CHUNK_VS_NGINX_GOAL}x goal ({100 * (cpu / CPU_PER_CHUNK_VS_NGINX_GOAL - 1):+.1f}%), "
                     f"{CPU_PER_CHUNK_VS_NGINX - cpu:+.3f} under the {CPU_PER_CHUNK_VS_NGINX}x target")
    print("\n".join(lines))
    out = Path(tmp_path_factory.getbasetemp()) / "proxy-overhead.json"
    out.write_text(json.dumps(table, indent=1))


def test_time_to_first_token_of_one_stream_against_direct() -> None:
    table = _table()
    ours, direct = table["routes"]["retrybench"]["overall"], table["routes"]["direct"]["overall"]
    ratio = table["ratios"]["retrybench_vs_direct"]["ttft_p50_1_ms"]
    assert ratio <= TTFT_P50_ONE_STREAM_VS_DIRECT, (
        f"median TTFT with one stream: proxy {ours['ttft_p50_1_ms']:.3f} ms, direct {direct['ttft_p50_1_ms']:.3f} ms"
        f" (alternating, {REPEATS} x {ONE_STREAM['requests']} requests each): {ratio:.2f}x direct, over the "
        f"{TTFT_P50_ONE_STREAM_VS_DIRECT}x target")


def test_p99_time_to_first_token_at_fifty_streams_against_direct() -> None:
    table = _table()
    ours, direct = table["routes"]["retrybench"]["overall"], table["routes"]["direct"]["overall"]
    ratio = table["ratios"]["retrybench_vs_direct"]["ttft_p99_50_ms"]
    per_repeat = [round(r["ttft_p99_50_ms"], 2) for r in table["ratios"]["retrybench_vs_direct"]["per_repeat"]
                  if "ttft_p99_50_ms" in r]
    assert ratio <= TTFT_P99_FIFTY_STREAMS_VS_DIRECT, (
        f"p99 TTFT at 50 streams: proxy {ours['ttft_p99_50_ms']:.3f} ms, direct {direct['ttft_p99_50_ms']:.3f} ms "
        f"(every request of {LOADED_REPEATS} repeats): {ratio:.2f}x direct (per repeat {per_repeat}), over the "
        f"{TTFT_P99_FIFTY_STREAMS_VS_DIRECT}x target")


def test_cpu_per_chunk_against_nginx() -> None:
    if not nginx_available():
        pytest.skip("nginx is not installed, so there is no reference for CPU per chunk (apt-get install "
                    "nginx-light); the ratios to direct are still checked")
    table = _table()
    ours, nginx = table["routes"]["retrybench"], table["routes"]["nginx"]
    ratio = table["ratios"]["retrybench_vs_nginx"]["cpu_us_per_chunk"]
    assert ratio <= CPU_PER_CHUNK_VS_NGINX, (
        f"CPU per streamed chunk: proxy {ours['overall']['cpu_us_per_chunk']:.2f} us, nginx "
        f"{nginx['overall']['cpu_us_per_chunk']:.2f} us (medians of {REPEATS} repeats; per repeat: proxy "
        f"{[round(r['cpu_us_per_chunk'], 2) for r in ours['repeats']]}, nginx "
        f"{[round(r['cpu_us_per_chunk'], 2) for r in nginx['repeats']]}): {ratio:.2f}x nginx's, over the "
        f"{CPU_PER_CHUNK_VS_NGINX}x target")


def test_nginx_is_compared_where_installed() -> None:
    """Say plainly when the nginx column is missing, rather than leaving it out silently."""
    if not nginx_available():
        pytest.skip("nginx is not installed: the table compares the proxy with direct only")
    assert "nginx" in RESULTS or not RESULTS, "nginx is installed but was not measured"
