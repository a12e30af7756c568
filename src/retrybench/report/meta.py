"""Where and with what a report's runs were made: versions, commit, machine. Reads the environment,
so it sits at the edge: context.py receives its dict."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata, resources
from pathlib import Path
from typing import NotRequired, TypedDict

from retrybench import __version__
from retrybench.engine.profiles import MODELS
from retrybench.records.cache import code_version

__all__ = ["PACKAGES", "RunMeta", "StepsCalibration", "gather", "git_commit"]

PACKAGES = ("numpy", "click", "rich", "jinja2", "matplotlib", "pytest", "pytest-xdist")


class StepsCalibration(TypedDict):
    """C-hat of a build calibrated at another step size, beside the 8,192-token C-hat its runs use."""

    model: str
    gpu: str
    max_batched_tokens: int
    chat: float
    chat_8192: float


class RunMeta(TypedDict):
    """Where and with what the report's runs were made."""

    engine: str
    command: str
    wall_s: float | None
    retrybench: str
    code_version: str
    commit: str
    python: str
    platform: str
    cpus: int
    packages: dict[str, str]
    model_profiles: dict[str, str]
    chat_at_steps: NotRequired[list[StepsCalibration]]


def git_commit() -> str:
    """The commit of the checkout retrybench runs from, '+dirty' if it has changes; 'unknown' outside one."""
    root = Path(str(resources.files("retrybench")))
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def gather(*, engine: str, wall_s: float | None, command: str) -> RunMeta:
    """The report's run metadata: engine, versions, commit, machine, the command and its wall time."""
    return {
        "engine": engine,
        "command": command,
        "wall_s": None if wall_s is None else round(wall_s, 1),
        "retrybench": __version__,
        "code_version": code_version(),
        "commit": git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count() or 1,
        "packages": {name: _version(name) for name in PACKAGES},
        "model_profiles": {key: spec.name for key, spec in MODELS.items()},
    }
