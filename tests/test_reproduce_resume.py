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
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from retrybench.cache import read_entry

PLAN = ["--models", "qwen2.5-7b-instruct", "--blocks", "diagnostic,trigger-sweep,composition", "--runs", "1",
        "--jobs", "2"]
DISTINCT_RUNS = 13
TIMEOUT_S = 120.0  # for any one state: generous, a loaded machine is slow, a correct one gets there
DAMAGED = "damaged cache entry"


@dataclass(frozen=True)
class Stamp:
    """What must not change in an entry a later command finds finished: its file and its bytes."""

    inode: int
    mtime_ns: int
    content: bytes


@dataclass
class Command:
    """One `retrybench reproduce` process, in a process group of its own (as a shell job is)."""

    process: subprocess.Popen[bytes]
    stderr: Path
    stdout: Path

    def errors(self) -> str:
        """Its stderr so far, with the line wrapping of a narrow console undone."""
        return " ".join(self.stderr.read_text(errors="replace").split())


def _start(cache: Path, out: Path, name: str) -> Command:
    env = {**os.environ, "RETRYBENCH_CACHE": str(cache), "COLUMNS": "200"}
    stderr, stdout = out.parent / f"{name}.err", out.parent / f"{name}.out"
    with stderr.open("wb") as err, stdout.open("wb") as std:
        process = subprocess.Popen([sys.executable, "-m", "retrybench", "reproduce", *PLAN, "--out", str(out),
                                    "--json"], env=env, stdout=std, stderr=err, start_new_session=True)
    return Command(process, stderr, stdout)


def _wait_for(state: Callable[[], bool], what: str, seen: Callable[[], object]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not state():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {TIMEOUT_S:.0f} s; seen: {seen()}")
        time.sleep(0.005)


def _entry_files(cache: Path) -> Iterator[Path]:
    for folder in ("calibration", "runs"):
        yield from (cache / folder).glob("*.json")


def _stamps(cache: Path) -> dict[Path, Stamp]:
    """Every entry in the cache, each checked whole and sound on the way (no partly written entry)."""
    stamps = {}
    for path in _entry_files(cache):
        read_entry(path)  # raises DamagedEntry for a part of an entry
        stat = path.stat()
        stamps[path] = Stamp(stat.st_ino, stat.st_mtime_ns, path.read_bytes())
    return stamps


def _runs_cached(cache: Path) -> int:
    return len(list((cache / "runs").glob("*.json")))


def _group_running(group: int) -> bool:
    """Whether a process of the group still runs; exited ones waiting to be reaped (zombies) do not count."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while being read
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return not Path("/proc").is_dir()


def _kill(command: Command, whole_group: bool) -> None:
    """kill -9 the command (alone, or with its workers as an OOM killer or `kill -9 -PGID` would), then
    wait until none of its processes runs: a worker left behind must end by itself."""
    group = command.process.pid
    (os.killpg if whole_group else os.kill)(group, signal.SIGKILL)
    returncode = command.process.wait(timeout=TIMEOUT_S)
    assert returncode == -signal.SIGKILL, f"the command ended ({returncode}) before it was killed: {command.errors()}"
    _wait_for(lambda: not _group_running(group), "end of every worker of the killed command", command.errors)


def _resume_count(command: Command) -> tuple[int, int]:
    """(cached, to compute) as the command counted them when it started."""
    found = re.search(r"(\d+) distinct runs: (\d+) cached, (\d+) to compute", command.errors())
    assert found is not None, command.errors()
    assert int(found[1]) == DISTINCT_RUNS
    return int(found[2]), int(found[3])


def _flip_a_digit(path: Path) -> None:
    """Change the last digit of the first number ending a line: still valid JSON, different content."""
    text = path.read_text()
    found = re.search(r"(\d)(,?\n)", text)
    assert found is not None
    digit = str((int(found[1]) + 1) % 10)
    path.write_text(text[:found.start(1)] + digit + text[found.end(1):])


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
    ("3 runs written", lambda cache, c: _runs_cached(cache) >= 3, False),
    ("8 runs written", lambda cache, c: _runs_cached(cache) >= 8, True),
]


def test_a_reproduction_killed_again_and_again_resumes_to_the_uninterrupted_results(
        tmp_path: Path, uninterrupted: tuple[dict[str, Any], Path]) -> None:
    cache, out = tmp_path / "cache", tmp_path / "report"
    before: dict[Path, Stamp] = {}
    for i, (what, state, whole_group) in enumerate(KILL_POINTS):
        command = _start(cache, out, f"killed-{i}")
        _wait_for(partial(state, cache, command), what, command.errors)
        _kill(command, whole_group)
        after = _stamps(cache)
        assert {p: after.get(p) for p in before} == before, f"killed at {what}: a finished entry was rewritten"
        assert _resume_count(command) == (_runs_cached_in(before), DISTINCT_RUNS - _runs_cached_in(before))
        assert DAMAGED not in command.errors()
        before = after
    damaged = next(iter(sorted((cache / "runs").glob("*.json"))))
    _flip_a_digit(damaged)
    del before[damaged]

    final = _start(cache, out, "final")
    printed = _finished(final)
    after = _stamps(cache)
    assert {p: after[p] for p in before} == before, "a finished entry was computed again"
    assert _resume_count(final) == (_runs_cached_in(before), DISTINCT_RUNS - _runs_cached_in(before))
    assert final.errors().count(DAMAGED) == 1 and f"{DAMAGED} {damaged}:" in final.errors()
    reference, reference_cache = uninterrupted
    assert _without_wall_time(printed["runs"]) == _without_wall_time(reference["runs"])
    assert printed["scores"] == reference["scores"]
    expected = {p.relative_to(reference_cache) for p in _entry_files(reference_cache)}
    assert {p.relative_to(cache) for p in after} == expected


def _runs_cached_in(stamps: dict[Path, Stamp]) -> int:
    return sum(path.parent.name == "runs" for path in stamps)


def test_ctrl_c_stops_the_workers_and_says_how_to_resume(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    command = _start(cache, tmp_path / "report", "interrupted")
    _wait_for(lambda: _runs_cached(cache) >= 2, "2 runs written", command.errors)
    os.killpg(command.process.pid, signal.SIGINT)  # as Ctrl-C in a terminal: to the command and its workers
    assert command.process.wait(timeout=TIMEOUT_S) == 130, command.errors()
    assert not _group_running(command.process.pid), "a worker outlived the interrupted command"
    cached = _runs_cached(cache)
    assert len(_stamps(cache)) == cached + 1  # the calibration and whole runs, nothing else
    assert (f"interrupted: {cached} of {DISTINCT_RUNS} distinct runs finished and are cached; run the same command "
            "again to resume") in command.errors()
    assert "Traceback" not in command.errors() and "Aborted" not in command.errors()
