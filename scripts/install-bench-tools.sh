#!/usr/bin/env bash
# Install GuideLLM and AIPerf, two third-party LLM load generators, into a virtual environment of
# their own, so that tests/live/test_thirdparty.py can drive the proxy with them and the project's
# own environment keeps its versions.
#
#   scripts/install-bench-tools.sh [VENV]      (default: .venv-bench beside this repository)
#
# What they need, found by installing them:
# - both import torch (through transformers and datasets); asked for plainly, pip brings the CUDA
#   build and its CUDA libraries, gigabytes that a CPU machine cannot use. The CPU build goes in
#   first, pinned, so that the tools' `torch` requirement is already met and pip keeps it. Where pip
#   does not find torch==2.13.0+cpu in its configured indexes or find-links, set PIP_EXTRA_INDEX_URL
#   to PyTorch's CPU wheel index;
# - nothing else: the tests hand both tools a local tokenizer and keep them offline.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$repo/.venv-bench}"
torch_version="${BENCH_TORCH_VERSION:-2.13.0+cpu}"
guidellm_version="${GUIDELLM_VERSION:-0.8.1}"
aiperf_version="${AIPERF_VERSION:-0.13.0}"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
echo "installing torch $torch_version, then guidellm $guidellm_version and aiperf $aiperf_version into $venv"
"$py" -m pip install --quiet "torch==$torch_version"
"$py" -m pip install --quiet "guidellm==$guidellm_version" "aiperf==$aiperf_version"
"$py" - <<'PY'
"""The tools must not have replaced the CPU build of torch with a CUDA one."""
import sys

import torch

if torch.version.cuda is not None or "+cpu" not in torch.__version__:
    sys.exit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) is not the CPU build")
print("torch", torch.__version__)
PY
"$py" -c "import importlib.metadata as md; print('guidellm', md.version('guidellm'), 'aiperf', md.version('aiperf'))"
for tool in guidellm aiperf; do
  [ -x "$venv/bin/$tool" ] || { echo "$venv/bin/$tool is missing" >&2; exit 1; }
  echo "$tool: $venv/bin/$tool"
done
