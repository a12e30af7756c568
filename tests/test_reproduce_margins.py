"""Margins end to end: a small reproduction (one diagnostic run on Qwen3-14B, the cheapest paper model to
simulate, its C-hat seeded into the cache) rerun at engine speeds 0.95 and 1.05, each claim on the model
marked robust or knife-edge in the JSON; on by default once those runs are cached, off when asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrybench.calibration.store import EngineBuild
from retrybench.plan.engine_choice import parse_engine
from retrybench.records.cache import write_entry
from retrybench.runs.display import SilentDisplay
from retrybench.runs.reproduce import ReproduceError, ReproduceRequest, plan_reproduction, reproduce

MODEL = "qwen3-14b"
CHAT = 1.0900243919376884  # its C-hat as calibrated (tests/sim/test_digests.py pins it too)
LIVE = parse_engine("http://127.0.0.1:9")


class Notes(SilentDisplay):
    """A display that keeps its notes."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    write_entry(EngineBuild(MODEL).path(), {"chat": CHAT})
    return tmp_path / "cache"


def request(out: Path, margins: bool | None) -> ReproduceRequest:
    return ReproduceRequest(out=out, models=(MODEL,), blocks="diagnostic", runs=1, jobs=1, margins=margins)


def test_margins_run_the_blocks_at_both_speeds_and_mark_each_claim(cache: Path, tmp_path: Path) -> None:
    plan = plan_reproduction(request(tmp_path / "report", margins=True))
    assert plan.margins is not None and len(plan.margins) == 2 * len(plan.blocks) == 8
    assert sorted({spec.engine_speed for _, spec in plan.margins}) == [0.95, 1.05]
    lines = Notes()
    outcome = reproduce(plan, lines)
    assert outcome.at_speeds is not None and len(outcome.at_speeds) == 8 and not outcome.failed
    assert any(note.startswith("margins: 8 distinct runs at engine speeds 0.95, 1.05 in ") for note in lines.notes)
    margins = outcome.json_output()["margins"]
    assert isinstance(margins, dict) and margins["speeds"] == [0.95, 1.0, 1.05]
    rows = margins["rows"]
    assert rows and all(r["model"] == MODEL and set(r["verdicts"]) == {"0.95", "1", "1.05"} for r in rows)
    for r in rows:
        flips = [float(s) for s, v in r["verdicts"].items() if v != r["verdict"]]
        judged = r["verdict"] in ("reproduced", "not reproduced")
        assert r["margin"] == (None if not judged else "knife-edge" if flips else "robust")
        assert r["flips_at"] == (flips if judged else [])
    assert margins["judged"] == sum(1 for r in rows if r["margin"] is not None) > 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert 'id="margins"' in page and f"{margins['reproduced_robust']} of them robust" in page

    cached = plan_reproduction(request(tmp_path / "again", margins=None))  # all cached: on by default
    assert cached.margins == plan.margins
    assert plan_reproduction(request(tmp_path / "off", margins=False)).margins is None


def test_margins_by_default_only_once_cached_and_never_live(cache: Path, tmp_path: Path) -> None:
    plan = plan_reproduction(request(tmp_path, margins=None))
    assert plan.margins is None
    assert plan.notes == ("margins skipped: 0 of 8 runs at engine speeds 0.95, 1.05 cached; --margins runs the rest",)
    live = ReproduceRequest(out=tmp_path, models=(MODEL,), blocks="diagnostic", runs=1, engine=LIVE)
    assert plan_reproduction(live).margins is None
    with pytest.raises(ReproduceError, match="--margins runs on the simulated engine only"):
        plan_reproduction(ReproduceRequest(out=tmp_path, models=(MODEL,), engine=LIVE, margins=True))


def test_only_table1_s_blocks_are_rerun_for_margins(cache: Path, tmp_path: Path) -> None:
    plan = plan_reproduction(ReproduceRequest(out=tmp_path, models=(MODEL,), blocks="diagnostic,retention", runs=1,
                                              margins=True))
    assert plan.margins is not None and {name for name, _ in plan.margins} == {"diagnostic"}
    beyond = plan_reproduction(ReproduceRequest(out=tmp_path, models=(MODEL,), blocks="retention", runs=1,
                                                margins=True))
    assert beyond.margins is None  # no claim reads it: nothing to hold
