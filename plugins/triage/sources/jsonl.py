"""Read support tickets exported as JSON Lines into a date-partitioned inbox.

Layout: ``<inbox>/YYYY-MM-DD/*.jsonl``, one folder per day. A run for ``[start, end)`` reads
every day folder whose midnight (UTC) falls in the interval, days in order and files in name
order, so the same inbox always yields the same documents in the same order.

One line, one ticket::

    {"id": "T-1", "subject": "...", "body": "...", "received_at": "2026-11-01T09:30:00+01:00",
     "channel": "email"}

The reader never raises for a bad line: every non-blank line yields exactly one
:class:`SourceDocument`. A line that is not a valid ticket keeps its raw bytes, gets the
position-based id ``"{day}/{file}:{line}"`` and a short ``malformed_reason`` (one of
:data:`LINE_REASONS`); the job ledger sends it to manual review. An entry named ``*.jsonl``
that is not a file yields one such document too (``"{day}/{file}"``, ``not_a_file``). Only a
missing inbox (or one that cannot be listed or read) raises. Lines are read with a bound
(:mod:`triage.sources.lines`): a line over ``max_line_bytes`` is never held whole.

The inbox may be a :class:`pathlib.Path` or any object-storage path with the same surface
(``universal_pathlib``'s ``UPath``, Airflow's ``ObjectStoragePath``): only ``/``, ``exists``,
``is_dir``, ``is_file``, ``iterdir``, ``name`` and ``open("rb")`` are used, and the inbox is
listed once per run rather than probed day by day. Which inbox a run may read is decided before
(:mod:`triage.sources.inbox_roots`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, time
from typing import Any, Final, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from triage.contracts.documents import MAX_EXTERNAL_ID_LENGTH, DocumentPayload
from triage.sources.base import SourceDocument, SourceError, require_aware
from triage.sources.lines import bounded_lines

__all__ = ["LINE_REASONS", "MAX_LINE_BYTES", "InboxPath", "JsonlSource", "parse_line"]

MAX_LINE_BYTES: Final = 1 << 20
"""Longest accepted line by default; a longer one is malformed (``line_too_long``): only its first
``MAX_LINE_BYTES`` are ever held in memory, and they are what its payload keeps."""

LINE_REASONS: Final = frozenset(
    {
        "invalid_utf8",
        "invalid_json",
        "not_an_object",
        "missing_field",
        "unexpected_field",
        "empty_id",
        "id_too_long",
        "naive_received_at",
        "invalid_field",
        "line_too_long",
        "nul_in_id",
        "received_at_out_of_range",
        "not_a_file",
    }
)
"""Every ``malformed_reason`` this source gives."""

_PARSER_LIMITS: Final = (ValueError, ArithmeticError, RecursionError)
"""What a parser or validator may raise besides ``ValidationError`` (a nesting limit, a date
that overflows): caught per line so that one line can never fail its whole file."""


class InboxPath(Protocol):
    """The part of the ``pathlib`` surface the reader uses."""

    @property
    def name(self) -> str: ...

    def __truediv__(self, other: str) -> Any: ...

    def exists(self) -> bool: ...

    def is_dir(self) -> bool: ...

    def iterdir(self) -> Iterator[Any]: ...

    def open(self, mode: str = ...) -> Any: ...


class _InboxLine(BaseModel):
    """One line of the export, as the upstream system writes it (``id``, not ``external_id``)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=MAX_EXTERNAL_ID_LENGTH)
    subject: str
    body: str
    received_at: AwareDatetime
    channel: str | None = None


