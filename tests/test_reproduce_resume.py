"""`retrybench reproduce` as a user runs it, killed (kill -9) or interrupted (Ctrl-C) part way: a rerun of
the same command computes only what was not finished, never reads a partly written entry, and ends with
the results of an uninterrupted reproduction; Ctrl-C stops the workers and says how to resume.

Each command is a process of its own on a small plan (one model, three blocks, one run: 13 distinct
simulations). The tests wait for states of the cache or of the command's output, never for a time."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fixtures.killed_commands import (
    DAMAGED,
    TIMEOUT_S,
    Command,
    Stamp,
    entry_files,
    flip_a_digit,
    group_running,
    kill,
    runs_cached,
    stamps,
    start,
    wait_for,
)

PLAN = ["--model", "qwen2.5-7b-instruct", "--block", "diagnostic,trigger-sweep,composition", "--runs", "1",
        "--jobs", "2"]
DISTINCT_RUNS = 13


def _start(cache: Path, out: Path, name: str) -> Command:
    return start([sys.executable, "-m", "retrybench", "reproduce", *PLAN, "--out", str(out), "--json"], cache,
                 out.parent, name)


def _resume_count(command: Command) -> tuple[int, int]:
    """(cached, to compute) as the command counted them when it started."""
    found = re.search(r"(\d+) distinct runs: (\d+) cached, (\d+) to compute", command.errors())
    assert found is not None, command.errors()
    assert int(found[1]) == DISTINCT_RUNS
    return int(found[2]), int(found[3])


def _without_wall_time(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in run.items() if k != "wall_s"} for run in runs]


def _finished(command: Command) -> dict[str, Any]:
    assert command.process.wait(timeout=TIMEOUT_S) == 0, command.errors()
    printed: dict[str, Any] = json.loads(command.stdout.read_text())
    return printed


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The plan's --json output and cache from one command that nothing interrupted."""
    root = tmp_path_factory.mktemp("uninterrupted")
    command = _start(root / "cache", root / "report", "whole")
    return _finished(command), root / "cache"


# (what to wait for, kill the workers too): before any entry, after the calibration alone, after k runs.
KILL_POINTS: list[tuple[str, Callable[[Path, Command], bool], bool]] = [
    ("the runs counted, none written", lambda cache, c: "to compute" in c.errors(), False),
    ("the calibration written", lambda cache, c: any((cache / "calibration").glob("*.json")), True),
    ("3 runs written", lambda cache, c: runs_cached(cache) >= 3, False),
    ("8 runs written", lambda cache, c: runs_cached(cache) >= 8, True),
]


def test_a_reproduction_killed_again_and_again_resumes_to_the_uninterrupted_results(
        tmp_path: Path, uninterrupted: tuple[dict[str, Any], Path]) -> None:
    cache, out = tmp_path / "cache", tmp_path / "report"
    before: dict[Path, Stamp] = {}
    for i, (what, state, whole_group) in enumerate(KILL_POINTS):
        command = _start(cache, out, f"killed-{i}")
        wait_for(partial(state, cache, command), what, command.errors)
        kill(command, whole_group)
        after = stamps(cache)
        assert {p: after.get(p) for p in before} == before, f"killed at {what}: a finished entry was rewritten"
        assert _resume_count(command) == (_runs_cached_in(before), DISTINCT_RUNS - _runs_cached_in(before))
        assert DAMAGED not in command.errors()
        before = after
    damaged = next(iter(sorted((cache / "runs").glob("*.json"))))
    flip_a_digit(damaged)
    del before[damaged]

    final = _start(cache, out, "final")
    printed = _finished(final)
    after = stamps(cache)
    assert {p: after[p] for p in before} == before, "a finished entry was computed again"
    assert _resume_count(final) == (_runs_cached_in(before), DISTINCT_RUNS - _runs_cached_in(before))
    assert final.errors().count(DAMAGED) == 1 and f"{DAMAGED} {damaged}:" in final.errors()
    reference, reference_cache = uninterrupted
    assert _without_wall_time(printed["runs"]) == _without_wall_time(reference["runs"])
    assert printed["scores"] == reference["scores"]
    expected = {p.relative_to(reference_cache) for p in entry_files(reference_cache)}
    assert {p.relative_to(cache) for p in after} == expected


def _runs_cached_in(stamps: dict[Path, Stamp]) -> int:
    return sum(path.parent.name == "runs" for path in stamps)


def test_ctrl_c_stops_the_workers_and_says_how_to_resume(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    command = _start(cache, tmp_path / "report", "interrupted")
    wait_for(lambda: runs_cached(cache) >= 2, "2 runs written", command.errors)
    os.killpg(command.process.pid, signal.SIGINT)  # as Ctrl-C in a terminal: to the command and its workers
    assert command.process.wait(timeout=TIMEOUT_S) == 130, command.errors()
    assert not group_running(command.process.pid), "a worker outlived the interrupted command"
    cached = runs_cached(cache)
    assert len(stamps(cache)) == cached + 1  # the calibration and whole runs, nothing else
    assert (f"interrupted: {cached} of {DISTINCT_RUNS} distinct runs finished and are cached; run the same command "
            "again to resume") in command.errors()
    assert "Traceback" not in command.errors() and "Aborted" not in command.errors()
