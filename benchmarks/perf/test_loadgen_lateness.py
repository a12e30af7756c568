"""The load generator's own send lateness (pytest-benchmark): it must not be a live run's bottleneck.

Poisson arrivals at 300 calls/s for 3 s (above the reduced-scale diagnostic's peak rate), 2,000-token
prompts, against the stub upstream in its own process.

Lateness (how long after its due time an attempt is sent) is mostly this machine's: a busy machine
preempts the process and delays its timers whoever sends. So the target is a ratio to a reference
measured in the same run, in the same process, against the same upstream: a bare open-loop sender
(`reference_sends`) that sends the same bodies at the same times, waiting for each send as the load
generator does (a loop timer to 1 ms before, then yielding to the loop until due) and reading each
stream to its end, with nothing else to do: no retrying client, no records, no bodies to build.
What the load generator adds over it is its own cost. The two alternate, `REPEATS` times each, and
the medians of their p99s are compared; the absolute figures are printed beside the ratio.

Run on its own: pytest benchmarks/perf -p no:xdist
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from retrybench.conditions.config import ClientPolicy, WorkloadSpec
from retrybench.loadgen.loadgen import LoadgenSettings, LoadResult, SendLateness, run_loadgen
from retrybench.serving.aio import run_event_loop
from retrybench.serving.launch import ServerProcess, free_port
from retrybench.traffic.workload import Call, Trace

SPEC = WorkloadSpec(chat_calls_per_s=1.0, prompt_tokens_mean=2000.0, prompt_tokens_sd=0.0, shared_prefix_tokens=64)
CLIENT = ClientPolicy(max_retries=0, attempt_timeout_s=5.0)
REPEATS = 3
SPIN_S = 0.001  # as the load generator: wake 1 ms early (loop timers have 1 ms resolution), then yield until due
LEAD_S = 0.05  # as the load generator: time 0 is this long after the start

# The target: the load generator's p99 lateness at most 2x the bare sender's (medians of REPEATS runs
# each). Measured: 0.67 and 0.72 with other work on the machine (load average 1.7: loadgen p99 medians
# 1.05 / 0.93 ms against the reference's 1.46 / 1.38 ms) and 1.10 and 1.11 with a busy loop holding a
# core (4.53 / 4.11 ms and 0.92 / 0.83 ms); between two consecutive runs the p99 itself moved from 0.9
# to 4.9 ms, the ratio did not. The old absolute target, 2 ms, was 1.4-2x the reference's p99 on a
# quiet machine, so 2x keeps its strictness there. A load generator that did its own work in the way
# of its sends (building a 2,000-token body takes about 1 ms, a full garbage collection tens of ms)
# is late by that much at the p99 and fails.
P99_VS_REFERENCE = 2.0
# The loop's timers have 1 ms resolution, so neither sender resolves lateness below that: the reference's
# p99 counts as at least 1 ms, lest a near-zero reference turn a sub-millisecond difference into a ratio.
REFERENCE_FLOOR_MS = 1.0


def _trace() -> Trace:
    arrivals = np.cumsum(np.random.default_rng(3).exponential(1 / 300, 900)).tolist()
    calls = tuple(Call(index=i, call_id=f"call-0-{i:06d}", arrival_s=t, prompt_tokens=2000, response_tokens=8,
                       phase="base") for i, t in enumerate(arrivals))  # fmt: skip
    return Trace(spec=SPEC, seed=0, calls=calls)


def reference_sends(trace: Trace, target: str) -> SendLateness:
    """Send `trace`'s calls at their arrival times with nothing else to do; the lateness summary."""
    url = target + "/v1/completions"
    bodies = [json.dumps({"model": "retrybench", "prompt": trace.prompt_token_ids(c.index),
                          "max_tokens": c.response_tokens, "ignore_eos": True, "stream": True,
                          "stream_options": {"include_usage": True}}, separators=(",", ":")).encode()
              for c in trace.calls]  # fmt: skip
    lateness_ms: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:

            async def send(call: Call, due: float) -> None:
                headers = {"Authorization": "Bearer retrybench", "Idempotency-Key": call.call_id,
                           "X-Retrybench-Attempt": "0", "Content-Type": "application/json"}
                while time.monotonic() < due:
                    await asyncio.sleep(0)
                lateness_ms.append((time.monotonic() - due) * 1e3)
                async with session.post(url, data=bodies[call.index], headers=headers) as response:
                    async for _ in response.content:
                        pass
                    if response.status != 200:
                        raise RuntimeError(f"the reference sender got HTTP {response.status}")

            t0 = time.monotonic() + LEAD_S
            tasks = []
            for call in trace.calls:
                due = t0 + call.arrival_s
                if (wait := due - SPIN_S - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                tasks.append(loop.create_task(send(call, due)))
            await asyncio.gather(*tasks)

    run_event_loop(main)
    late = np.asarray(lateness_ms)
    return {"p50_ms": float(np.percentile(late, 50)), "p99_ms": float(np.percentile(late, 99)),
            "max_ms": float(late.max()), "n": int(late.size)}


def test_send_lateness_at_300_sends_per_second(benchmark: Any, tmp_path: Path) -> None:
    trace = _trace()
    port = free_port()
    runs: list[tuple[SendLateness, SendLateness]] = []  # (reference, load generator) per repeat
    with ServerProcess([sys.executable, "-m", "fixtures.stub_upstream", "--port", str(port)],
                       health_url=f"http://127.0.0.1:{port}/health", log_path=tmp_path / "stub.log"):
        target = f"http://127.0.0.1:{port}"
        settings = LoadgenSettings(target=target, client=CLIENT)
        for repeat in range(REPEATS):
            gc.collect()  # each run starts from the same heap: a full collection in one costs tens of ms
            reference = reference_sends(trace, target)
            gc.collect()
            if repeat == 0:
                result: LoadResult = benchmark.pedantic(run_loadgen, args=(trace, settings, None), rounds=1,
                                                        iterations=1)
            else:
                result = run_loadgen(trace, settings, None)
            assert result.meta["send_lateness"]["n"] == 900 and all(c.delivered_s is not None for c in result.calls)
            runs.append((reference, result.meta["send_lateness"]))
    reference_p99 = float(np.median([reference["p99_ms"] for reference, _ in runs]))
    ours_p99 = float(np.median([ours["p99_ms"] for _, ours in runs]))
    ratio = ours_p99 / max(reference_p99, REFERENCE_FLOOR_MS)
    lines = [f"\nsend lateness at 300 sends/s, {REPEATS} interleaved runs of 900 sends each (ms):",
             f"{'run':<6}{'sender':<12}{'p50':>8}{'p99':>8}{'max':>8}"]
    for i, (reference, ours) in enumerate(runs, 1):
        for name, row in (("reference", reference), ("loadgen", ours)):
            lines.append(f"{i:<6}{name:<12}{row['p50_ms']:>8.3f}{row['p99_ms']:>8.3f}{row['max_ms']:>8.3f}")
    lines.append(f"median p99: loadgen {ours_p99:.3f} ms, reference {reference_p99:.3f} ms (floor "
                 f"{REFERENCE_FLOOR_MS} ms): ratio {ratio:.2f}, target <= {P99_VS_REFERENCE}")
    print("\n".join(lines))
    benchmark.extra_info.update({"loadgen_p99_ms": ours_p99, "reference_p99_ms": reference_p99,
                                 "p99_vs_reference": ratio, "runs": runs})
    assert ratio <= P99_VS_REFERENCE, (
        f"the load generator's p99 send lateness is {ours_p99:.3f} ms against {reference_p99:.3f} ms for a bare "
        f"sender at the same schedule in the same process (medians of {REPEATS} runs; per run, loadgen "
        f"{[round(o['p99_ms'], 3) for _, o in runs]}, reference {[round(r['p99_ms'], 3) for r, _ in runs]}): "
        f"{ratio:.2f}x, over the {P99_VS_REFERENCE}x target")
