"""Replay by filter: which failed jobs to take back to ``queued``, validated strictly.

The filter comes from untrusted places (the ``review_jobs`` trigger form, a command line), so
every field is typed and bounded, unknown keys are refused, and a problem is one typed error,
:class:`InvalidReplayFilter`, naming every field at fault. The values only ever reach SQL as
bound parameters; the patterns keep control characters and runaway lengths out of the logs and
the audit trail too.

:class:`ReplaySelection` declares the fields once: the ``review_jobs`` params model inherits
them (the form), and :class:`ReplayFilter` adds the rules of a filter that may run.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from triage.contracts.params import InvalidParams, problems

MAX_REPLAY_LIMIT = 10_000
"""The most jobs one replay may move, whatever it asks: a bigger set is several replays."""

DEFAULT_REPLAY_LIMIT = 1_000
PREVIEW_ROWS = 25
"""How many of the matching jobs a preview lists (it counts them all)."""

ReplayState = Literal["manual_review", "terminal_failed"]
REPLAY_STATES: tuple[ReplayState, ...] = ("manual_review", "terminal_failed")

_NAME = r"^[A-Za-z0-9_.:\-]{1,128}$"  # reasons and error classes: identifiers, never prose
_PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]{1,256}$"  # no controls or bidi


class InvalidReplayFilter(InvalidParams):
    """The replay's filter is not valid; nothing was read or changed."""


class ReplaySelection(BaseModel):
    """The fields of a replay's filter (all optional here; :class:`ReplayFilter` checks them as a whole)."""

    reason: str | None = Field(
        default=None,
        pattern=_NAME,
        title="Reason",
        description="Replay: only jobs whose review reason (manual_review) or status reason (terminal_failed) "
        "is this, e.g. retries_exhausted.",
        json_schema_extra={"section": "Replay by filter"},
    )
    error_class: str | None = Field(
        default=None,
        pattern=_NAME,
        title="Error class",
        description="Replay: only jobs whose last error class is this, e.g. ModelTimeout.",
        json_schema_extra={"section": "Replay by filter"},
    )
    states: list[ReplayState] = Field(
        default=["manual_review"],
        min_length=1,
        max_length=2,
        title="States",
        description="Replay: the states to take jobs from (manual_review, terminal_failed, or both).",
        json_schema_extra={"section": "Replay by filter", "examples": list(REPLAY_STATES), "uniqueItems": True},
    )
    source: str | None = Field(
        default=None,
        pattern=_PRINTABLE,
        title="Source",
        description="Replay: only jobs of this source (e.g. synthetic, jsonl).",
        json_schema_extra={"section": "Replay by filter"},
    )
    batch_key: str | None = Field(
        default=None,
        pattern=_PRINTABLE,
        title="Batch",
        description="Replay: only jobs of this batch (a classify_documents run's data interval, as in the report).",
        json_schema_extra={"section": "Replay by filter"},
    )
    since: datetime | None = Field(
        default=None,
        title="Failed since",
        description="Replay: only jobs that entered their state at or after this time (UTC when no zone is given).",
        json_schema_extra={"section": "Replay by filter"},
    )
    until: datetime | None = Field(
        default=None,
        title="Failed until",
        description="Replay: only jobs that entered their state before this time (UTC when no zone is given).",
        json_schema_extra={"section": "Replay by filter"},
    )
    limit: int = Field(
        default=DEFAULT_REPLAY_LIMIT,
        ge=1,
        le=MAX_REPLAY_LIMIT,
        strict=True,
        title="Limit",
        description=f"Replay: move at most this many jobs (at most {MAX_REPLAY_LIMIT:,}), oldest failure first.",
        json_schema_extra={"section": "Replay by filter"},
    )
    dry_run: bool = Field(
        default=True,
        strict=True,
        title="Dry run",
        description="Replay: only say how many jobs match and which (the first "
        f"{PREVIEW_ROWS}); change nothing. Untick to apply (a note is then required).",
        json_schema_extra={"section": "Replay by filter"},
    )

    @field_validator("since", "until")
    @classmethod
    def _in_utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    @field_validator("states")
    @classmethod
    def _each_state_once(cls, value: list[ReplayState]) -> list[ReplayState]:
        if len(set(value)) != len(value):
            raise ValueError("a state is named twice")
        return sorted(value)

    def selection(self) -> dict[str, Any]:
        """The filter's fields that select jobs, JSON-ready (dates as ISO text), in a fixed order."""
        fields = ("reason", "error_class", "states", "source", "batch_key", "since", "until", "limit")
        return {name: _jsonable(getattr(self, name)) for name in fields}

    def narrows(self) -> bool:
        """Whether anything but the states narrows the selection."""
        return any(getattr(self, name) is not None for name in NARROWING_FIELDS)


NARROWING_FIELDS = ("reason", "error_class", "source", "batch_key", "since", "until")


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


class ReplayFilter(ReplaySelection):
    """A filter that may run: at least one narrowing field (never "every failed job" by accident),
    a date range that is a range, and a note whenever it is to be applied.

    :param note: why (kept in the replay's request row and on each review row it resolves).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    note: str | None = Field(default=None, max_length=2000)

    @field_validator("note")
    @classmethod
    def _note_text(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if any(ord(ch) < 32 and ch not in "\n\t" for ch in value) or "\x7f" in value:
            raise ValueError("the note may not contain control characters")
        return value or None

    @model_validator(mode="after")
    def _a_filter_that_may_run(self) -> ReplayFilter:
        if not self.narrows():
            raise ValueError(
                f"name at least one of {', '.join(NARROWING_FIELDS)}: a replay never takes every failed job by accident"
            )
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("since must be before until")
        if not self.dry_run and not self.note:
            raise ValueError("applying a replay needs a note saying why")
        return self

    @classmethod
    def parse(cls, data: Any) -> ReplayFilter:
        """Validate untrusted input (a mapping); :class:`InvalidReplayFilter` names every problem."""
        if not isinstance(data, dict):
            raise InvalidReplayFilter(f"a replay filter is an object, not {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InvalidReplayFilter(f"invalid replay filter: {problems(exc, 'filter')}") from None

    def replay_key(self) -> str:
        """The request's identity: a digest of the selection and the note. The same submission
        twice is the same request (applied once); a new note is a new request."""
        document = json.dumps({**self.selection(), "note": self.note}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(document.encode()).hexdigest()[:24]
