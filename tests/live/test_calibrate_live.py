"""`calibrate_live` and `retrybench calibrate --engine URL`: the paper's calibration against a live engine.

The engine server (the simulated engine over HTTP) stands in for a real one: its C-hat is known
from the simulated calibration, so the live procedure can be checked against it in seconds, at a
small time scale and with short stages.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures.live import EngineFactory

from retrybench.cli import main
from retrybench.live.calibrate import calibrate_live, calibration_summary
from retrybench.runner import calibration_for

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("calibrate-live")]

MODEL = "qwen2.5-7b-instruct"


def test_the_live_calibration_finds_the_engines_capacity(engine_server_factory: EngineFactory,
                                                         tmp_path: Path) -> None:
    scale = 0.05
    engine = engine_server_factory(MODEL, time_scale=scale)
    # Stages of 100 trace seconds from 1 call/s: 1, 1.5, 2.25 and 3.4 calls/s (20 s of wall time).
    result = calibrate_live(engine.url, model=MODEL, gpu="h100", workdir=tmp_path, time_scale=scale, stages=4,
                            first_rate=1.0, stage_s=100.0)
    simulated = float(calibration_for(MODEL)["chat"])  # about 2.8: the engine model's own capacity
    assert abs(result.chat_calls_per_s / simulated - 1) < 0.35, (result.chat_calls_per_s, simulated)
    assert result.saturated.growth_per_s >= 0.1 and all(s.growth_per_s < 0.1 for s in result.stages[:-1])
    summary = json.loads((tmp_path / "calibration.json").read_text())
    assert summary == json.loads(json.dumps(calibration_summary(result, engine_url=engine.url, time_scale=scale,
                                                                 token_scale=1.0)))


def test_the_command_refuses_what_a_live_calibration_cannot_do() -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["calibrate", "--model", MODEL, "--engine", "localhost:8000"])
    assert bad.exit_code == 2 and "--engine must be 'sim' or an http(s) URL" in bad.output
    mixed = runner.invoke(main, ["calibrate", "--model", MODEL, "--engine", "http://127.0.0.1:9", "--mixed-prompts"])
    assert mixed.exit_code == 2 and "simulated engine only" in mixed.output
