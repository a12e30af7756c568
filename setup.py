"""The build's one compiled part: the proxy's per-chunk path (retrybench/proxy/whole_chunks.py says why).

It is optional: where no C compiler or Python headers are found, the package installs without it and
the same path runs in Python. Everything else about the build is in pyproject.toml.
"""

import os

from setuptools import Extension, setup

extensions = [] if os.environ.get("RETRYBENCH_NO_EXTENSIONS") == "1" else [
    Extension("retrybench.proxy._whole_chunks", ["src/retrybench/proxy/_whole_chunks.c"], optional=True),
]
setup(ext_modules=extensions)
