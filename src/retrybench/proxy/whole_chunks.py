"""The per-chunk path of an upstream connection: a read of exactly one whole chunk, between chunks.

Most reads of a streamed body are one whole chunk: the upstream writes a token's event as a chunk and
the proxy reads it before the next one is written. Such a read leaves the body's chunk scanner as it
was, so it is forwarded unchanged without being scanned: to the one client that alone wants the bytes
(`direct`), else to the exchange's sink. Any other read goes to the subclass's `_data_received`.

`WholeChunkRelay` is compiled from `_whole_chunks.c` where the package was built with a C compiler
(`pip install` builds it; `RELAY_IMPLEMENTATION` says which one runs): the bytecode of this path was
most of the proxy's own CPU per chunk. The Python class below is the same logic, used where the
module is not built or `RETRYBENCH_PYTHON_RELAY=1` is set; the tests run both on the same reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from retrybench.proxy.http1 import CR, LF, SIZE_LINES

__all__ = ["RELAY_IMPLEMENTATION", "PythonWholeChunkRelay", "WholeChunkRelay", "compiled_relay", "send_to_client"]


class PythonWholeChunkRelay:
    """The per-chunk path in Python. Its fields are set by the subclass (upstream._Exchange), plain
    attributes here and the compiled class's own members there."""

    sink: Any
    direct: Any
    _scanner: Any
    last_body: bytes
    reads: int
    client_buffer_limit: int
    _want_payload: bool
    _between: bool  # the body read so far ends between two chunks
    _data_received: Callable[[bytes], None]  # every other read: the subclass's

    def data_received(self, data: bytes) -> None:
        sink = self.sink
        if sink is not None and self._scanner is not None and not self._want_payload:
            end = len(data)
            line = SIZE_LINES[end]  # the size line a whole chunk of this length starts with, or None
            if (line is not None and data.startswith(line) and data[end - 1] == LF and data[end - 2] == CR
                    and self._between):
                self.last_body = data
                self.reads += 1
                if not send_to_client(self.direct, data, self.client_buffer_limit):
                    sink.on_body(data)
                return
        self._data_received(data)


def send_to_client(client: Any, data: bytes, limit: int) -> bool:
    """Write `data` to the one client that alone wants the stream (`direct`, or None), and drop that client
    once more than `limit` bytes wait for it; False where there is none or it is closing (the relay then
    takes the bytes). The compiled class does the same in C."""
    if client is None or client.is_closing():
        return False
    client.write(data)
    if client.get_write_buffer_size() > limit:
        client.close()  # a client that stopped reading must not hold the proxy's memory
    return True


def compiled_relay() -> type | None:
    """The compiled class, or None where the extension was not built (or cannot load here)."""
    try:
        from retrybench.proxy._whole_chunks import WholeChunkRelay as compiled
    except ImportError:
        return None
    return compiled


_compiled = None if os.environ.get("RETRYBENCH_PYTHON_RELAY") == "1" else compiled_relay()
WholeChunkRelay: type = _compiled or PythonWholeChunkRelay
RELAY_IMPLEMENTATION = "compiled" if _compiled is not None else "python"
