"""Any proxy condition with any client profile: RunSpec's client field, the condition it resolves to, and
`retrybench run --client` on the simulated engine (C-hat fixed, not calibrated)."""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from retrybench.calibration import store
from retrybench.cli.main import main
from retrybench.conditions.client_profiles import load_client_profile
from retrybench.conditions.config import load_condition
from retrybench.plan.spec import RunSpec, condition_for
from retrybench.records.runlog import RunLog

QWEN = "qwen2.5-7b-instruct"
CHAT = 2.7116906833687042  # tests/sim/test_digests.py's C-hat of this model


def test_a_spec_without_a_client_keeps_its_record_and_key() -> None:
    plain = RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=1)
    with_client = RunSpec(model=QWEN, condition="retries-on-cancel-on", seed=1, client="openai-sdk")
    assert "client" not in plain.as_dict()
    assert with_client.as_dict()["client"] == "openai-sdk"
    assert plain.key() != with_client.key()


def test_the_profile_replaces_the_client_and_keeps_the_proxy_and_cap() -> None:
    condition = load_condition("engine-cap-338-cancel-on")
    resolved = condition_for(RunSpec(model=QWEN, condition="engine-cap-338-cancel-on", seed=1, client="anthropic-sdk"))
    assert resolved.client == load_client_profile("anthropic-sdk") != condition.client
    assert (resolved.proxy, resolved.engine_cap) == (condition.proxy, condition.engine_cap)
    assert resolved.name == condition.name
    assert condition_for(RunSpec(model=QWEN, condition="engine-cap-338-cancel-on", seed=1)) == condition


@pytest.fixture
def fixed_chat(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "calibration_of", lambda *args, **kwargs: {"chat": CHAT})


def _run(*args: str) -> Any:
    return CliRunner().invoke(main, ["run", "--model", QWEN, "--seed", "3", "--json", "--no-cache", *args])


@pytest.mark.usefixtures("fixed_chat")
def test_run_with_the_openai_profile_uses_its_timeout_retries_and_backoff(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    result = _run("--condition", "engine-cap-100", "--client", "openai-sdk", "--trace", str(trace))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["client"] == summary["spec"]["client"] == "openai-sdk"
    log = RunLog.from_json(Path(summary["run_log"]).read_text())
    assert log.meta["attempt_timeout_s"] == 600.0 and log.meta["client"] == "openai-sdk"
    attempts = defaultdict(list)
    for attempt in log.attempts:
        attempts[attempt.call_index].append(attempt)
    assert max(len(a) for a in attempts.values()) <= 3
    retried = [(prev, nxt) for calls in attempts.values() for prev, nxt in pairwise(calls)]
    assert retried, "the engine cap should refuse some attempts (503), which the client retries"
    for prev, nxt in retried:
        delay = min(0.5 * 2 ** prev.attempt_no, 8.0)
        assert 0.75 * delay - 1e-9 <= nxt.sent_s - prev.ended_s <= delay + 1e-9
        if prev.outcome == "timed_out":
            assert prev.ended_s - prev.sent_s == pytest.approx(600.0)


@pytest.mark.usefixtures("fixed_chat")
def test_run_without_a_client_reports_none() -> None:
    result = _run("--condition", "retries-off-cancel-on")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert "client" not in summary and "client" not in summary["spec"]


def test_an_unknown_client_fails_before_any_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run started")

    monkeypatch.setattr("retrybench.runs.executors.run_one", forbidden)
    result = _run("--condition", "retries-on-cancel-on", "--client", "requests")
    assert result.exit_code == 2
    assert "Invalid value for '--client': unknown client profile 'requests'; known: anthropic-sdk, openai-sdk, " \
           "paper, sdk-in-tenacity" in result.output
