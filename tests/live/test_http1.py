"""HTTP/1.1 framing the proxy relays without re-encoding: the chunked scanner over any split of the bytes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrybench.proxy.http1 import MAX_WHOLE, SIZE_LINES, ChunkedScanner, FramingError, frame_chunk, parse_response_head


def chunked(payloads: list[bytes], trailer: bytes = b"") -> bytes:
    return b"".join(frame_chunk(p) for p in payloads if p) + b"0\r\n" + trailer + b"\r\n"


@given(payloads=st.lists(st.binary(min_size=1, max_size=300), max_size=8),
       cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
       after=st.binary(max_size=20))
def test_any_split_finds_the_end_and_the_payload(payloads: list[bytes], cuts: list[int], after: bytes) -> None:
    body = chunked(payloads)
    data = body + after  # bytes after the body's end belong to the next response
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    for collect in (True, False):  # with the payload, and the framing-only fast path
        scanner, used = ChunkedScanner(), 0
        payload: list[bytes] = []
        for start, end in itertools.pairwise(points):
            if scanner.done:
                break
            used += scanner.feed(data[start:end], payload if collect else None)
            assert scanner.between is scanner.at_boundary()  # what the proxy's per-chunk path reads
        assert scanner.done
        assert used == len(body)
        assert b"".join(payload) == (b"".join(payloads) if collect else b"")


def test_chunk_extensions_and_trailers_are_skipped() -> None:
    scanner, payload = ChunkedScanner(), list[bytes]()
    data = b"5;name=value\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"
    assert scanner.feed(data, payload) == len(data) and scanner.done and payload == [b"hello"]


@pytest.mark.parametrize("bad", [b"zz\r\n", b"5\r\nhelloXX", b"-1\r\n", b"1" * 9000])
def test_bad_framing_is_an_error(bad: bytes) -> None:
    with pytest.raises(FramingError):
        ChunkedScanner().feed(bad)


def test_the_response_head() -> None:
    head = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked")
    assert head.status == 200 and head.chunked and head.keep_alive and head.content_length is None
    head = parse_response_head(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\nConnection: close")
    assert head.status == 503 and not head.chunked and head.content_length == 12 and not head.keep_alive
    for bad in (b"HTTP/2 200", b"garbage", b"HTTP/1.1 200 OK\r\nno colon here"):
        with pytest.raises(FramingError):
            parse_response_head(bad)


def test_reads_of_one_whole_chunk_each_take_the_short_path_and_still_find_the_end() -> None:
    """A stream read chunk by chunk (the proxy's usual case), with payloads that look like framing:
    an end marker inside a chunk is data, a chunk extension still parses, and the last chunk ends it."""
    payloads = [b"data: 1\n\n", b"x\r\n0\r\n\r\n", b"0\r\n\r\n", b"y" * 4096]
    reads = [frame_chunk(p) for p in payloads] + [b"3;ext=1\r\nabc\r\n", b"0\r\n\r\n"]
    scanner = ChunkedScanner()
    for read in reads[:-1]:
        assert scanner.feed(read) == len(read) and not scanner.done, read
    assert scanner.feed(reads[-1] + b"HTTP/1.1") == len(reads[-1]) and scanner.done


@pytest.mark.parametrize("lengths", [range(0, 5000), range(MAX_WHOLE - 100, MAX_WHOLE + 1)])
def test_the_size_line_of_each_read_length_is_that_of_the_one_whole_chunk_of_that_length(lengths: range) -> None:
    """SIZE_LINES[n] is the size line of the one whole chunk whose framing is n bytes long, None where no
    chunk frames to n bytes; each answer agrees with the scanner, for which such a read is one chunk."""
    whole = {len(frame_chunk(b"x" * size)): size for size in range(1, MAX_WHOLE)}
    for length in lengths:
        size = whole.get(length)
        line = SIZE_LINES[length]
        assert line == (None if size is None else b"%x\r\n" % size), length
        if line is not None:
            read = line + b"\n" * (length - len(line) - 2) + b"\r\n"
            scanner = ChunkedScanner()
            assert scanner.feed(read) == length and scanner.between and not scanner.done


def test_reads_longer_than_the_size_line_table_take_the_scan_and_are_not_kept() -> None:
    read = frame_chunk(b"x" * MAX_WHOLE)
    assert SIZE_LINES[len(read)] is None and len(read) not in SIZE_LINES
    scanner = ChunkedScanner()
    assert scanner.feed(read) == len(read) and scanner.between


def test_a_read_holding_more_or_less_than_one_chunk_is_followed_exactly() -> None:
    two = frame_chunk(b"ab") + frame_chunk(b"cd")
    scanner = ChunkedScanner()
    assert scanner.feed(two) == len(two) and not scanner.done
    half = frame_chunk(b"hello")
    assert scanner.feed(half[:4]) == 4 and scanner.feed(half[4:]) == len(half) - 4 and not scanner.done
    assert scanner.feed(b"0\r\n\r\n") == 5 and scanner.done


@pytest.mark.parametrize(("fed", "closing"), [
    (b"", b""),  # nothing yet: between chunks
    (b"5\r\nhello\r\n", b""),  # a whole chunk
    (b"5\r\nhel", b"\n\n\r\n"),  # inside a chunk's data: the rest as newlines, then its CRLF
    (b"5\r\nhello", b"\r\n"),  # its data whole, its CRLF missing
    (b"5\r\nhello\r", b"\n"),
    (b"5", b"\r\n\n\n\n\n\n\r\n"),  # a size line cut short: ended, then the chunk's data as newlines
    (b"5\r", b"\n\n\n\n\n\n\r\n"),
    (b"0\r\n", None),  # the last chunk began: no chunk can follow
])
def test_a_broken_off_body_is_ended_where_a_chunk_can_follow(fed: bytes, closing: bytes | None) -> None:
    scanner = ChunkedScanner()
    scanner.feed(fed)
    assert scanner.closing_bytes(max_fill=1 << 20) == closing
    assert scanner.at_boundary() is (closing == b"")
    if closing is not None:  # what it gives, then a chunk of its own, frames as a whole body
        whole = ChunkedScanner()
        whole.feed(fed + closing + frame_chunk(b"x") + b"0\r\n\r\n")
        assert whole.done


def test_a_chunk_too_long_to_fill_is_not_ended() -> None:
    scanner = ChunkedScanner()
    scanner.feed(b"400\r\nab")
    assert scanner.closing_bytes(max_fill=100) is None


@given(payloads=st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=4),
       cut=st.integers(min_value=0, max_value=1000), split=st.integers(min_value=0, max_value=1000))
def test_a_read_that_breaks_the_framing_leaves_the_scanner_where_the_good_bytes_ended(
        payloads: list[bytes], cut: int, split: int) -> None:
    """The proxy forwards each read whole or not at all, so after a bad read the client's bytes end where
    the last good read ended, between chunks or inside one; the scanner must still describe that point."""
    good = b"".join(frame_chunk(p) for p in payloads)
    fed = good[:min(cut, len(good))]
    reference = ChunkedScanner()
    reference.feed(fed)
    scanner = ChunkedScanner()
    middle = min(split, len(fed))
    scanner.feed(fed[:middle])
    scanner.feed(fed[middle:])
    with pytest.raises(FramingError):  # no size line, chunk data or CRLF can take this
        scanner.feed(b"\x00" * 300 + b"\n")
    assert scanner.closing_bytes(max_fill=1 << 20) == reference.closing_bytes(max_fill=1 << 20)
    assert scanner.at_boundary() is reference.at_boundary() and not scanner.done
    assert scanner.feed(good[len(fed):] + b"0\r\n\r\n") == len(good) - len(fed) + 5 and scanner.done
