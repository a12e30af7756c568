"""Write engine/gpus.toml, the packaged registry of the GPUs `--gpu` takes, from the installed kernel
database's system files; or check that the packaged one is what the database gives.

Needs the `kernels` extra (`pip install 'retrybench[kernels]'`). The registry lets `retrybench gpus`
list the GPUs and size a model's KV cache without the extra; a GPU's kernels still need it, except the
paper's models on the H100 and H200 (packaged tables).

    python scripts/build_gpu_registry.py            # rewrite src/retrybench/engine/gpus.toml
    python scripts/build_gpu_registry.py --check    # exit 1 if the packaged registry differs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from retrybench.engine.gpus import REGISTRY_FIELDS, registry_path
from retrybench.engine.kernel_db import database_gpus, database_version

# What each system is, for listings; a system not named here is listed by its database name.
NAMES = {
    "a100_sxm": "NVIDIA A100 SXM 80GB", "b200_sxm": "NVIDIA B200 (SXM)", "b300_sxm": "NVIDIA B300 (SXM)",
    "b60": "Intel Arc Pro B60", "gb200": "NVIDIA GB200 (one Blackwell GPU)", "gb300": "NVIDIA GB300 (one Blackwell "
    "Ultra GPU)", "h100_sxm": "NVIDIA H100 80GB HBM3 (SXM)", "h200_sxm": "NVIDIA H200 (SXM)",
    "l40s": "NVIDIA L40S", "rtx_pro_6000_server": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
}


def registry_text(gpus: dict[str, dict[str, Any]], package: str) -> str:
    lines = [f"# The GPUs the kernel database ({package}) has vLLM kernel data for: written by",
             "# scripts/build_gpu_registry.py from its system files; memory is the system file's capacity.", ""]
    for short, gpu in sorted(gpus.items()):
        lines.append(f'[gpu."{short}"]')
        lines.append(f'name = "{NAMES.get(gpu["system"], gpu["system"])}"')
        for field in REGISTRY_FIELDS:
            value = gpu[field]
            lines.append(f'{field} = "{value}"' if isinstance(value, str) else f"{field} = {value!r}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the packaged registry instead of writing")
    args = parser.parse_args(argv)
    text = registry_text(database_gpus(), f"aiconfigurator-core {database_version()}")
    path = Path(registry_path())
    if args.check:
        if path.read_text() != text:
            print(f"{path} differs from the installed database: rerun scripts/build_gpu_registry.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
