"""The events Triage emits: strict pydantic models with an explicit schema version.

Events are claim checks: they carry ``payload_ref``, never the document. A reader meets
``schema_version`` first: a version it does not know raises :class:`UnsupportedSchemaVersion`
rather than being misread; then ``event_type``: a type it does not know raises
:class:`UnknownEventType`, which a consumer skips (the compatibility rule below).

The registry: the JSON schema of the envelope of each version and of each event type's
``payload`` is generated from these models into ``include/schemas/`` (:func:`registry`;
``make schemas`` writes them, ``triage schemas --check`` compares), and tests fail when a
committed file and its model differ, and when a change to a published version is not additive.

The compatibility rule (``docs/events.md``):

- additive changes keep the version: a new key in an event type's ``payload`` (payloads are
  open objects: a consumer ignores keys it does not know), a new event type (a consumer skips
  event types it does not know, before validating the rest);
- anything else needs ``SCHEMA_VERSION + 1`` and a file of its own, the old one published as
  long as it is supported: a field of the envelope added (it is closed:
  ``additionalProperties: false``), removed, renamed or retyped, a payload key removed or
  retyped, a meaning changed.

``payload`` is optional: an event without one is serialised without the key
(:meth:`WorkEvent.to_json`), byte for byte what version 1 always was.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal, get_args

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({SCHEMA_VERSION})

EventType = Literal["job.registered", "job.completed", "job.requeued", "job.reviewed", "job.needs_review", "job.failed"]
EVENT_TYPES: frozenset[str] = frozenset(get_args(EventType))


class UnsupportedSchemaVersion(ValueError):
    """The event's schema version is not one this code can read."""

    def __init__(self, version: object) -> None:
        super().__init__(f"unsupported event schema_version {version!r}; supported: {sorted(SUPPORTED_VERSIONS)}")
        self.version = version


class MalformedEvent(ValueError):
    """The bytes are not an event of a supported schema."""


class UnknownEventType(MalformedEvent):
    """An event type this code does not know (a newer producer's): skip it, as the
    compatibility rule asks of every consumer."""

    def __init__(self, event_type: object) -> None:
        super().__init__(f"unknown event_type {event_type!r}; known: {sorted(EVENT_TYPES)}")
        self.event_type = event_type


class WorkEvent(BaseModel):
    """Something happened to a job. Version 1."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    event_id: uuid.UUID
    job_id: uuid.UUID
    event_type: EventType
    schema_version: Literal[1] = Field(default=1)
    attempt: int = Field(ge=0)
    occurred_at: AwareDatetime
    correlation_id: str = Field(min_length=1)
    payload_ref: str = Field(min_length=1)
    payload: dict[str, Any] | None = Field(
        default=None,
        description="What the event type adds, never document text: an open object whose keys "
        "each event type names (include/schemas/payloads/<event_type>.v1.json); a consumer ignores "
        "keys it does not know.",
    )

    def to_json(self) -> bytes:
        """The event as sent: compact JSON, without ``payload`` when there is none."""
        return self.model_dump_json(exclude_none=True).encode()


def parse_event(raw: bytes | str | dict[str, Any]) -> WorkEvent:
    """Decode an event, routing an unknown ``schema_version`` explicitly."""
    try:
        data = json.loads(raw) if isinstance(raw, bytes | str) else raw
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser's stack
        raise MalformedEvent(f"not JSON: {exc.__class__.__name__}") from None
    if not isinstance(data, dict):
        raise MalformedEvent("an event is a JSON object")
    version = data.get("schema_version")
    # type() first: a list or object version is unhashable, and True == 1 must not pass as 1.
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise UnsupportedSchemaVersion(version)
    event_type = data.get("event_type")
    if isinstance(event_type, str) and event_type not in EVENT_TYPES:
        raise UnknownEventType(event_type)
    try:
        return WorkEvent.model_validate(data, strict=False)  # JSON gives strings for uuid/datetime
    except ValidationError as exc:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
        raise MalformedEvent(f"invalid event fields: {fields}") from None


def json_schema() -> dict[str, Any]:
    """The envelope's JSON schema (every event type) of :data:`SCHEMA_VERSION`."""
    return WorkEvent.model_json_schema()


def registry() -> dict[str, dict[str, Any]]:
    """Every published schema of the current version, by its path under ``include/schemas/``:
    the envelope and each event type's payload (:mod:`triage.contracts.event_payloads`)."""
    from triage.contracts.event_payloads import PAYLOADS

    schemas = {f"work_event.v{SCHEMA_VERSION}.json": json_schema()}
    for event_type, model in sorted(PAYLOADS.items()):
        schemas[f"payloads/{event_type}.v{SCHEMA_VERSION}.json"] = model.model_json_schema()
    return schemas


def schema_text(schema: dict[str, Any]) -> str:
    """A schema as committed: indented, keys sorted, a final newline."""
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
