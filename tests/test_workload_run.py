"""A recorded workload as a run: its fields in RunSpec (left out at their defaults, so paper runs keep their
cache keys; the file's digest and the options in the key otherwise), the trace a run computes from it, and
`retrybench run --workload FILE` end to end on the simulated engine (C-hat fixed, not calibrated)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from retrybench.calibration import store
from retrybench.calibration.store import EngineBuild
from retrybench.cli.main import main
from retrybench.conditions.config import ConfigError
from retrybench.plan.recorded import trace_for, workload_fields
from retrybench.plan.spec import WORKLOAD_DEFAULTS, RunSpec
from retrybench.records.cache import code_version, write_entry
from retrybench.records.runlog import RunLog
from retrybench.traffic.recorded import Pulse
from retrybench.traffic.workload import generate_trace
from retrybench.traffic.workload_file import WorkloadFileError

QWEN = "qwen2.5-7b-instruct"
CHAT = 2.7116906833687042  # tests/sim/test_digests.py's C-hat of this model
CONDITION = "retries-on-cancel-on"
TRACE = """arrival_s,prompt_tokens,output_tokens,prefix_tokens
0.0,4000,200,1000
0.5,3000,100,1000
2.0,5000,50,1000
9.0,2500,300,1000
"""


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(TRACE)
    return path


def recorded_spec(path: Path, **options: Any) -> RunSpec:
    return RunSpec(model=QWEN, condition=CONDITION, seed=1, **workload_fields(path, None, gpus=("h100",), **options))


def test_a_paper_spec_keeps_its_record_and_key() -> None:
    plain = RunSpec(model=QWEN, condition=CONDITION, seed=1)
    assert not set(WORKLOAD_DEFAULTS) & set(plain.as_dict())
    old_record = {"model": QWEN, "condition": CONDITION, "seed": 1, "gpu": "h100", "pulse_x": 2.7,
                  "max_batched_tokens": 8192, "mixed_prompts": False, "engine_cap": None, "trace": False,
                  "token_scale": 1.0}
    text = json.dumps({"spec": old_record, "code": code_version()}, sort_keys=True)
    assert plain.key() == hashlib.sha256(text.encode()).hexdigest()[:24]  # the key it had before
    assert set(plain.as_dict()) == {"model", "condition", "seed", "gpu", "pulse_x", "max_batched_tokens",
                                    "mixed_prompts", "engine_cap", "trace", "token_scale"}


def test_the_file_s_digest_and_the_options_are_in_the_key(trace_file: Path) -> None:
    spec = recorded_spec(trace_file)
    record = spec.as_dict()
    assert record["workload_file"] == str(trace_file) and record["workload_format"] == "own"
    assert len(record["workload_digest"]) == 64 and "rate_x" not in record and "pulses" not in record
    keys = {spec.key(), RunSpec(model=QWEN, condition=CONDITION, seed=1).key(),
            replace(spec, rate_x=0.6).key(), replace(spec, pulses=((10.0, 5.0, 2.0),)).key(),
            replace(spec, workload_digest="0" * 64).key()}
    assert len(keys) == 5
    pulsed = recorded_spec(trace_file, rate_x=0.6, pulses=[Pulse(10.0, 5.0, 2.0)])
    assert pulsed.as_dict()["pulses"] == [[10.0, 5.0, 2.0]] and pulsed.as_dict()["rate_x"] == 0.6
    assert RunSpec(**json.loads(json.dumps(pulsed.as_dict()))) == pulsed  # a record read back is the same spec


@pytest.mark.parametrize(("change", "message"), [
    ({"rate_x": 0.6}, "need a recorded workload"),
    ({"pulses": ((1.0, 2.0, 3.0),)}, "need a recorded workload"),
    ({"workload_file": "x.csv"}, "needs its content digest and format"),
])
def test_recorded_fields_without_a_recorded_workload_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunSpec(model=QWEN, condition=CONDITION, seed=1, **change)


@pytest.mark.parametrize(("change", "message"), [
    ({"pulse_x": 3.0}, "pulse_x is the paper's pulse"), ({"mixed_prompts": True}, "mixed_prompts and token_scale"),
    ({"token_scale": 0.5}, "mixed_prompts and token_scale"), ({"rate_x": 0.0}, "rate_x must be in"),
    ({"pulses": ((1.0, 0.0, 3.0),)}, "a pulse needs"),
])
def test_options_of_the_paper_s_trace_do_not_go_with_a_recorded_one(trace_file: Path, change: dict[str, Any],
                                                                     message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        replace(recorded_spec(trace_file), **change)


def test_the_run_s_trace_is_the_file_s_and_a_changed_file_is_refused(trace_file: Path) -> None:
    spec = recorded_spec(trace_file, pulses=[Pulse(3.0, 4.0, 2.0)])
    trace = trace_for(spec, CHAT)
    base = [c for c in trace.calls if c.phase == "base"]
    assert [(c.arrival_s, c.prompt_tokens, c.response_tokens) for c in base] == [
        (0.0, 4000, 200), (0.5, 3000, 100), (2.0, 5000, 50), (9.0, 2500, 300)]
    assert any(c.phase == "pulse" for c in trace.calls) and trace.spec.shared_prefix_tokens == 1000
    paper = RunSpec(model=QWEN, condition=CONDITION, seed=1)
    assert trace_for(paper, CHAT) == generate_trace(paper.workload(CHAT), 1)
    trace_file.write_text(TRACE.replace("9.0,", "9.5,"))
    with pytest.raises(ConfigError, match="the file changed since the run was specified"):
        trace_for(spec, CHAT)


def test_a_call_longer_than_the_engine_s_max_model_length_is_refused_not_clipped(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,1000,10\n1,32000,769\n")
    with pytest.raises(WorkloadFileError, match=r"long\.csv: line 3: prompt_tokens: 32000 prompt \+ 769 output tokens "
                                                r"exceed the engine's max model length \(32768\)"):
        workload_fields(path, None, gpus=("h100",))


# -- retrybench run --workload --------------------------------------------------------------------------


@pytest.fixture
def fixed_chat(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "calibration_of", lambda *args, **kwargs: {"chat": CHAT})


def run(*args: str) -> Any:
    return CliRunner().invoke(main, ["run", "--condition", CONDITION, "--model", QWEN, "--json", *args])


@pytest.mark.usefixtures("fixed_chat")
def test_run_replays_the_file_with_its_bursts(trace_file: Path, tmp_path: Path) -> None:
    engine_trace = tmp_path / "engine.jsonl"
    result = run("--workload", str(trace_file), "--pulse", "3:4:2", "--trace", str(engine_trace))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["workload_format"] == summary["spec"]["workload_format"] == "own"
    assert summary["pulses"] == [[3.0, 4.0, 2.0]] and "rate_x" not in summary
    log = RunLog.from_json(Path(summary["run_log"]).read_text())
    arrivals = [c.arrival_s for c in log.calls]
    assert {0.0, 0.5, 2.0, 9.0} <= set(arrivals)
    bursts = [t for t in arrivals if t not in {0.0, 0.5, 2.0, 9.0}]
    assert bursts and all(3.0 <= t < 7.0 for t in bursts)
    assert summary["calls"] == len(arrivals) == 4 + len(bursts) and summary["calls_delivered"] == summary["calls"]
    assert (log.meta["pulse_start_s"], log.meta["pulse_end_s"], log.meta["hold_end_s"]) == (3.0, 7.0, 9.0)


@pytest.mark.usefixtures("fixed_chat")
def test_run_caches_by_the_file_s_content(trace_file: Path) -> None:
    first = run("--workload", str(trace_file), "--rate-x", "0.6")
    again = run("--workload", str(trace_file), "--rate-x", "0.6")
    assert first.exit_code == again.exit_code == 0, first.output + again.output
    assert json.loads(again.stdout)["wall_s"] == json.loads(first.stdout)["wall_s"]  # the cached result
    trace_file.write_text(TRACE.replace("2500,300", "2500,301"))
    changed = run("--workload", str(trace_file), "--rate-x", "0.6")
    assert changed.exit_code == 0, changed.output
    assert json.loads(changed.stdout)["workload_digest"] != json.loads(first.stdout)["workload_digest"]


@pytest.mark.usefixtures("fixed_chat")
@pytest.mark.parametrize(("args", "message"), [
    (["--pulse", "3:4:2"], "--pulse go with --workload"),
    (["--rate-x", "0.5"], "--rate-x go with --workload"),
    (["--workload", "{bad}"], "bad.csv: line 3: output_tokens: not a whole number: 'x'"),
    (["--workload", "{good}", "--pulse-x", "3"], "--pulse-x is the paper's pulse"),
    (["--workload", "{good}", "--pulse-x", "2.7"], "--pulse-x is the paper's pulse"),
    (["--workload", "{good}", "--token-scale", "0.5"], "mixed_prompts and token_scale change the paper's trace"),
    (["--workload", "{good}", "--pulse", "3:4"], "give AT:DURATION:X"),
    (["--workload", "{good}", "--workload-format", "azure"], "missing required column 'TIMESTAMP'"),
])
def test_run_refuses_a_bad_file_or_option_before_any_run(args: list[str], message: str, trace_file: Path,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,10,x\n")
    monkeypatch.setattr(store, "calibration_of", lambda *a, **k: pytest.fail("a refused run calibrated"))
    result = run(*(a.format(bad=bad, good=trace_file) for a in args))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())


# -- retrybench sweep --workload ------------------------------------------------------------------------


@pytest.fixture
def seeded_chat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """C-hat in the cache itself, where a sweep's worker processes read it too."""
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    write_entry(EngineBuild(QWEN).path(), {"chat": CHAT})


