"""The retrieval interface: a source yields the documents of one data interval.

A source never raises for one bad record: a record it cannot parse is still yielded, with its
raw bytes and a ``malformed_reason``, so that it gets a job like any other and lands in
manual review with reason ``malformed_input`` instead of vanishing from the count. Only a
source-wide problem (a missing inbox) raises :class:`SourceError`, which fails the task so
Airflow retries it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

__all__ = ["FilteredSource", "Shard", "Source", "SourceDocument", "SourceError", "require_aware", "shard_of"]


class SourceError(Exception):
    """The source as a whole cannot be read (missing inbox, unreachable storage)."""


@dataclass(frozen=True, slots=True)
class SourceDocument:
    """One delivered record.

    ``content`` is the exact bytes stored as the payload (the claim check): for a valid record
    the canonical :meth:`~triage.contracts.documents.DocumentPayload.to_bytes`, for a malformed
    one the raw record, kept for the reviewer.
    """

    source: str
    external_id: str
    content: bytes
    malformed_reason: str | None = None
    detail: tuple[tuple[str, str | int], ...] = ()
    """What else the reviewer of a malformed record should know (a skipped line's size); ids
    and numbers, never document text."""


@runtime_checkable
class Source(Protocol):
    """Anything that can list the documents of a half-open interval ``[start, end)``."""

    name: str

    def read(self, start: datetime, end: datetime) -> Iterator[SourceDocument]:
        """Yield the documents of ``[start, end)``, in a deterministic order."""
        ...


@runtime_checkable
class FilteredSource(Source, Protocol):
    """A source that can skip documents before it builds them, by external id: a
    :class:`Shard` of it builds only its share (the synthetic source: the others are drawn,
    not built)."""

    def read_where(self, start: datetime, end: datetime, keep: Callable[[str], bool]) -> Iterator[SourceDocument]:
        """What :meth:`read` yields, but only the documents whose external id ``keep`` accepts."""
        ...


def require_aware(start: datetime, end: datetime) -> None:
    """Refuse naive or empty intervals: a data interval without a time zone is ambiguous."""
    if start.tzinfo is None or start.utcoffset() is None:
        raise ValueError("start must be timezone-aware")
    if end.tzinfo is None or end.utcoffset() is None:
        raise ValueError("end must be timezone-aware")
    if end < start:
        raise ValueError("end must not be before start")


def shard_of(external_id: str, shards: int) -> int:
    """The shard an external id belongs to: stable across processes and runs (CRC-32, not the
    salted ``hash()``), so every delivery of a document, duplicates included, lands in one."""
    return zlib.crc32(external_id.encode("utf-8", "surrogatepass")) % shards


class Shard:
    """The documents of ``inner`` whose external id falls in shard ``index`` of ``count``.

    ``classify_documents`` maps ``retrieve`` over shards: each task reads the whole interval but
    builds (a :class:`FilteredSource`), stores and registers only its share, so payload writes,
    the slowest part of retrieval here, run in several processes. Together the shards are
    exactly the source.
    """

    def __init__(self, inner: Source, index: int, count: int) -> None:
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"shard {index} of {count} does not exist")
        self.inner, self.index, self.count = inner, index, count
        self.name = inner.name

    def read(self, start: datetime, end: datetime) -> Iterator[SourceDocument]:
        if self.count == 1:
            yield from self.inner.read(start, end)
            return
        if isinstance(self.inner, FilteredSource):  # builds only this shard's documents
            yield from self.inner.read_where(start, end, self.owns)
            return
        for doc in self.inner.read(start, end):
            if self.owns(doc.external_id):
                yield doc

    def owns(self, external_id: str) -> bool:
        """Whether the document of ``external_id`` is this shard's."""
        return shard_of(external_id, self.count) == self.index
