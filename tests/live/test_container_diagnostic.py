"""Three findings' conditions through the two containers: the proxy image in front of the vLLM image.

The scaled live diagnostic (time and token scale 0.1, the tiny model on vLLM's CPU build) of
retries-on-cancel-on, retries-off-cancel-on and coalescing, each run's proxy a container of the proxy
image on the Docker network of the vLLM container, both pinned as `compare-real-engine` pins its
processes. One calibration sets C-hat (the band is that one value); each run's outcome is set beside
the simulator's at that C-hat with the comparison's rules (realvllm/comparison.py): same recovery, hold
delivered within 15 points, completion rate within 20%, VOID where the engine ran more than 10% off
its calibrated capacity around the run.

About 12 minutes on two cores, so it runs only when asked (`pytest -m container_diagnostic`), and
nightly on a runner with Docker and no GPU (.github/workflows/nightly-cpu.yml). The same with one
command: `retrybench compare-real-engine --runtime container --calibrations 1 --loads none
--condition retries-on-cancel-on,retries-off-cancel-on,coalescing --out DIR`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.containers import image_skip_reason

from retrybench.realvllm.compare_real import RESULT_FILE, CompareSettings, compare_real_engine
from retrybench.realvllm.record import RealEngineRecord

pytestmark = [pytest.mark.vllm, pytest.mark.docker, pytest.mark.live, pytest.mark.container_diagnostic,
              pytest.mark.xdist_group("vllm-diagnostic")]

CONDITIONS = ("retries-on-cancel-on", "retries-off-cancel-on", "coalescing")


@pytest.fixture(scope="module")
def comparison(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RealEngineRecord:
    if "container_diagnostic" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the diagnostic through the containers takes about 12 minutes: run it with "
                    "pytest -m container_diagnostic")
    for kind in ("vllm", "proxy"):
        if (reason := image_skip_reason(kind)) is not None:
            pytest.skip(reason)
    out: Path = tmp_path_factory.mktemp("container-diagnostic")
    record = compare_real_engine(CompareSettings(out=out, runtime="container", calibrations=1, curve_loads=(),
                                                 conditions=CONDITIONS))
    print(f"\nthe diagnostic through the containers: {out / RESULT_FILE}")
    return record


@pytest.mark.parametrize("condition", CONDITIONS)
def test_the_containers_agree_with_the_simulator_where_the_engine_held_its_speed(
        condition: str, comparison: RealEngineRecord) -> None:
    row = next(r for r in comparison["conditions"] if r["condition"] == condition)
    assert row["live"]["attempts"] > 0, f"{condition}: no attempt reached the proxy container"
    verdict = row["verdict"]
    print(f"\n{condition}: {json.dumps(verdict, indent=1)}")
    if verdict["status"] == "void":
        pytest.skip(f"VOID: {verdict['reason']}")
    assert verdict["status"] in ("agree", "not asserted"), f"{condition}: {verdict['reason']}"