def _reason_for(exc: ValidationError) -> str:
    """Reduce a validation error to one reason code, the most specific first."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    kinds = {(error["type"], tuple(error["loc"])) for error in errors}
    types = {kind for kind, _loc in kinds}
    if "json_invalid" in types:
        return "invalid_json"
    if "model_type" in types or "model_attributes_type" in types:
        return "not_an_object"
    if "missing" in types:
        return "missing_field"
    if "extra_forbidden" in types:
        return "unexpected_field"
    if ("string_too_short", ("id",)) in kinds:
        return "empty_id"
    if ("string_too_long", ("id",)) in kinds:
        return "id_too_long"
    if ("timezone_aware", ("received_at",)) in kinds:
        return "naive_received_at"
    return "invalid_field"


def parse_line(line: bytes, max_bytes: int = MAX_LINE_BYTES) -> DocumentPayload | str:
    """Parse one (non-blank) line: the payload, or the reason it is malformed. Never raises."""
    if len(line) > max_bytes:
        return "line_too_long"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    try:
        record = _InboxLine.model_validate_json(text)
    except ValidationError as exc:
        return _reason_for(exc)
    except _PARSER_LIMITS:  # pragma: no cover - defensive: parser limits
        return "invalid_json"
    if "\x00" in record.id:
        # PostgreSQL text cannot hold NUL: the id could be stored neither verbatim nor
        # unambiguously altered, so the line goes to review under its position instead.
        return "nul_in_id"
    try:
        return DocumentPayload(
            external_id=record.id,
            subject=record.subject,
            body=record.body,
            received_at=record.received_at,
            channel=record.channel,
        )
    except ValidationError as exc:
        return _payload_reason(exc)
    except _PARSER_LIMITS:  # pragma: no cover - defensive: a validator's arithmetic
        return "invalid_field"


def _payload_reason(exc: ValidationError) -> str:
    """What :class:`DocumentPayload` refuses in a line :class:`_InboxLine` accepted: a blank id,
    or a ``received_at`` that exists only with its offset (``0001-01-01T00:00:00+14:00`` is
    before year 1 in UTC)."""
    fields = {tuple(error["loc"])[:1] for error in exc.errors(include_url=False, include_input=False)}
    if ("received_at",) in fields:
        return "received_at_out_of_range"
    if ("external_id",) in fields:
        return "empty_id"
    return "invalid_field"


def _as_inbox(inbox: InboxPath | str | os.PathLike[str]) -> InboxPath:
    """Accept a plain string too: a URL (``s3://…``, ``file://…``) or a local path."""
    if isinstance(inbox, str | os.PathLike):
        from upath import UPath

        return UPath(os.fspath(inbox))  # a local path gives a pathlib-compatible PosixUPath
    return inbox


def _printable(name: str) -> str:
    """A file name as text PostgreSQL can store: bytes that are not UTF-8 (kept by Python as lone
    surrogates, which no encoder accepts) are written ``\\xff``, so the position-based ids of the
    file's lines stay distinct and storable."""
    try:
        return os.fsencode(name).decode("utf-8", "backslashreplace")
    except UnicodeError:  # not a name from this file system (object storage): keep what can be kept
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


def _day_of(name: str) -> date | None:
    """The date a folder name stands for, or ``None`` for anything else in the inbox."""
    if len(name) != 10:
        return None
    try:
        return date.fromisoformat(name)
    except ValueError:
        return None


class JsonlSource:
    """Documents from ``<inbox>/YYYY-MM-DD/*.jsonl`` (see the module docstring)."""

    name = "jsonl"

    def __init__(self, inbox: InboxPath | str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.inbox = _as_inbox(inbox)
        self.max_line_bytes = max_line_bytes

    def days(self, start: datetime, end: datetime) -> list[tuple[date, Any]]:
        """The day folders of ``[start, end)``, oldest first.

        :raises SourceError: if the inbox does not exist or cannot be listed.
        """
        require_aware(start, end)
        try:
            if not self.inbox.exists() or not self.inbox.is_dir():
                raise SourceError(f"inbox {self.inbox} does not exist or is not a folder")
            entries = list(self.inbox.iterdir())
        except OSError as exc:
            raise SourceError(f"cannot list inbox {self.inbox}: {exc.__class__.__name__}") from exc
        selected = []
        for entry in entries:
            day = _day_of(entry.name)
            if day is None:
                continue
            midnight = datetime.combine(day, time(), tzinfo=UTC)
            if start <= midnight < end and entry.is_dir():
                selected.append((day, entry))
        return sorted(selected, key=lambda item: item[0])

    def read(self, start: datetime, end: datetime) -> Iterator[SourceDocument]:
        """Yield one document per non-blank line of the interval's day folders."""
        for day, folder in self.days(start, end):
            files = sorted(
                (entry for entry in folder.iterdir() if entry.name.endswith(".jsonl")),
                key=lambda entry: entry.name,
            )
            for file in files:
                location = f"{day.isoformat()}/{_printable(file.name)}"
                if not file.is_file():
                    # A folder (or a FIFO, which would block the read) named *.jsonl: one review
                    # row for the entry, instead of an error that fails the day on every retry.
                    yield SourceDocument(self.name, location, b"", "not_a_file")
                    continue
                with file.open("rb") as stream:
                    yield from self.read_lines(location, stream)

    def read_lines(self, location: str, stream: Any) -> Iterator[SourceDocument]:
        """Turn the lines of one file (a binary stream) into documents; ``location`` names
        malformed ones. Reads with a bound (:func:`~triage.sources.lines.bounded_lines`): a line
        over ``max_line_bytes`` is never held whole, and the lines after it are read as usual."""
        for line in bounded_lines(stream, self.max_line_bytes):
            if line.blank:
                continue
            where = f"{location}:{line.number}"
            if line.oversized:
                detail: tuple[tuple[str, str | int], ...] = (("line", line.number), ("line_bytes", line.size))
                claimed = _claimed_id(line.content)
                if claimed is not None:
                    detail += (("claimed_id", claimed),)
                yield SourceDocument(self.name, where, line.content, "line_too_long", detail)
                continue
            parsed = parse_line(line.content, self.max_line_bytes)
            if isinstance(parsed, DocumentPayload):
                yield SourceDocument(self.name, parsed.external_id, parsed.to_bytes())
            else:
                yield SourceDocument(self.name, where, line.content, parsed)


_LEADING_ID = re.compile(rb'\A\s*\{\s*"id"\s*:\s*("(?:[^"\\\x00-\x1f]|\\.){1,%d}")' % (6 * MAX_EXTERNAL_ID_LENGTH))


def _claimed_id(head: bytes) -> str | None:
    """The ``id`` an oversized line starts with, when it is the line's first key (as in every
    export seen so far), so that a reviewer can find the ticket; None otherwise. Only the head
    of the line is looked at: what the reader holds anyway."""
    match = _LEADING_ID.match(head)
    if match is None:
        return None
    try:
        value = json.loads(match[1])
    except ValueError:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_EXTERNAL_ID_LENGTH or "\x00" in value:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate written as an escape
        return None
    return value
