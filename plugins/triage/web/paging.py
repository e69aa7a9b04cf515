"""The queue's query string, shared by the page and the API: the filter, the page size and the
opaque cursor (where the previous page ended), each checked before any query runs."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path

from triage.jobs.sql.reads.review_queue import MAX_PAGE, Cursor, QueueFilter

DEFAULT_PAGE = 50
MAX_REVIEW_ID = 2**63 - 1
"""The largest ``manual_review.id`` (a ``bigint``): a cursor past it is refused, never sent to
PostgreSQL (which would fail the query)."""
MAX_FILTER_CHARS = 500


class BadQuery(ValueError):
    """A query parameter that cannot be used (the message names it)."""


def encode_cursor(cursor: Cursor) -> str:
    at, review_id = cursor
    return base64.urlsafe_b64encode(f"{at.isoformat()}|{review_id}".encode()).decode().rstrip("=")


def decode_cursor(text: str) -> Cursor:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        at, review_id = raw.split("|")
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError("no time zone")
        number = int(review_id)
        if not 0 <= number <= MAX_REVIEW_ID:
            raise ValueError("outside the column's range")
        return when, number
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise BadQuery("cursor: not a cursor this server gave (take next_cursor from the previous page)") from None


def _text(name: str, value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    if len(value) > MAX_FILTER_CHARS:
        raise BadQuery(f"{name}: at most {MAX_FILTER_CHARS} characters")
    return value.strip()


def parse_filter(*, reason: str | None, source: str | None, batch: str | None, older_than: str | None) -> QueueFilter:
    """``older_than``: seconds in review at least (a number, ``0`` or more), or blank."""
    age: float | None = None
    if older_than is not None and older_than.strip():
        try:
            age = float(older_than)
        except ValueError:
            raise BadQuery("older_than: a number of seconds") from None
        if not 0 <= age <= 10 * 365 * 86400:
            raise BadQuery("older_than: between 0 and ten years, in seconds")
    return QueueFilter(_text("reason", reason), _text("source", source), _text("batch", batch), age)


def parse_limit(limit: str | int | None) -> int:
    if limit is None or limit == "":
        return DEFAULT_PAGE
    try:
        value = int(limit)
    except ValueError:
        raise BadQuery(f"limit: a whole number from 1 to {MAX_PAGE}") from None
    if not 1 <= value <= MAX_PAGE:
        raise BadQuery(f"limit: a whole number from 1 to {MAX_PAGE}")
    return value


def filter_query(where: QueueFilter) -> dict[str, Any]:
    """The filter as query parameters (for the next page's link)."""
    out: dict[str, Any] = {"reason": where.reason, "source": where.source, "batch": where.batch}
    if where.older_than_seconds is not None:
        out["older_than"] = f"{where.older_than_seconds:g}"
    return {k: v for k, v in out.items() if v is not None}


def queue_filter(
    reason: str | None = None, source: str | None = None, batch: str | None = None, older_than: str | None = None
) -> QueueFilter:
    """The queue's filter from the query string (a FastAPI dependency): 400 when it is bad."""
    try:
        return parse_filter(reason=reason, source=source, batch=batch, older_than=older_than)
    except BadQuery as exc:
        raise HTTPException(400, str(exc)) from None


def queue_position(limit: str | None = None, cursor: str | None = None) -> tuple[int, Cursor | None]:
    """The page's size and where it starts (a FastAPI dependency): 400 when either is bad."""
    try:
        return parse_limit(limit), decode_cursor(cursor) if cursor else None
    except BadQuery as exc:
        raise HTTPException(400, str(exc)) from None


RunId = Annotated[int, Path(ge=0, le=MAX_REVIEW_ID, description="a reconciliation run's id (a bigint)")]
"""A report's run id in a path: outside ``reconciliation_runs.id``'s range, 422 before any query."""
Filter = Annotated[QueueFilter, Depends(queue_filter)]
Position = Annotated[tuple[int, Cursor | None], Depends(queue_position)]
