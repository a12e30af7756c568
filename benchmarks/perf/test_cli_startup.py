"""Command-line start-up (pytest-benchmark): the whole process of `retrybench --help`, and of `retrybench run
--json` on a seed whose run is not cached (C-hat is), as a user starts them.

As in test_sim_speed.py, what is asserted is the ratio to the reference workload (reference_workload.py)
timed before each round, never an absolute time: the targets are at most 0.2 s for --help and 0.6 s for
the run on a quiet machine, where the reference took REFERENCE_S_WHERE_SET, with the same DRIFT allowance.

Each process starts as from an installed package: its modules' bytecode cached (in a temporary
PYTHONPYCACHEPREFIX, filled by the warm-up round, so the checkout gets no __pycache__ and a machine that
sets PYTHONDONTWRITEBYTECODE times the same thing). The run's own `wall_s` (simulation, summary and trace
analysis inside the process) is printed beside it, so a miss says whether start-up or the run is slow.

Run on its own: pytest benchmarks/perf/test_cli_startup.py -p no:xdist
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from reference_workload import REFERENCE_S_WHERE_SET, in_references, time_reference

MODEL = "qwen2.5-7b-instruct"
CONDITION = "retries-on-cancel-on"
FRESH_SEED = 4242  # no other test runs it; its run is removed from the cache before every round
ROUNDS = 5
TARGET_S = {"help": 0.2, "run": 0.6}  # absolute, on a quiet core where the reference takes REFERENCE_S_WHERE_SET
HELP = [sys.executable, "-m", "retrybench", "--help"]
RUN = [sys.executable, "-m", "retrybench", "run", "--condition", CONDITION, "--model", MODEL, "--seed", str(FRESH_SEED),
       "--json"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache holding the model's calibration and nothing else (computed here once: about 10 s)."""
    path = tmp_path_factory.mktemp("cache")
    done = subprocess.run([sys.executable, "-m", "retrybench", "calibrate", "--model", MODEL], capture_output=True,
                          env={**os.environ, "RETRYBENCH_CACHE": str(path)}, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    yield path


@pytest.fixture(scope="module")
def env(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    given = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**given, "RETRYBENCH_CACHE": str(cache), "PYTHONPYCACHEPREFIX": str(tmp_path_factory.mktemp("pyc"))}


def _ratio(benchmark: Any, command: list[str], env: dict[str, str], name: str,
           before: Callable[[], None] | None = None) -> tuple[list[str], float, float]:
    """The command's median time over the reference's, the reference timed before each round; and the
    command's output of every round."""
    references: list[float] = []
    outputs: list[str] = []

    def setup() -> None:
        if before is not None:
            before()
        references.append(time_reference())

    def start() -> None:
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs.append(done.stdout)

    benchmark.pedantic(start, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    took = benchmark.stats.stats.median
    reference = statistics.median(references[-ROUNDS:])
    ratio = took / reference
    benchmark.extra_info.update({"reference_median_s": reference, f"{name}_vs_reference": ratio})
    return outputs[-ROUNDS:], took, ratio


def test_help(benchmark: Any, env: dict[str, str]) -> None:
    outputs, took, ratio = _ratio(benchmark, HELP, env, "help")
    assert all("run" in out and "sweep" in out for out in outputs)
    bound = in_references(TARGET_S["help"])
    print(f"\n`retrybench --help`: median {took:.3f} s, {ratio:.2f} references (target <= {bound:.2f}, "
          f"{TARGET_S['help']} s where it was set)")
    assert ratio <= bound, (f"`retrybench --help` took {took:.3f} s, {ratio:.2f}x the reference workload, over the "
                            f"{bound:.2f}x that stands for {TARGET_S['help']} s")


# The target is not met: the run inside the process (its own wall_s: simulation about 83%, the Section 5
# trace analysis about 13%) takes 0.56-0.67 s by itself, near or over the whole process's 0.6 s, so it needs a
# faster simulator, not a faster start-up. The whole process measured 0.78-1.02 s (5.4-6.4 references). The
# assertion states the target at its plain ratio (no DRIFT allowance, so that a run near the bound cannot
# pass by chance): when the process meets it, the strict xfail turns into a failure that says so.
@pytest.mark.xfail(strict=True, reason="`run --json` on a fresh seed misses its 0.6-s target: the run itself (wall_s "
                                       "0.56-0.67 s) nearly fills it; the whole process took 0.78-1.02 s here")
def test_run_on_a_fresh_seed(benchmark: Any, env: dict[str, str], cache: Path) -> None:
    def uncached() -> None:
        shutil.rmtree(cache / "runs", ignore_errors=True)

    outputs, took, ratio = _ratio(benchmark, RUN, env, "run", before=uncached)
    summaries = [json.loads(out) for out in outputs]
    assert all(s["seed"] == FRESH_SEED and "aborted_prompt_share_pct" in s for s in summaries)
    wall = statistics.median(float(s["wall_s"]) for s in summaries)
    bound = TARGET_S["run"] / REFERENCE_S_WHERE_SET
    benchmark.extra_info["run_wall_median_s"] = wall
    print(f"\n`retrybench run --json`, seed {FRESH_SEED} uncached: median {took:.3f} s, {ratio:.2f} references "
          f"(target <= {bound:.2f}: {TARGET_S['run']} s where it was set, without drift); the run inside it "
          f"(median wall_s) {wall:.3f} s, {wall / took * 100:.0f}% of the process; the rest (start-up, imports, "
          f"output) about {took - wall:.3f} s")
    assert ratio <= bound, (f"`retrybench run --json` took {took:.3f} s, {ratio:.2f}x the reference workload, over "
                            f"the {bound:.2f}x that stands for {TARGET_S['run']} s; the run itself (wall_s) took "
                            f"{wall:.3f} s of it")
