"""The queue's query string, shared by the page and the API: the filter, the page size and the
opaque cursor (where the previous page ended), each checked before any query runs."""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path

from triage.jobs.review_queue import MAX_PAGE, Cursor, QueueFilter
from triage.jobs.review_uncertainty import UncertainCursor

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


def _place(at: str, review_id: str) -> Cursor:
    """A review row's ``(created_at, id)`` from a cursor's text. :raises ValueError: not one."""
    when = datetime.fromisoformat(at)
    if when.tzinfo is None:
        raise ValueError("no time zone")
    number = int(review_id)
    if not 0 <= number <= MAX_REVIEW_ID:
        raise ValueError("outside the column's range")
    return when, number


def _unpacked(text: str) -> list[str]:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode().split("|")


def decode_cursor(text: str) -> Cursor:
    try:
        at, review_id = _unpacked(text)
        return _place(at, review_id)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise BadQuery("cursor: not a cursor this server gave (take next_cursor from the previous page)") from None


ORDERS = ("oldest", "uncertainty")
"""The queue's orders: ``oldest`` (the default: open reviews oldest first) and ``uncertainty``
(what the model is least sure of first, :mod:`triage.jobs.review_uncertainty`)."""
UNCERTAIN_TAG = "u"


def encode_uncertain_cursor(cursor: UncertainCursor) -> str:
    """An uncertainty-order cursor: tagged, so that it is never read as the default order's."""
    key, at, review_id = cursor
    raw = f"{UNCERTAIN_TAG}|{key!r}|{at.isoformat()}|{review_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_uncertain_cursor(text: str) -> UncertainCursor:
    try:
        tag, key, at, review_id = _unpacked(text)
        value = float(key)
        if tag != UNCERTAIN_TAG or not math.isfinite(value):  # a NaN would compare as no number does
            raise ValueError("not an uncertainty cursor")
        return (value, *_place(at, review_id))
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise BadQuery(
            "cursor: not a cursor this server gave for order=uncertainty (take next_cursor from the previous page)"
        ) from None


def parse_order(order: str | None) -> str:
    if order is None or not order.strip():
        return ORDERS[0]
    if order.strip() not in ORDERS:
        raise BadQuery(f"order: one of {', '.join(ORDERS)}")
    return order.strip()


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


@dataclass(frozen=True, slots=True)
class QueueView:
    """The queue's order and page: ``after`` is where the default order's page starts,
    ``after_uncertain`` the uncertainty order's (at most one is set: the order's own)."""

    order: str
    size: int
    after: Cursor | None = None
    after_uncertain: UncertainCursor | None = None


def ordered_position(order: str | None = None, limit: str | None = None, cursor: str | None = None) -> QueueView:
    """The order, the page's size and where it starts (a FastAPI dependency): 400 when any is bad.
    A cursor is read as its order's: one of the other order is refused, never misread."""
    try:
        chosen, size = parse_order(order), parse_limit(limit)
        if chosen == "uncertainty":
            return QueueView(chosen, size, after_uncertain=decode_uncertain_cursor(cursor) if cursor else None)
        return QueueView(chosen, size, after=decode_cursor(cursor) if cursor else None)
    except BadQuery as exc:
        raise HTTPException(400, str(exc)) from None


RunId = Annotated[int, Path(ge=0, le=MAX_REVIEW_ID, description="a reconciliation run's id (a bigint)")]
"""A report's run id in a path: outside ``reconciliation_runs.id``'s range, 422 before any query."""
Filter = Annotated[QueueFilter, Depends(queue_filter)]
Position = Annotated[tuple[int, Cursor | None], Depends(queue_position)]
OrderedPosition = Annotated[QueueView, Depends(ordered_position)]
"""``(order, limit, after)`` of the API's queue: ``?order=uncertainty`` with its own cursors."""