@pytest.mark.usefixtures("seeded_chat")
def test_a_sweep_over_rate_x_runs_the_file_at_each_rate(trace_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["sweep", "--condition", CONDITION, "--axis", "rate_x=0.5,1", "--model", QWEN,
                                       "--jobs", "1", "--workload", str(trace_file), "--pulse", "3:4:2",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert [row["rate_x"] for row in rows] == [0.5, 1.0] and not any(row.get("error") for row in rows)
    for row in rows:
        spec = recorded_spec(trace_file, rate_x=row["rate_x"], pulses=[Pulse(3.0, 4.0, 2.0)])
        assert row["key"] == spec.key()  # the very run `retrybench run --workload ... --rate-x` computes


@pytest.mark.usefixtures("seeded_chat")
def test_a_sweep_over_rate_x_needs_a_workload(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["sweep", "--condition", CONDITION, "--axis", "rate_x=0.5,1", "--model", QWEN,
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "rate_x need a recorded workload" in " ".join(result.stderr.split())


def test_the_engine_server_does_not_replay_a_recorded_workload(trace_file: Path) -> None:
    result = run("--workload", str(trace_file), "--engine", "engine-server")
    assert result.exit_code == 2 and "--workload runs on the simulated engine" in " ".join(result.stderr.split())


@pytest.mark.usefixtures("fixed_chat")
def test_the_table_shows_the_bursts_in_place_of_the_paper_s_pulse(trace_file: Path) -> None:
    bursts = CliRunner().invoke(main, ["run", "--condition", CONDITION, "--model", QWEN, "--workload", str(trace_file),
                                       "--pulse", "3:4:2", "--pulse", "8:1:1.5"])
    assert bursts.exit_code == 0, bursts.output
    assert "3:4:2 8:1:1.5" in bursts.stdout and "2.7" not in bursts.stdout
    plain = CliRunner().invoke(main, ["run", "--condition", CONDITION, "--model", QWEN, "--workload", str(trace_file)])
    assert plain.exit_code == 0, plain.output
    [row] = [line for line in plain.stdout.splitlines() if QWEN in line]
    assert [cell.strip() for cell in row.split("│")][4] == "-"  # model, condition, seed, then the pulse column


@pytest.mark.usefixtures("fixed_chat")
@pytest.mark.parametrize(("name", "text", "calls"), [
    ("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,4808,10\n"
                  "2023-11-16 18:15:50.9951690,3180,8\n2023-11-16 18:15:47.0000000,110,27\n",
     [(4808, 10), (110, 27), (3180, 8)]),
    ("burstgpt.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,136,1223,Conversation log\n"
                     "118,ChatGPT,417,217,634,API log\n", [(472, 18), (1087, 136), (417, 217)]),
])
def test_run_replays_azure_and_burstgpt_files_without_a_shared_prefix(name: str, text: str,
                                                                      calls: list[tuple[int, int]],
                                                                      tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_text(text)
    result = run("--workload", str(path), "--trace", str(tmp_path / "engine.jsonl"))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["workload_format"] == name.removesuffix(".csv")
    assert summary["calls"] == summary["calls_delivered"] == 3
    log = RunLog.from_json(Path(summary["run_log"]).read_text())
    assert [(c.prompt_tokens, c.response_tokens) for c in log.calls] == calls  # in arrival order
