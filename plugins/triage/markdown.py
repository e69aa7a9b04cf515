"""Markdown built from values Triage does not choose: a document's external id, a review
context, an Airflow run id or user name, an error text.

A document's author picks its external id, so every such value is escaped where it enters
Markdown (the reviewer's question, the reconciliation report, the review report):

* :func:`code` puts it in a code span that no run of backticks can close early;
* :func:`text` escapes what Markdown would read as emphasis, links, raw HTML or entities;
* :func:`cell` does either for a table cell and escapes ``|``, which GFM splits cells on even
  inside a code span;
* all three write line breaks, other control characters and bidirectional overrides as visible
  escapes (``\\n``, ``\\x1b``, ``\\u202e``): a value stays on its line and reads as it is stored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

__all__ = ["cell", "code", "in_table", "table", "text", "visible"]

_INVISIBLE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb]"
)
"""Control characters, line and paragraph separators, zero-width and bidirectional controls."""

_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

_INLINE: Final = re.compile(r"[\\`*\[\]<>&|~!#]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
"""What inline Markdown gives a meaning to. ``_`` only at a word's edge: inside a word
(``stuck_running``) CommonMark never reads it as emphasis, so it is left readable in logs.
``#``: a heading ending in `` #`` loses it as the heading's closing sequence (a reviewer named
``#`` vanished from the review report's heading; found by Hypothesis)."""


def _escaped(char: str) -> str:
    point = ord(char)
    return _NAMED.get(char) or (f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}")


def visible(value: object) -> str:
    """``value`` as one line of text whose every character shows (see the module docstring)."""
    return _INVISIBLE.sub(lambda m: _escaped(m[0]), str(value))


def code(value: object) -> str:
    """A code span holding exactly ``visible(value)``, whatever backticks it contains.

    The fence is one backtick longer than the longest run inside, and a space pads a value that
    starts or ends with a backtick or with a space on both sides (CommonMark strips one).
    """
    inner = visible(value)
    longest = max((len(run) for run in re.findall("`+", inner)), default=0)
    fence = "`" * (longest + 1)
    padded = inner[:1] == "`" or inner[-1:] == "`" or (inner[:1] == inner[-1:] == " " and inner.strip(" ") != "")
    if not inner:
        return "` `"  # an empty span is no span: two backticks are a fence of two
    pad = " " if padded else ""
    return f"{fence}{pad}{inner}{pad}{fence}"


def text(value: object) -> str:
    """``visible(value)`` as inline text: no emphasis, link, image, raw HTML, entity or span."""
    return _INLINE.sub(lambda m: "\\" + m[0], visible(value))


def in_table(markdown: str) -> str:
    """Inline Markdown (made of :func:`code` and :func:`text` pieces) as a table cell.

    GFM splits a row on every ``|`` not written ``\\|``, inside code spans too, and turns each
    ``\\|`` back into ``|`` before reading the cell: so every ``|`` is escaped once more here,
    and the cell reads exactly as the Markdown did outside a table.
    """
    return markdown.replace("|", "\\|")


def cell(value: object, *, as_code: bool = False) -> str:
    """A table cell holding ``value``: :func:`code` or :func:`text` (``None`` is empty)."""
    if value is None:
        return ""
    return in_table(code(value) if as_code else text(value))


def table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, code_columns: frozenset[int] = frozenset()
) -> list[str]:
    """A GFM table (lines), or ``_none_`` without rows; ``code_columns`` are shown as code."""
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v, as_code=i in code_columns) for i, v in enumerate(row)) + " |" for row in rows]
    return lines if len(lines) > 2 else ["_none_"]
