"""Just enough HTTP/1.1 to relay an upstream response without re-encoding it (pure, no I/O).

The proxy forwards the upstream's chunk-framed bytes to its clients as they arrive; it only has
to know where the response head ends, how the body is delimited, and where a chunked body ends.
`ChunkedScanner` follows the framing across arbitrary reads without copying the body.
"""

from __future__ import annotations

__all__ = ["SIZE_LINES", "ChunkedScanner", "FramingError", "ResponseHead", "frame_chunk", "parse_response_head"]

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)
MAX_LINE = 8192  # a chunk-size or trailer line longer than this is not HTTP we relay


MAX_WHOLE = 1 << 16  # the longest read that `SIZE_LINES` answers for (longer ones take the general scan)
CR, LF = 13, 10


class _SizeLines(dict[int, bytes | None]):
    """A read's length -> the size line that a read of exactly one whole (non-last) chunk of that length
    starts with, as the upstream writes it (lower-case hex, no extension): `b"8d\r\n"` for 148 bytes; None
    where no such read has that length. A read of length n is one whole chunk if it starts with
    SIZE_LINES[n] and ends with CRLF: one dict lookup and two comparisons, where parsing the size takes a
    search, two slices and an int(). Filled as lengths are seen (a stream's reads take few lengths)."""

    def __missing__(self, length: int) -> bytes | None:
        if length > MAX_WHOLE:
            return None  # not kept: the table stays small whatever the upstream sends
        line = None
        for digits in range(1, 5):  # a chunk of size s takes len("%x" % s) + 2 + s + 2 bytes
            size = length - digits - 4
            if size > 0 and len(b"%x" % size) == digits:
                line = b"%x\r\n" % size
        self[length] = line
        return line


SIZE_LINES = _SizeLines()


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

    A read of exactly one whole chunk between chunks (most reads of a stream) leaves it as it was: the
    proxy's per-chunk path tells such reads by `between` and `SIZE_LINES` and does not feed them. A read
    that breaks the framing leaves the scanner as it was before that read, so `closing_bytes` still
    describes the bytes fed (and forwarded) before it."""

    __slots__ = ("_line", "_need", "_state", "between", "done")

    def __init__(self) -> None:
        self._state = _SIZE
        self._need = 0
        self._line = b""
        self.between = True  # the body fed so far ends between two chunks (as `at_boundary`)
        self.done = False  # the last chunk and the trailer are in

    def feed(self, data: bytes, payload: list[bytes] | None = None) -> int:
        """Consume `data`; return how many of its bytes belong to the body (the rest, if any,
        follows the body's end). Payload pieces are appended to `payload` when it is given."""
        before = (self._state, self._need, self._line)
        try:
            used = self._scan(data, payload)
        except FramingError:
            self._state, self._need, self._line = before
            raise
        self.between = self._state == _SIZE and not self._line
        return used

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
