"""vLLM engine arguments from a run spec, the executable lookup, the process command, and the pytest options.

No vLLM runs here: the arguments are checked as data, and the fixtures' skip logic in an inner session.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from fixtures.engines import container_skip_reason, process_model_skip_reason

from retrybench.cli.doctor import Probe
from retrybench.plan.spec import RunSpec
from retrybench.realvllm.vllm import (
    TRACING_ASYNC_SCHEDULER,
    TRACING_SCHEDULER,
    VllmArgs,
    for_cpu,
    model_id,
    vllm_args_for,
    vllm_command,
    vllm_process,
)
from retrybench.realvllm.vllm_locate import DEFAULT_IMAGE, vllm_executable


def spec(condition: str = "no-control", **overrides: object) -> RunSpec:
    return RunSpec(model="qwen2.5-7b-instruct", condition=condition, seed=0, **overrides)  # type: ignore[arg-type]


def flag(argv: list[str], name: str) -> str | None:
    """The value after `name` (the last one: vLLM's parser keeps the last), or None when absent."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]
    return values[-1] if values else None


def test_the_papers_engine_arguments() -> None:
    assert vllm_args_for(spec()).argv() == [
        "Qwen/Qwen2.5-7B-Instruct", "--max-num-batched-tokens", "8192", "--max-num-seqs", "256",
        "--max-model-len", "32768", "--gpu-memory-utilization", "0.90", "--enable-prefix-caching",
        "--served-model-name", "retrybench", "--host", "127.0.0.1", "--port", "8000"]


@pytest.mark.parametrize(("key", "hf_id"), [("qwen2.5-7b-instruct", "Qwen/Qwen2.5-7B-Instruct"),
                                            ("qwen3-14b", "Qwen/Qwen3-14B"),
                                            ("llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"),
                                            ("/models/tiny", "/models/tiny"), ("org/other", "org/other")])
def test_model_keys_map_to_hugging_face_ids(key: str, hf_id: str) -> None:
    assert model_id(key) == hf_id


def test_step_size_comes_from_the_spec() -> None:
    assert flag(vllm_args_for(spec(max_batched_tokens=2048)).argv(), "--max-num-batched-tokens") == "2048"


def test_queue_cap_comes_from_the_condition_or_the_spec() -> None:
    assert flag(vllm_args_for(spec()).argv(), "--max-num-queued-reqs") is None
    assert flag(vllm_args_for(spec("engine-cap-100")).argv(), "--max-num-queued-reqs") == "100"
    assert flag(vllm_args_for(spec("engine-cap-100", engine_cap=7)).argv(), "--max-num-queued-reqs") == "7"


def test_auto_cap_is_ceil_120_chat_and_needs_chat() -> None:
    # as the simulator resolves it: spec.engine_config_for, ceil(120 x C-hat)
    assert vllm_args_for(spec("engine-cap-338"), chat=2.81).max_num_queued_reqs == 338
    with pytest.raises(ValueError, match="pass chat"):
        vllm_args_for(spec("engine-cap-338"))
    assert vllm_args_for(spec("engine-cap-338", engine_cap=5)).max_num_queued_reqs == 5  # override: no chat needed


def test_tracing_selects_the_tracing_scheduler() -> None:
    assert vllm_args_for(spec()).scheduler_cls is None
    args = vllm_args_for(spec(trace=True))
    assert flag(args.argv(), "--scheduler-cls") == TRACING_ASYNC_SCHEDULER and args.tracing
    assert vllm_args_for(spec(trace=True), async_scheduling=False).scheduler_cls == TRACING_SCHEDULER


def test_model_override_and_extra_args_come_last() -> None:
    args = vllm_args_for(spec(), model="/tmp/tiny", port=9001,
                         extra=("--dtype", "float32", "--max-model-len", "4096"))
    argv = args.argv()
    assert argv[0] == "/tmp/tiny" and flag(argv, "--port") == "9001"
    assert argv[-4:] == ["--dtype", "float32", "--max-model-len", "4096"]
    assert flag(argv, "--max-model-len") == "4096"  # the extra value wins


def test_cpu_build_runs_eager_with_the_synchronous_scheduler() -> None:
    args = for_cpu(vllm_args_for(spec(trace=True)))
    assert args.extra == ("--enforce-eager",) and args.scheduler_cls == TRACING_SCHEDULER
    assert for_cpu(args) == args  # idempotent
    assert for_cpu(VllmArgs(model="m")).scheduler_cls is None


def test_executable_lookup_order(tmp_path: Path) -> None:
    src = tmp_path / "src"
    venv = tmp_path / ".venv-vllm" / "bin" / "vllm"

    def which(name: str) -> str | None:
        return "/usr/bin/vllm" if name == "vllm" else None

    assert vllm_executable({}, src, which) == "/usr/bin/vllm"
    assert vllm_executable({}, src, lambda name: None) is None
    venv.parent.mkdir(parents=True)
    venv.write_text("")
    assert vllm_executable({}, src, which) == str(venv)
    assert vllm_executable({"RETRYBENCH_VLLM": "/opt/v/bin/vllm"}, src, which) == "/opt/v/bin/vllm"


def test_process_command_and_environment(tmp_path: Path) -> None:
    args = vllm_args_for(spec("engine-cap-100", trace=True), model="/tmp/tiny", port=9002)
    server = vllm_process(args, log_path=tmp_path / "vllm.log", executable="/x/vllm",
                          trace_path=tmp_path / "trace.jsonl", env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert server.argv[:3] == ["/x/vllm", "serve", "/tmp/tiny"]
    assert "--enforce-eager" in server.argv and flag(server.argv, "--scheduler-cls") == TRACING_SCHEDULER
    assert server.health_url == "http://127.0.0.1:9002/health"
    assert server.env == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
                          "RETRYBENCH_VLLM_TRACE": str(tmp_path / "trace.jsonl")}
    gpu = vllm_process(vllm_args_for(spec()), log_path=tmp_path / "g.log", executable="vllm", cpu=False)
    assert gpu.argv == vllm_command("vllm", vllm_args_for(spec())) and gpu.env == {}
    with pytest.raises(ValueError, match="trace_path"):
        vllm_process(args, log_path=tmp_path / "vllm.log", executable="/x/vllm")


def test_process_model_skip_reasons(tmp_path: Path) -> None:
    assert "--vllm-model" in (process_model_skip_reason(None, tmp_path) or "")
    assert "no such directory" in (process_model_skip_reason(str(tmp_path / "absent"), tmp_path) or "")
    assert process_model_skip_reason(str(tmp_path), tmp_path) is None
    assert "huggingface-cli download Org/M" in (process_model_skip_reason("Org/M", tmp_path) or "")
    (tmp_path / "hub" / "models--Org--M").mkdir(parents=True)
    assert process_model_skip_reason("Org/M", tmp_path) is None


def probe(**overrides: object) -> Probe:
    fields: dict[str, object] = dict(versions={"testcontainers": "4.15.0"}, docker_engine=True, gpus=1,
                                     image_present=True, hf_home="/hf", models=1)
    return Probe(**{**fields, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"versions": {}}, "testcontainers is not installed"),
    ({"docker_engine": False}, "no Docker engine answers"),
    ({"gpus": 0}, "no GPU"),
    ({"image_present": False}, f"the image {DEFAULT_IMAGE} is not in the local engine"),
    ({"models": 0}, "no model in the Hugging Face cache"),
])
def test_container_skip_reasons_are_doctors(overrides: dict[str, object], reason: str) -> None:
    assert container_skip_reason(probe()) is None
    assert reason in (container_skip_reason(probe(**overrides)) or "")


