"""`retrybench sweep` killed (kill -9) part way, again and again: each rerun of the same command computes
only what was not finished, never reads a partly written entry, reports and recomputes a damaged one, and
ends with the sweep.json of a sweep nothing interrupted.

Each command is a process of its own on a small grid (3 conditions x 5 pulses, one seed: 15 runs). The
tests wait for states of the cache or of the command's output, never for a time."""

from __future__ import annotations

import json
import re
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
    flip_a_digit,
    kill,
    runs_cached,
    stamps,
    start,
    wait_for,
)

GRID = ["--condition", "no-control,coalescing,retry-budget", "--axis", "pulse_x=1.5:2.7:0.3", "--seed", "1",
        "--jobs", "2"]
RUNS = 15
# What differs between two sweeps of the same grid by design: how long they took, and the command line.
UNSTABLE = ("wall_s", "command")


def _start(cache: Path, out: Path, name: str) -> Command:
    return start([sys.executable, "-m", "retrybench", "sweep", *GRID, "--out", str(out)], cache, out.parent, name)


def _resume_count(command: Command) -> tuple[int, int]:
    """(cached, to compute) as the command counted them when it started."""
    found = re.search(r"(\d+) runs: (\d+) cached, (\d+) to compute", command.errors())
    assert found is not None, command.errors()
    assert int(found[1]) == RUNS
    return int(found[2]), int(found[3])


def _document(command: Command, out: Path) -> dict[str, Any]:
    assert command.process.wait(timeout=TIMEOUT_S) == 0, command.errors()
    doc: dict[str, Any] = json.loads((out / "sweep.json").read_text())
    return {key: value for key, value in doc.items() if key not in UNSTABLE}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """sweep.json from one command that nothing interrupted."""
    root = tmp_path_factory.mktemp("uninterrupted")
    return _document(_start(root / "cache", root / "out", "whole"), root / "out")


# (what to wait for, kill the workers too)
KILL_POINTS: list[tuple[str, Callable[[Path, Command], bool], bool]] = [
    ("the runs counted", lambda cache, c: "to compute" in c.errors(), False),
    ("3 runs written", lambda cache, c: runs_cached(cache) >= 3, True),
    ("6 runs written", lambda cache, c: runs_cached(cache) >= 6, False),
]


def test_a_sweep_killed_again_and_again_resumes_to_the_uninterrupted_document(
        tmp_path: Path, uninterrupted: dict[str, Any]) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    out.mkdir()
    before: dict[Path, Stamp] = {}
    for i, (what, state, whole_group) in enumerate(KILL_POINTS):
        command = _start(cache, out, f"killed-{i}")
        wait_for(partial(state, cache, command), what, command.errors)
        kill(command, whole_group)
        after = stamps(cache)
        assert {p: after.get(p) for p in before} == before, f"killed at {what}: a finished entry was rewritten"
        done = sum(path.parent.name == "runs" for path in before)
        assert _resume_count(command) == (done, RUNS - done)
        assert DAMAGED not in command.errors()
        before = after
    damaged = next(iter(sorted((cache / "runs").glob("*.json"))))
    flip_a_digit(damaged)
    del before[damaged]

    final = _start(cache, out, "final")
    document = _document(final, out)
    after = stamps(cache)
    assert {p: after[p] for p in before} == before, "a finished entry was computed again"
    done = sum(path.parent.name == "runs" for path in before)
    assert _resume_count(final) == (done, RUNS - done)  # the damaged entry is counted to compute
    assert final.errors().count(DAMAGED) == 1 and f"{DAMAGED} {damaged}:" in final.errors()
    assert document == uninterrupted
