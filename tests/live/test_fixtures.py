"""The process fixtures in fixtures/live.py: each starts real servers and leaves no process behind.

The fixtures run inside an inner pytest session (pytester), so that this test can check, after the
session's teardown, that every process they started is gone.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from fixtures.live import EngineFactory

pytestmark = pytest.mark.live

INNER = '''
import os
import urllib.request
from pathlib import Path

from fixtures.waiting import until_sync
from retrybench.conditions.config import WorkloadSpec
from retrybench.proxy.eventlog import read_event_log
from retrybench.traffic.workload import Call, Trace

PIDS = Path(os.environ["RETRYBENCH_TEST_PIDS"])


def healthy(url, pid):
    with PIDS.open("a") as handle:
        handle.write(f"{pid}\\n")
    with urllib.request.urlopen(url + "/health", timeout=60) as response:
        return response.status == 200


def test_engine_server_factory(engine_server_factory):
    engine = engine_server_factory(time_scale=0.02, max_num_queued_reqs=4, trace=True)
    assert healthy(engine.url, engine.pid)
    assert engine.trace_path.exists() and engine.log_path.exists()


def test_engine_server(engine_server):
    assert healthy(engine_server.url, engine_server.pid)
    assert engine_server.trace_path is None


def test_proxy_factory_and_loadgen(engine_server_factory, proxy_factory, loadgen):
    engine = engine_server_factory()
    proxy = proxy_factory(engine.url, "retries-on-cancel-on", time_scale=0.05)
    assert healthy(engine.url, engine.pid) and healthy(proxy.url, proxy.pid)
    spec = WorkloadSpec(chat_calls_per_s=1.0, prompt_tokens_mean=2100.0, prompt_tokens_sd=0.0)
    calls = tuple(Call(index=i, call_id=f"call-{i}", arrival_s=0.1 * i, prompt_tokens=2100, response_tokens=20,
                       phase="base") for i in range(3))
    result = loadgen(Trace(spec=spec, seed=0, calls=calls), proxy.url, "retries-on-cancel-on", 0.05)
    assert [c.delivered_s is not None for c in result.calls] == [True] * 3
    assert [a.outcome for a in result.attempts] == ["completed"] * 3
    def decisions():
        return [e["decision"] for e in read_event_log(proxy.log_path)[1] if e["ev"] == "attempt"]

    # the proxy flushes its decision log every 0.25 s; a loaded machine is slow
    until_sync(lambda: len(decisions()) >= 3, "three attempts in the proxy's decision log", seen=decisions)
    assert decisions() == ["create"] * 3
'''


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_each_fixture_starts_healthy_servers_and_teardown_leaves_no_process(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pids = tmp_path / "pids"
    monkeypatch.setenv("RETRYBENCH_TEST_PIDS", str(pids))
    pytester.makeconftest('pytest_plugins = ["fixtures.live"]\n')
    pytester.makepyfile(test_inner=textwrap.dedent(INNER))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=3)
    started = [int(line) for line in pids.read_text().split()]
    assert len(set(started)) == 4  # factory engine, shared engine, engine + proxy
    assert [pid for pid in started if alive(pid)] == []


def test_a_server_that_fails_to_start_reports_its_log(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no-such-model") as error:
        EngineFactory(tmp_path)(model="no-such-model")
    assert str(tmp_path / "engine-1.log") in str(error.value)
