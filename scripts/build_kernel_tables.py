"""Build the packaged kernel tables (the paper's three models on the H100 and H200) from the kernel
database, or check that the packaged ones are what the installed database gives.

Needs the `kernels` extra (`pip install 'retrybench[kernels]'`). Each table takes a few seconds.

    python scripts/build_kernel_tables.py            # rewrite src/retrybench/engine/kernels/
    python scripts/build_kernel_tables.py --check    # exit 1 naming each table that differs
"""

from __future__ import annotations

import argparse
import sys
import time

from retrybench.engine.kernel_db import build_kernel_table
from retrybench.engine.kernel_store import packaged_path, table_name
from retrybench.engine.kernel_table import format_kernel_table
from retrybench.engine.profiles import GPUS, MODELS

PAPER_MODELS = ("qwen2.5-7b-instruct", "qwen3-14b", "llama-3.1-8b-instruct")
PAPER_GPUS = ("h100", "h200")


def packaged_tables() -> list[tuple[str, str, str]]:
    """(model, GPU, file name) of every packaged table."""
    out = []
    for gpu in PAPER_GPUS:
        spec = GPUS[gpu]
        assert spec.kernel_system is not None and spec.kernel_vllm is not None
        for model in PAPER_MODELS:
            out.append((model, gpu, table_name(MODELS[model].shapes, spec.kernel_system, spec.kernel_vllm)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the packaged tables instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for model, gpu, name in packaged_tables():
        spec = GPUS[gpu]
        assert spec.kernel_system is not None and spec.kernel_vllm is not None
        started = time.perf_counter()
        text = format_kernel_table(build_kernel_table(MODELS[model].shapes, spec.kernel_system, spec.kernel_vllm))
        path = packaged_path(name)
        if args.check:
            current = path.read_text() if path.is_file() else None
            if current != text:
                stale.append(f"{name} ({model} on {gpu})")
        else:
            path.write_text(text)
        print(f"{model} on {gpu}: {name}, {time.perf_counter() - started:.1f} s", flush=True)
    if stale:
        print("packaged kernel tables differ from the installed database's: " + ", ".join(stale)
              + "; rebuild with python scripts/build_kernel_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
