"""Pausing Python's cyclic garbage collector around work that allocates much and frees little.

A simulated run, and the analysis of its engine trace, build hundreds of thousands of small objects
and keep most of them, so the collector scans the growing heap again and again and finds no cycles
(reference counting frees what they drop). Pausing it changes no result, only when memory is scanned.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["cyclic_gc_paused"]


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The collector off inside the block; its previous setting restored after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
