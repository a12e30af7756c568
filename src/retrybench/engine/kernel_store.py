"""Where a model's kernel table on a GPU comes from: the packaged ones (the paper's three models on the
H100 and H200), else the cache, else built from the kernel database on first use (the `kernels` extra).

A table is named by the GPU system, the vLLM version its kernels were measured with and a digest of
the model's shapes, so two models with the same layers share one, and a renamed model is not priced
twice; a cached table is kept per version of the database, so an upgrade builds its own. Packaged
tables are read without the extra; `scripts/build_kernel_tables.py` rewrites them and a test (where the
extra is installed) checks that they are what the installed database gives.
"""

from __future__ import annotations

import hashlib
import json
import sys
from functools import cache
from importlib import resources
from pathlib import Path

from retrybench.engine.kernel_table import KernelTable, Shapes, format_kernel_table, parse_kernel_table
from retrybench.records.atomicfile import write_atomic
from retrybench.records.cache import cache_dir

__all__ = ["PACKAGED", "cached_path", "kernel_table", "packaged_path", "table_name"]

PACKAGED = "kernels"  # the packaged tables' folder in retrybench/engine


def table_name(shapes: Shapes, system: str, backend_version: str) -> str:
    """The file name of a model's table on a system: `h100_sxm-vllm0.24.0-<shapes digest>.json`."""
    digest = hashlib.sha256(json.dumps(shapes, sort_keys=True).encode()).hexdigest()[:12]
    return f"{system}-vllm{backend_version}-{digest}.json"


def packaged_path(name: str) -> Path:
    return Path(str(resources.files("retrybench") / "engine" / PACKAGED / name))


def cached_path(name: str, package_version: str) -> Path:
    """Where a table built from one version of the database is cached: a new version builds its own."""
    return cache_dir() / "kernels" / f"aiconfigurator-core-{package_version}" / name


def _installed_version() -> str | None:
    from retrybench.engine.kernel_db import KernelDatabaseMissing, database_version

    try:
        return database_version()
    except KernelDatabaseMissing:
        return None


@cache
def kernel_table(shapes_json: str, system: str, backend_version: str) -> KernelTable:
    """The table for a model (its Shapes as sorted JSON, so the call can be cached) on a system:
    packaged, cached or built now (a few seconds, said on stderr)."""
    shapes: Shapes = json.loads(shapes_json)
    name = table_name(shapes, system, backend_version)
    version = _installed_version()
    candidates = [packaged_path(name)]
    if version is not None:
        candidates.append(cached_path(name, version))
    else:  # tables built before the database was uninstalled, newest first
        candidates += sorted((cache_dir() / "kernels").glob(f"*/{name}"), key=lambda p: p.stat().st_mtime,
                             reverse=True)
    for path in candidates:
        if path.is_file():
            table = parse_kernel_table(path.read_text(), source=str(path))
            if table.shapes != shapes:  # a digest collision, or a file edited by hand
                raise ValueError(f"{path} holds the kernel table of other shapes than {shapes}")
            return table
    from retrybench.engine.kernel_db import build_kernel_table  # the `kernels` extra, only when needed

    print(f"pricing {shapes['architecture']} ({shapes['layers']} layers, hidden {shapes['hidden']}) on {system} "
          f"from the kernel database (vLLM {backend_version}) ...", file=sys.stderr, flush=True)
    table = build_kernel_table(shapes, system, backend_version)
    path = cached_path(name, table.provenance["package"].split()[-1])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, format_kernel_table(table))
    return table
