"""Just enough HTTP/1.1 to relay an upstream response without re-encoding it (pure, no I/O).

The proxy forwards the upstream's chunk-framed bytes to its clients as they arrive; it only has
to know where the response head ends, how the body is delimited, and where a chunked body ends.
`ChunkedScanner` follows the framing across arbitrary reads without copying the body.
"""

from __future__ import annotations

__all__ = ["ChunkedScanner", "FramingError", "ResponseHead", "frame_chunk", "parse_response_head"]

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)
MAX_LINE = 8192  # a chunk-size or trailer line longer than this is not HTTP we relay


class FramingError(ValueError):
    """The upstream's bytes are not valid HTTP/1.1 framing."""


class ResponseHead:
    """Status and the headers that matter for relaying; header names are lower-cased."""

    __slots__ = ("headers", "status")

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        if value is None:
            return None
        if not value.isdigit():
            raise FramingError(f"bad Content-Length {value!r}")
        return int(value)

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


def parse_response_head(head: bytes) -> ResponseHead:
    """Parse the status line and headers (everything before the blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise FramingError(f"bad status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise FramingError(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return ResponseHead(int(parts[1]), headers)


def frame_chunk(payload: bytes) -> bytes:
    """`payload` as one chunk of a chunked body (for upstream bodies that were not chunked)."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


class ChunkedScanner:
    """Where a chunked body ends, fed the body's bytes in any pieces; optionally its payload.

    `feed` runs once per streamed chunk, so its common case (a read holding whole chunks) is
    tested first and takes the fewest steps. A read that breaks the framing leaves the scanner as it
    was before that read, so `closing_bytes` still describes the bytes fed (and forwarded) before it."""

    __slots__ = ("_line", "_need", "_state", "done")

    def __init__(self) -> None:
        self._state = _SIZE
        self._need = 0
        self._line = b""
        self.done = False  # the last chunk and the trailer are in

    def feed(self, data: bytes, payload: list[bytes] | None = None) -> int:
        """Consume `data`; return how many of its bytes belong to the body (the rest, if any,
        follows the body's end). Payload pieces are appended to `payload` when it is given."""
        end = len(data)
        if self._state == _SIZE and payload is None and not self._line:  # one whole chunk: most reads
            newline = data.find(b"\n")
            if 0 < newline < MAX_LINE and data[end - 2:] == b"\r\n":
                try:
                    size = int(data[:newline], 16)  # int() ignores the CR; an extension fails it
                except ValueError:
                    size = 0
                if size > 0 and newline + size + 3 == end:
                    return end
        before = (self._state, self._need, self._line)
        try:
            return self._scan(data, payload)
        except FramingError:
            self._state, self._need, self._line = before
            raise

    def _scan(self, data: bytes, payload: list[bytes] | None) -> int:
        """`feed`'s general case: the bytes state by state."""
        end = len(data)
        pos = 0
        while pos < end:
            state = self._state
            if state in (_SIZE, _TRAILER):
                newline = data.find(b"\n", pos)
                if newline < 0:
                    self._line += data[pos:]
                    if len(self._line) > MAX_LINE:
                        raise FramingError("chunk-size line too long")
                    return end
                line = self._line + data[pos:newline] if self._line else data[pos:newline]
                self._line = b""
                pos = newline + 1
                if state == _TRAILER:
                    if not line.rstrip(b"\r"):
                        self._state, self.done = _DONE, True
                        return pos
                    continue
                size = _chunk_size(line)
                if size == 0:
                    self._state = _TRAILER
                elif payload is None and pos + size + 2 <= end:  # the common case: the whole chunk is here
                    if data[pos + size:pos + size + 2] != b"\r\n":
                        raise FramingError("chunk data not followed by CRLF")
                    pos += size + 2
                else:
                    self._state, self._need = _DATA, size
            elif state == _DATA:
                take = min(self._need, end - pos)
                if payload is not None:
                    payload.append(data[pos:pos + take])
                pos += take
                self._need -= take
                if self._need == 0:
                    self._state, self._need = _DATA_END, 2
            elif state == _DATA_END:
                take = min(self._need, end - pos)
                if data[pos:pos + take] != b"\r\n"[2 - self._need:2 - self._need + take]:
                    raise FramingError("chunk data not followed by CRLF")
                pos += take
                self._need -= take
                if self._need == 0:
                    self._state = _SIZE
            else:
                return pos
        return pos

    def at_boundary(self) -> bool:
        """Whether the body fed so far ends between two chunks."""
        return self._state == _SIZE and not self._line

    def closing_bytes(self, max_fill: int) -> bytes | None:
        """What ends the chunk a broken-off body stopped in, so that a chunk can follow: the rest of its
        data as newlines (which also end any partial SSE event) and its CRLF; b"" between chunks; None
        where no chunk can follow (the last chunk began, a size line is unreadable, or the rest of the
        chunk is over `max_fill` bytes)."""
        state = self._state
        if state == _DATA:
            return b"\n" * self._need + b"\r\n" if self._need <= max_fill else None
        if state == _DATA_END:
            return b"\r\n"[2 - self._need:]
        if state != _SIZE:
            return None
        line = self._line
        if not line:
            return b""
        try:
            size = int(line.rstrip(b"\r"), 16)  # a partial size line, without an extension
        except ValueError:
            return None
        if size == 0 or size > max_fill:
            return None
        return (b"\n" if line.endswith(b"\r") else b"\r\n") + b"\n" * size + b"\r\n"


def _chunk_size(line: bytes) -> int:
    """The size on a chunk-size line (its CR included, maybe an extension after ';')."""
    try:
        size = int(line, 16)  # the common case; int() ignores the CR and surrounding blanks
    except ValueError:
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise FramingError(f"bad chunk size {size_text[:20]!r}") from None
    if size < 0:
        raise FramingError("negative chunk size")
    return size
