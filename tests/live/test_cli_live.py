"""The live commands' argument handling (no servers are started here)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from retrybench.cli.main import main
from retrybench.traffic.workload import load_trace


def test_make_trace_writes_a_trace_loadgen_can_read(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    result = CliRunner().invoke(main, ["make-trace", "--model", "qwen2.5-7b-instruct", "--seed", "3", str(out)])
    assert result.exit_code == 0, result.output
    trace = load_trace(out)
    assert trace.seed == 3 and len(trace.calls) > 1000 and trace.end_s == 947.0


def test_run_rejects_a_bad_engine_and_a_time_scale_for_an_external_engine() -> None:
    base = ["run", "--condition", "coalescing", "--model", "qwen2.5-7b-instruct"]
    bad = CliRunner().invoke(main, [*base, "--engine", "vllm"])
    assert bad.exit_code == 2 and "'vllm' is not one of sim, engine-server or an http:// URL" in bad.output
    tls = CliRunner().invoke(main, [*base, "--engine", "https://127.0.0.1:9"])
    assert tls.exit_code == 2 and "https is not supported" in tls.output
    scaled = CliRunner().invoke(main, [*base, "--engine", "http://127.0.0.1:9", "--time-scale", "0.1"])
    assert scaled.exit_code == 2 and "real time" in scaled.output


def test_loadgen_rejects_a_file_that_is_not_a_trace(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = CliRunner().invoke(main, ["loadgen", "--trace", str(bad), "--target", "http://127.0.0.1:9",
                                       str(tmp_path / "out.json")])
    assert result.exit_code == 2 and "missing key" in result.output
