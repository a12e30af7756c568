"""The load generator's own send lateness (pytest-benchmark): it must not be a live run's bottleneck.

Poisson arrivals at 300 calls/s for 3 s (above the reduced-scale diagnostic's peak rate), 2,000-token
prompts, against the stub upstream in its own process. Target: p99 lateness <= 2 ms.

Run on its own: pytest benchmarks/perf -p no:xdist
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from retrybench.config import ClientPolicy, WorkloadSpec
from retrybench.live.launch import ServerProcess, free_port
from retrybench.live.loadgen import LoadgenSettings, run_loadgen
from retrybench.workload import Call, Trace

SPEC = WorkloadSpec(chat_calls_per_s=1.0, prompt_tokens_mean=2000.0, prompt_tokens_sd=0.0, shared_prefix_tokens=64)
CLIENT = ClientPolicy(max_retries=0, attempt_timeout_s=5.0)


def test_send_lateness_at_300_sends_per_second(benchmark: Any, tmp_path: Path) -> None:
    arrivals = np.cumsum(np.random.default_rng(3).exponential(1 / 300, 900)).tolist()
    calls = tuple(Call(index=i, call_id=f"call-0-{i:06d}", arrival_s=t, prompt_tokens=2000, response_tokens=8,
                       phase="base") for i, t in enumerate(arrivals))  # fmt: skip
    trace = Trace(spec=SPEC, seed=0, calls=calls)
    port = free_port()
    with ServerProcess([sys.executable, "-m", "retrybench.live.stub_upstream", "--port", str(port)],
                       health_url=f"http://127.0.0.1:{port}/health", log_path=tmp_path / "stub.log"):
        settings = LoadgenSettings(target=f"http://127.0.0.1:{port}", client=CLIENT)
        result = benchmark.pedantic(run_loadgen, args=(trace, settings, None), rounds=1, iterations=1)
    lateness = result.meta["send_lateness"]
    benchmark.extra_info.update(lateness)
    print(f"\nsend lateness over {lateness['n']} sends: p50 {lateness['p50_ms']:.3f} ms, "
          f"p99 {lateness['p99_ms']:.3f} ms, max {lateness['max_ms']:.3f} ms")
    assert lateness["n"] == 900 and all(c.delivered_s is not None for c in result.calls)
    assert lateness["p99_ms"] <= 2.0, lateness
