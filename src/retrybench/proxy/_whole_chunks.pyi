# The compiled per-chunk path (_whole_chunks.c); whole_chunks.PythonWholeChunkRelay is the same in Python.
from typing import Any

class WholeChunkRelay:
    sink: Any
    direct: Any
    _scanner: Any
    last_body: bytes
    reads: int
    client_buffer_limit: int
    _want_payload: bool
    _between: bool
    def data_received(self, data: bytes) -> None: ...
