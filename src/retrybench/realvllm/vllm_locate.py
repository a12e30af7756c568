"""Where vLLM is on this machine: its container image, its executable, the Hugging Face cache it reads,
and the checkout whose source a traced vLLM imports.

Standard library only, so that `retrybench doctor` can answer on a base install (no live extra),
the very machine it is meant to diagnose, and the live stack and the test fixtures find vLLM the
same way it does.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["DEFAULT_IMAGE", "IMAGE_ENV", "VLLM_ENV", "hf_home", "source_root", "vllm_executable", "vllm_image"]

VLLM_ENV = "RETRYBENCH_VLLM"  # path of the `vllm` executable to run
IMAGE_ENV = "RETRYBENCH_VLLM_IMAGE"  # container image, default DEFAULT_IMAGE
DEFAULT_IMAGE = "vllm/vllm-openai:v0.30.0"


def vllm_image(environ: Mapping[str, str] | None = None) -> str:
    """$RETRYBENCH_VLLM_IMAGE, or DEFAULT_IMAGE."""
    environ = os.environ if environ is None else environ
    return environ.get(IMAGE_ENV) or DEFAULT_IMAGE


def hf_home(environ: Mapping[str, str] | None = None) -> Path:
    """The host's Hugging Face cache: $HF_HOME, or ~/.cache/huggingface."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")


def source_root() -> Path | None:
    """The checkout's `src/` directory when retrybench runs from a checkout (it does when installed
    editable), else None."""
    src = Path(__file__).resolve().parents[2]
    return src if (src.parent / "pyproject.toml").is_file() and (src / "retrybench").is_dir() else None


def vllm_executable(environ: Mapping[str, str] | None = None, src: Path | None = None,
                    which: Callable[[str], str | None] = shutil.which) -> str | None:
    """The `vllm` to run: $RETRYBENCH_VLLM if set (whether or not it exists: a wrong path should fail
    loudly), else `<checkout>/.venv-vllm/bin/vllm` if it exists, else `vllm` on PATH, else None.
    `src` is the checkout's src/ (default `source_root()`)."""
    environ = os.environ if environ is None else environ
    if explicit := environ.get(VLLM_ENV):
        return explicit
    src = source_root() if src is None else src
    if src is not None and (venv := src.parent / ".venv-vllm" / "bin" / "vllm").is_file():
        return str(venv)
    return which("vllm")
