"""`pytest --report PATH`: the report from the runs the selected finding tests used, with each test's
outcome (an xfail with its reason), with and without pytest-xdist (workers -> controller)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "results.json"

TESTS = '''
import json
import pytest
from fixtures.report import note_run

RUNS = {(r["condition"], r["seed"]): r for r in json.load(open(%(data)r)) if "error" not in r}


@pytest.mark.finding7
@pytest.mark.claim("f7-deferred-cancellation-restores")
def test_deferred_cancellation_restores_service(record_property):
    run = RUNS[("deferred-cancellation", 1)]
    note_run(run)
    record_property("measured:recovered", run["recovered"])
    assert run["recovered"]


@pytest.mark.finding5
@pytest.mark.claim("f5-coalescing-restores-service")
@pytest.mark.xfail(strict=True, reason="measured: coalescing delivered 99.87%% of the pulse cohort")
def test_coalescing_delivers_every_pulse_call():
    note_run(RUNS[("coalescing", 1)])
    assert False


@pytest.mark.finding6
@pytest.mark.claim("f6-lifo-under-proxy-cap")
def test_lifo_claim_fails():
    note_run(RUNS[("lifo", 1)])
    assert 1 == 2, "lifo did not deliver more"


def test_not_a_finding_test():
    pass
'''


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makeini("[pytest]\nmarkers =\n    finding5\n    finding6\n    finding7\n    claim\n")
    pytester.makepyfile(test_findings=TESTS % {"data": str(DATA)})
    return pytester


@pytest.mark.parametrize("xdist", [False, True], ids=["no-xdist", "xdist"])
def test_report_holds_the_outcomes_and_runs_of_the_selected_tests(suite: pytest.Pytester, xdist: bool) -> None:
    out = suite.path / "report"
    args = ["-p", "fixtures.report", "-p", "no:cacheprovider", "--report", str(out)]
    result = suite.runpytest_subprocess(*args, *(["-n", "2"] if xdist else ["-p", "no:xdist"]))
    result.assert_outcomes(passed=2, failed=1, xfailed=1)
    result.stdout.fnmatch_lines(["*reproducibility report: *index.html (3 finding tests)*"])
    summary = json.loads((out / "summary.json").read_text())
    rows = {row["key"]: row for row in summary["summary"]}
    assert rows["finding7"]["verdict"] == "reproduced"
    assert rows["finding5"]["verdict"] == "not reproduced"
    assert "measured: coalescing delivered 99.87% of the pulse cohort" in rows["finding5"]["reasons"][0]
    assert rows["finding6"]["verdict"] == "not reproduced"
    assert "lifo did not deliver more" in rows["finding6"]["reasons"][0]
    assert rows["finding1"]["verdict"] == "not run"
    outcomes = {t["name"]: t["outcome"] for t in summary["tests"]}
    assert outcomes == {"test_deferred_cancellation_restores_service": "passed",
                        "test_coalescing_delivers_every_pulse_call": "xfailed", "test_lifo_claim_fails": "failed"}
    recorded = next(t for t in summary["tests"] if t["outcome"] == "passed")["properties"]
    assert recorded == [["measured:recovered", "True"]]
    assert len(list((out / "runs").glob("*.json"))) == 3  # the runs the tests used, and only those
    page = (out / "index.html").read_text()
    assert "Finding tests" in page and "99.87% of the pulse cohort" in page


def test_without_report_nothing_is_written_or_added(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("-p", "fixtures.report", "-p", "no:cacheprovider", "-p", "no:xdist",
                                        "--junitxml", "junit.xml")
    result.assert_outcomes(passed=2, failed=1, xfailed=1)
    assert not (suite.path / "report").exists()
    assert "retrybench:runs" not in (suite.path / "junit.xml").read_text()
