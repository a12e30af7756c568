"""A cache entry damaged after it was written (cut short, overwritten, one digit changed, or written by a
version without digests) is reported on stderr, by file, and recomputed; a sound one is returned as
written, without computing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from fixtures.runner_fakes import InlineExecutor, fake_calibration_seed

from retrybench.calibration import store
from retrybench.calibration.store import EngineBuild, calibrate_missing
from retrybench.records import cache
from retrybench.records.cache import ENTRY_FORMAT, DamagedEntry, cached_json, has_entry, read_entry, write_entry

# A tuple and whole-number keys, which JSON reads back as a list and strings ("10" before "3").
DATA = {"chat": 2.7117, "runs": [{"seed": 0, "stages": (1, 2.5)}], "counts": {3: 10, 10: 3}}
AS_READ = json.loads(json.dumps(DATA))


class Computations:
    """compute() for cached_json, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict[str, Any]:
        self.calls += 1
        return DATA


def _cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xff\xfe garbage \x80")


def _one_digit_changed(path: Path) -> None:
    text = path.read_text()
    assert text.count("2.7117") == 1
    path.write_text(text.replace("2.7117", "2.7118"))


def _older_version(path: Path) -> None:
    path.write_text(json.dumps(DATA, sort_keys=True, indent=1))  # the bare data, as entries were once written


@pytest.mark.parametrize("damage", [_cut_short, _garbage, _one_digit_changed, _older_version])
def test_a_damaged_entry_is_reported_and_recomputed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    damage: Callable[[Path], None]) -> None:
    path = tmp_path / "runs" / "entry.json"
    write_entry(path, DATA)
    damage(path)
    with pytest.raises(DamagedEntry):
        read_entry(path)
    compute = Computations()
    assert cached_json(path, compute, use_cache=True) == DATA
    assert compute.calls == 1
    warning = capsys.readouterr().err
    assert f"damaged cache entry {path}:" in warning and "recomputing it" in warning
    assert read_entry(path) == AS_READ  # written anew, sound


def test_a_sound_entry_is_returned_as_written_without_computing(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "entry.json"
    compute = Computations()
    assert cached_json(path, compute, use_cache=True) is DATA  # the caller gets what compute() returned
    assert cached_json(path, compute, use_cache=True) == AS_READ  # and then what JSON reads back
    assert compute.calls == 1 and capsys.readouterr().err == ""
    envelope = json.loads(path.read_text())
    assert envelope["format"] == ENTRY_FORMAT and envelope["data"] == AS_READ
    assert not list(tmp_path.glob(".*"))  # no temporary file left beside it


def test_has_entry_tells_absent_sound_and_damaged_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "entry.json"
    assert not has_entry(path, report=True)
    write_entry(path, DATA)
    assert has_entry(path)
    _one_digit_changed(path)
    assert not has_entry(path)
    assert capsys.readouterr().err == ""  # quiet unless asked
    assert not has_entry(path, report=True)
    assert f"damaged cache entry {path}" in capsys.readouterr().err


def test_the_pool_recalibrates_a_damaged_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Else every run would find it damaged and calibrate again, each in its own worker."""
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(store, "CALIBRATION_SEEDS", 1)
    monkeypatch.setattr(EngineBuild, "calibrate_seed", fake_calibration_seed)
    build = EngineBuild("qwen3-14b")
    calibrate_missing(InlineExecutor(), [build])
    path = build.path()
    _garbage(path)
    calibrate_missing(InlineExecutor(), [build])
    assert f"damaged cache entry {path}" in capsys.readouterr().err
    assert read_entry(path)["chat"] == pytest.approx(1.25)


def test_the_code_version_follows_the_code_results_depend_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A change to what computes results makes a new version; one to what only orchestrates, shows or
    reports them (the reproduce orchestration, its display, the report, sweeps, the command line) does not."""
    package = tmp_path / "retrybench"
    shutil.copytree(Path(cache.__file__).parents[1], package, ignore=shutil.ignore_patterns("__pycache__"))
    files = resources.files
    monkeypatch.setattr(resources, "files", lambda name: package if name == "retrybench" else files(name))

    def version_after(edit: str) -> str:
        with (package / edit).open("a") as source:
            source.write("\n# edited\n")
        cache.code_version.cache_clear()
        return cache.code_version()

    cache.code_version.cache_clear()
    try:
        first = cache.code_version()
        for orchestration in ("runs/reproduce.py", "runs/display.py", "report/context.py", "sweep/run.py"):
            assert version_after(orchestration) == first, orchestration
        for computing in ("runs/simulate.py", "runs/executors.py", "calibration/stages.py", "sim/run.py"):
            before = cache.code_version()
            assert version_after(computing) != before, computing
    finally:
        cache.code_version.cache_clear()
