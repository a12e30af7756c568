"""A small fixture set of run results (Qwen2.5-7B, run 1 of seven blocks, and one failed run) and the
report built from it once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrybench.records.results import Result

DATA = Path(__file__).parent / "data" / "results.json"


@pytest.fixture(scope="session")
def results() -> list[Result]:
    data: list[Result] = json.loads(DATA.read_text())
    return data


@pytest.fixture(scope="session")
def built_report(results: list[Result], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """index.html (and runs/, summary.json) of the fixture set, as `retrybench reproduce` writes it."""
    from retrybench.report import build_context, write_report
    from retrybench.report.meta import gather

    context = build_context(results, gather(engine="simulated vLLM-V1 engine (virtual time)", wall_s=1.0,
                                            command="retrybench reproduce (fixture)"))
    return write_report(tmp_path_factory.mktemp("report"), context, results)
