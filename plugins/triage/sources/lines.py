"""The lines of a byte stream, read with a bound: a line longer than the limit is never held whole.

Iterating a file (or ``readline()`` without a size, the only form object-storage files offer)
reads a line whole before anyone can look at its length: one 3 GB line in an inbox is 3 GB in
every process that reads it, on every retry. :func:`bounded_lines` reads fixed-size blocks
instead and keeps at most ``limit + 1`` bytes of any line; the rest of an oversized line is
counted while it is skipped. Memory stays below ``limit + 2 * block`` whatever the input.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["BLOCK_BYTES", "Line", "bounded_lines"]

BLOCK_BYTES: Final = 1 << 16
"""Bytes read from the stream at a time."""

_CR: Final = 13


@dataclass(frozen=True, slots=True)
class Line:
    """One line, without its terminator (``\\n``, ``\\r\\n``, or none at the end of the stream).

    ``content`` is the whole line when ``oversized`` is false, else its first ``limit`` bytes;
    ``size`` is the line's length in bytes either way.
    """

    number: int
    content: bytes
    size: int
    oversized: bool
    blank: bool
    """Only ASCII whitespace (``bytes.strip``'s): checked over the whole line, the skipped part too."""


def bounded_lines(stream: Any, limit: int, *, block: int = BLOCK_BYTES) -> Iterator[Line]:
    """Yield every line of ``stream`` (anything with ``read(n) -> bytes``), numbered from 1.

    A final line without a newline is a line; an empty stream has none.
    """
    if limit < 1 or block < 1:
        raise ValueError("limit and block must be positive")
    number = 0
    head = bytearray()  # the first limit + 1 bytes of a line that spans blocks
    size = 0  # bytes of that line so far
    blank = True
    last = -1  # its last byte so far: a line ending in CR before its LF is a CRLF line
    while chunk := stream.read(block):
        start = 0
        while start < len(chunk):
            newline = chunk.find(b"\n", start)
            if newline >= 0 and size == 0:
                # The common case: a whole line inside one block, sliced once.
                number += 1
                yield _line(number, chunk[start:newline], limit)
                start = newline + 1
                continue
            end = len(chunk) if newline < 0 else newline
            piece = chunk[start:end]
            if piece:
                size += len(piece)
                last = piece[-1]
                blank = blank and not piece.strip()
                room = limit + 1 - len(head)
                if room > 0:
                    head += piece[:room]
            if newline < 0:
                break
            number += 1
            yield _spanning(number, head, size, last, blank, limit)
            head, size, blank, last = bytearray(), 0, True, -1
            start = newline + 1
    if size:
        yield _spanning(number + 1, head, size, last, blank, limit)


def _line(number: int, raw: bytes, limit: int) -> Line:
    content = raw[:-1] if raw.endswith(b"\r") else raw
    if len(content) <= limit:
        return Line(number, content, len(content), False, not content.strip())
    return Line(number, content[:limit], len(content), True, not content.strip())


def _spanning(number: int, head: bytearray, size: int, last: int, blank: bool, limit: int) -> Line:
    length = size - (last == _CR)
    with memoryview(head) as view:  # one copy of the head, not two
        content = bytes(view[: min(length, limit)])
    return Line(number, content, length, length > limit, blank)
