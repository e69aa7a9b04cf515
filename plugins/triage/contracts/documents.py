"""The document payload: the bytes a job's ``payload_ref`` points at (the claim check).

A payload is stored once, addressed by the SHA-256 of its bytes, and read back by the classify
step long after retrieval, possibly by a newer release of this code. Two things follow:

* the bytes must be *canonical* (sorted keys, compact separators, UTF-8, no ASCII escaping,
  ``received_at`` in UTC), so
  the same document always hashes to the same ``content_sha256`` and therefore the same
  idempotency key, whichever source or process produced it;
* reading must never guess: anything that is not exactly a version-1 payload is refused with a
  :class:`MalformedDocument` whose ``reason`` is a short machine-readable code, which the job
  ledger records when it routes the job to manual review.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "MALFORMED_REASONS",
    "MAX_EXTERNAL_ID_LENGTH",
    "DocumentPayload",
    "MalformedDocument",
    "canonical_json_bytes",
]

MAX_EXTERNAL_ID_LENGTH: Final = 512
"""Longest accepted external id (characters); longer ids are refused, never truncated."""

MALFORMED_REASONS: Final = frozenset({"invalid_utf8", "invalid_json", "schema_mismatch", "unsupported_schema_version"})
"""Every ``reason`` :meth:`DocumentPayload.from_bytes` can give."""


class MalformedDocument(ValueError):
    """The bytes are not a version-1 document payload.

    ``reason`` is one of :data:`MALFORMED_REASONS`. The message never contains document text:
    it ends up in logs and in ``triage.manual_review.last_error``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def canonical_json_bytes(data: Any) -> bytes:
    """Serialise JSON-compatible ``data`` the one way Triage hashes it.

    Sorted keys and compact separators make the bytes independent of dict order;
    ``ensure_ascii=False`` keeps non-ASCII text as UTF-8 rather than ``\\uXXXX`` escapes, so
    there is exactly one encoding per document.
    """
    return _CANONICAL.encode(data).encode()


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""What ``json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` builds
on every call, built once (a third of the cost of a payload's bytes)."""


class DocumentPayload(BaseModel):
    """One document to classify, as stored behind ``payload_ref``.

    Strict and closed (``extra="forbid"``): a payload written by a future schema must not be
    silently read as this one, which is also why ``schema_version`` is checked first.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    external_id: str = Field(min_length=1, max_length=MAX_EXTERNAL_ID_LENGTH)
    subject: str
    body: str
    received_at: AwareDatetime
    channel: str | None = None
    # Intake's optional client metadata (flat, scalar values). Left out of the bytes when absent,
    # so every payload written before it existed keeps its bytes, hash and idempotency key.
    metadata: dict[str, str | int | float | bool | None] | None = None

    @field_validator("external_id")
    @classmethod
    def _external_id_not_blank(cls, value: str) -> str:
        # A whitespace-only id is as useless as an empty one for deduplication and review.
        if not value.strip():
            raise ValueError("external_id is blank")
        if "\x00" in value:  # every other character is stored verbatim; PostgreSQL text refuses NUL
            raise ValueError("external_id holds NUL, which PostgreSQL text cannot store")
        return value

    @field_validator("received_at")
    @classmethod
    def _in_utc(cls, value: datetime) -> datetime:
        # One instant, one encoding: offsets would make equal documents hash differently, and
        # historical offsets with seconds (LMT) do not survive ISO 8601 serialisation at all.
        try:
            return value.astimezone(UTC)
        except OverflowError:
            # 0001-01-01T00:00+14:00 is a valid ISO 8601 string but no instant Python can hold
            # in UTC. Pydantic lets OverflowError through a validator; ValueError it turns into
            # a ValidationError, so the document is refused like any other invalid field.
            raise ValueError("received_at lies outside the years 1-9999 once converted to UTC") from None

    @field_validator("external_id", "subject", "body", "channel")
    @classmethod
    def _encodable(cls, value: str | None) -> str | None:
        # Python callers can build strings holding lone surrogates; they cannot be written as
        # UTF-8, so they would only fail later, in to_bytes(), far from their cause.
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError("text is not encodable as UTF-8") from exc
        return value

    @property
    def text(self) -> str:
        """What a classifier reads: the subject, a blank line, then the body."""
        return f"{self.subject}\n\n{self.body}"

    def to_bytes(self) -> bytes:
        """The canonical bytes of this payload (see :func:`canonical_json_bytes`)."""
        return canonical_json_bytes(self.model_dump(mode="json", exclude=None if self.metadata else {"metadata"}))

    @classmethod
    def from_bytes(cls, data: bytes) -> DocumentPayload:
        """Decode stored payload bytes, refusing anything that is not a version-1 payload.

        :raises MalformedDocument: with reason ``invalid_utf8``, ``invalid_json``,
            ``unsupported_schema_version`` or ``schema_mismatch``; never anything else.
        """
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedDocument("invalid_utf8") from None
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise MalformedDocument(_reason_for(exc)) from None
        except (ValueError, ArithmeticError, RecursionError):  # pragma: no cover - defensive: parser limits
            raise MalformedDocument("invalid_json") from None


def _reason_for(exc: ValidationError) -> str:
    """Reduce a validation error to one reason code, the most specific first."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    if any(error["type"] == "json_invalid" for error in errors):
        return "invalid_json"
    if any(tuple(error["loc"]) == ("schema_version",) for error in errors):
        return "unsupported_schema_version"
    return "schema_mismatch"