INNER = '''
import os
from fixtures.engines import selected_engine, selected_model


def test_choice(pytestconfig):
    print("ENGINE", selected_engine(pytestconfig), "MODEL", selected_model(pytestconfig))


def test_process(vllm_process):
    raise AssertionError("the fixture should have skipped")
'''


@pytest.mark.parametrize("engine", ["sim", "vllm-container", "http://10.0.0.5:8000"])
def test_engine_option(engine: str, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYBENCH_VLLM", "/nonexistent/vllm")
    monkeypatch.delenv("RETRYBENCH_VLLM_MODEL", raising=False)
    pytester.makeconftest('pytest_plugins = ["fixtures.engines"]\n')
    pytester.makepyfile(test_inner=textwrap.dedent(INNER))
    args = ["-p", "no:cacheprovider", "-p", "no:xdist", "-s", "-rs", "--model", "qwen3-14b"]
    result = pytester.runpytest_inprocess(*args, *([] if engine == "sim" else ["--engine", engine]))
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([f"*ENGINE {engine} MODEL qwen3-14b*", "*SKIPPED*no model for the vLLM process*"])


def test_unknown_engine_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["fixtures.engines"]\n')
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--engine", "vllm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'vllm' is not one of sim, engine-server, vllm-process, vllm-container*"])


PLUMBING = '''
import pytest
from fixtures.engine_runs import active


@pytest.mark.parametrize("model", ["qwen2.5-7b-instruct", "qwen3-14b"])
def test_runs_come_from(model):
    live = active()
    print("RUNS", model, "live" if live else "sim", live.engine if live else "-", live.time_scale if live else "-")
'''


@pytest.mark.parametrize("engine", ["sim", "engine-server"])
def test_a_live_engine_takes_over_the_finding_runs_and_model_selects(engine: str, pytester: pytest.Pytester,
                                                                    tmp_path: Path) -> None:
    pytester.makeconftest('pytest_plugins = ["fixtures.engines"]\n')
    pytester.makepyfile(test_inner=textwrap.dedent(PLUMBING))
    # --opt=value: pytest finds the conftest that adds these options only after a first look at the
    # arguments, in which an unknown option's separate value would pass for a path.
    args = ["-p", "no:cacheprovider", "-p", "no:xdist", "-s", "--model=qwen3-14b", f"--engine-log-dir={tmp_path}",
            *([] if engine == "sim" else [f"--engine={engine}", "--live-time-scale=0.1"])]
    result = pytester.runpytest_inprocess(*args)
    result.assert_outcomes(passed=1, deselected=1)
    expected = "*RUNS qwen3-14b sim - -*" if engine == "sim" else "*RUNS qwen3-14b live engine-server 0.1*"
    result.stdout.fnmatch_lines([expected])
    from fixtures.engine_runs import active

    assert active() is None  # the session's end closed it


def test_a_live_session_skips_the_findings_that_read_the_engine_trace(tmp_path: Path) -> None:
    from fixtures.engine_runs import LiveRuns

    runs = LiveRuns("http://127.0.0.1:9", directory=tmp_path)
    with pytest.raises(pytest.skip.Exception, match="engine trace"):
        runs.result(RunSpec(model="qwen2.5-7b-instruct", condition="retries-on-cancel-on", seed=1, trace=True))


def test_a_real_vllm_runs_at_the_papers_c_hat_and_the_engine_server_at_its_own(tmp_path: Path) -> None:
    from fixtures.engine_runs import LiveRuns

    spec = RunSpec(model="qwen3-14b", condition="retry-budget", seed=1)
    assert LiveRuns("vllm-container", directory=tmp_path).chat(spec) == 1.09  # Table 2
    simulated = LiveRuns("engine-server", directory=tmp_path).chat(spec)
    assert simulated != 1.09 and abs(simulated - 1.09) < 0.1
