"""The claims registry is the one source of the paper's claims: every claim is asserted by exactly one
finding test and shown in the report, every headline reads a figure its claim records, and the report's
verdicts on a fixed run set stay what they were."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from retrybench.claims import CLAIMS, ROWS, Case, claim
from retrybench.records.results import Result
from retrybench.report import build_context
from retrybench.report.headlines import HEADLINES
from retrybench.report.runs import RunSet
from retrybench.report.verdicts import checks_of

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"registry_check_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _params_of(function: Any) -> list[Any]:
    """The parameter sets (a Case each, with its marks) a finding test is parametrized with."""
    params: list[Any] = []
    for mark in getattr(function, "pytestmark", []):
        if mark.name == "parametrize" and mark.args[0] == "case":
            params += mark.args[1]
    return params


@pytest.fixture
def finding_tests(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every finding test function in benchmarks/ and the parameter sets it asserts (the paper's claims
    only: test_beyond_*.py check the project's own results beyond the paper)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the finding tests import their sibling `findings`
    tests: dict[str, list[Any]] = {}
    for path in sorted(BENCHMARKS.glob("test_*.py")):
        if path.name.startswith("test_beyond_"):
            continue
        module = _load(path)
        for name in dir(module):
            if name.startswith("test_"):
                tests[f"{path.name}::{name}"] = _params_of(getattr(module, name))
    return tests


def test_every_claim_is_asserted_by_exactly_one_finding_test(finding_tests: dict[str, list[Any]]) -> None:
    asserted: dict[str, list[str]] = {}
    for test, params in finding_tests.items():
        ids = {param.values[0].claim.id for param in params}
        assert len(ids) == 1, f"{test} asserts {sorted(ids) or 'no claim'}: a finding test asserts one claim"
        asserted.setdefault(ids.pop(), []).append(test)
    assert {c.id for c in CLAIMS} - set(asserted) == set(), "claims no finding test asserts"
    assert {cid: tests for cid, tests in asserted.items() if len(tests) > 1} == {}


def test_every_finding_test_case_is_marked_with_its_claim(finding_tests: dict[str, list[Any]]) -> None:
    """The report groups test outcomes by this mark, so it must name the claim the case asserts."""
    for test, params in finding_tests.items():
        for param in params:
            case: Case = param.values[0]
            assert [m.args[0] for m in param.marks if m.name == "claim"] == [case.claim.id], f"{test}[{case}]"


def test_every_claim_with_runs_is_shown_in_the_report(results: list[Result]) -> None:
    context = build_context(results, {})
    shown = {check["id"] for check in context["checks"]}
    rs = RunSet(results)
    with_runs = {c.id for c in CLAIMS if c.subjects(rs.pairs)}
    assert with_runs - shown == set()
    assert {row.key for row in ROWS} == {row["key"] for row in context["summary"]}


def test_every_headline_reads_a_figure_its_claims_record(results: list[Result]) -> None:
    checks = [c for row_checks in checks_of(RunSet(results)).values() for c in row_checks]
    for row_key, headlines in HEADLINES.items():
        for head in headlines:
            assert all(claim(cid).row.key == row_key for cid in head.claims), head.label
            recorded = [c for c in checks if head.matches(c.claim.id, c.subject) and c.passed is not None]
            if recorded:
                assert any(head.metric in c.measured for c in recorded), f"{head.label}: no claim records {head.metric}"


# The report's verdicts on the fixture run set, pinned: a refactoring of the claims or the report keeps them.
PINNED_VERDICTS = {
    "finding1": ("reproduced", 12, 12), "finding2": ("reproduced", 6, 6), "finding3": ("reproduced", 3, 3),
    "finding4": ("reproduced", 3, 3), "finding5": ("reproduced", 4, 4), "finding6": ("not reproduced", 4, 4),
    "finding7": ("reproduced", 2, 2), "section64": ("reproduced", 2, 2), "section65": ("reproduced", 9, 9),
    "section42-2x": ("uncertain in the paper", 1, 1), "section62-q338": ("uncertain in the paper", 2, 2),
}
PINNED_CHECKS_SHA256 = "56a0ce60eb070019a5e992f1b7a1e745738f48e0b6b2d62d63b59dffe20af477"


def test_the_reports_verdicts_on_a_fixed_run_set_are_pinned(results: list[Result]) -> None:
    context = build_context(results, {})
    verdicts = {row["key"]: (row["verdict"], row["checks"], row["passed"]) for row in context["summary"]}
    assert verdicts == PINNED_VERDICTS
    checks = sorted((c["id"], c["subject"], c["held"], c["measured"]) for c in context["checks"])
    digest = hashlib.sha256(json.dumps(checks).encode()).hexdigest()
    assert digest == PINNED_CHECKS_SHA256, "a claim's check or its measured figures changed"
