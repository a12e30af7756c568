"""`reproduce` as a service: a request checked before any run, a small reproduction run on an executor and
turned into the report (a second one computes nothing), and Ctrl-C turned into how many runs are cached.
Runs are on Qwen3-14B, the cheapest paper model to simulate, with its C-hat seeded into the cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.runner_fakes import StandInExecutor

from retrybench.calibration.store import EngineBuild
from retrybench.plan.engine_choice import parse_engine
from retrybench.records.cache import write_entry
from retrybench.records.results import Result
from retrybench.runs import executors
from retrybench.runs.executors import LocalExecutor
from retrybench.runs.plan import RunPlan
from retrybench.runs.reproduce import (
    Interrupted,
    ReproduceError,
    ReproduceRequest,
    plan_reproduction,
    reproduce,
    run_block,
)

MODEL = "qwen3-14b"
CHAT = 1.0900243919376884  # its C-hat as calibrated (tests/sim/test_digests.py pins it too)
LIVE = parse_engine("http://127.0.0.1:9")


def test_a_request_is_checked_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(ReproduceError, match="unknown model"):
        plan_reproduction(ReproduceRequest(out=tmp_path, models=("gpt-2",)))
    with pytest.raises(ReproduceError, match="unknown block"):
        plan_reproduction(ReproduceRequest(out=tmp_path, models=(MODEL,), blocks="diagnostic,nope"))
    with pytest.raises(ReproduceError, match="--unseen-seeds runs on the simulated engine only"):
        plan_reproduction(ReproduceRequest(out=tmp_path, models=(MODEL,), engine=LIVE, unseen_seeds=True))
    with pytest.raises(ReproduceError, match="boundary maps run on the simulated engine only"):
        plan_reproduction(ReproduceRequest(out=tmp_path, models=(MODEL,), engine=LIVE, blocks="boundaries"))
    live = plan_reproduction(ReproduceRequest(out=tmp_path, models=(MODEL,), engine=LIVE))
    assert live.boundaries is None and live.notes == ("boundary maps skipped: they run on the simulated engine only",)
    simulated = plan_reproduction(ReproduceRequest(out=tmp_path, models=(MODEL,), runs=1))
    assert simulated.boundaries == (MODEL,) and simulated.unseen is None and simulated.blocks


class Lines:
    """A display that keeps its notes."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def failed(self, text: str) -> None:
        self.notes.append("failed " + text)

    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, steps: int, label: str) -> None:
        pass

    def stop(self, completed: int | None = None) -> None:
        pass


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path / "cache"))
    write_entry(EngineBuild(MODEL).path(), {"chat": CHAT})
    return tmp_path / "cache"


def test_a_small_reproduction_writes_the_report_and_resumes(cache: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    request = ReproduceRequest(out=tmp_path / "report", models=(MODEL,), blocks="diagnostic", runs=1, jobs=1)
    plan = plan_reproduction(request)
    lines = Lines()
    outcome = reproduce(plan, lines)
    assert lines.notes == ["margins skipped: 0 of 8 runs at engine speeds 0.95, 1.05 cached; --margins runs the rest",
                           "4 distinct runs: 0 cached, 4 to compute"]
    assert [r["condition"] for r in outcome.results] == ["retries-off-cancel-off", "retries-on-cancel-off",
                                                         "retries-off-cancel-on", "retries-on-cancel-on"]
    assert outcome.page == tmp_path / "report" / "index.html" and outcome.page.is_file()
    assert outcome.context is not None and outcome.context["counts"]["unique"] == 4 and not outcome.failed
    assert set(outcome.json_output()) == {"runs", "scores", "robustness", "margins"}
    assert outcome.json_output()["margins"] is None

    def no_runs(*_args: object) -> None:
        raise AssertionError("a cached run was computed again")

    monkeypatch.setattr(executors, "compute", no_runs)
    again = Lines()
    assert reproduce(plan, again, LocalExecutor(jobs=1)).results == outcome.results
    assert again.notes[1:] == ["4 distinct runs: 4 cached, 0 to compute"]


class Interrupting(StandInExecutor):
    """Ctrl-C after the first run of a plan."""

    def run(self, plan: RunPlan, progress: executors.Progress | None = None) -> list[Result]:
        first = RunPlan(plan.runs[:1])
        super().run(first, progress)
        raise KeyboardInterrupt


def test_ctrl_c_says_how_many_runs_finished(cache: Path, tmp_path: Path) -> None:
    plan = plan_reproduction(ReproduceRequest(out=tmp_path, models=(MODEL,), blocks="diagnostic", runs=1,
                                              engine=LIVE))
    executor = Interrupting(lambda spec: {"recovered": True})
    with pytest.raises(Interrupted) as stopped:
        reproduce(plan, Lines(), executor)
    assert (stopped.value.done, stopped.value.total) == (1, 4)  # live: the runs that finished here
    assert str(stopped.value).startswith("interrupted: 1 of 4 distinct runs finished and are cached")



def test_a_block_runs_on_any_executor(tmp_path: Path) -> None:
    executor = StandInExecutor(lambda spec: {"recovered": spec.condition.startswith("retries-off")})
    results = run_block("diagnostic", MODEL, executor, runs=1)
    assert [spec.condition for spec in executor.ran] == ["retries-off-cancel-off", "retries-on-cancel-off",
                                                         "retries-off-cancel-on", "retries-on-cancel-on"]
    assert [dict(r)["recovered"] for r in results] == [True, False, True, False]
    with pytest.raises(ReproduceError, match="unknown block 'nope'"):
        run_block("nope", MODEL, executor)
