"""The events Triage emits: strict pydantic models with an explicit schema version.

Events are claim checks: they carry ``payload_ref``, never the document. A reader meets
``schema_version`` first: a version it does not know raises :class:`UnsupportedSchemaVersion`
rather than being misread. The JSON schema of each version is kept in ``include/schemas/``
(``python -m triage.contracts.events`` prints it) and a test fails when the file and the model
differ.

``payload`` is optional: the event type's extra data, e.g. a review decision's label and
reviewer. An event without one is serialised without the key (:meth:`WorkEvent.to_json`), byte
for byte what version 1 always was, so a reader that predates the field still reads it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({SCHEMA_VERSION})

EventType = Literal["job.registered", "job.completed", "job.requeued", "job.reviewed"]


class UnsupportedSchemaVersion(ValueError):
    """The event's schema version is not one this code can read."""

    def __init__(self, version: object) -> None:
        super().__init__(f"unsupported event schema_version {version!r}; supported: {sorted(SUPPORTED_VERSIONS)}")
        self.version = version


class MalformedEvent(ValueError):
    """The bytes are not an event of a supported schema."""


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
        description="What the event type adds, never document text: for a review decision "
        "'resolution', 'resolved_by' (the reviewer) and, for a label, 'label'.",
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
    try:
        return WorkEvent.model_validate(data, strict=False)  # JSON gives strings for uuid/datetime
    except ValidationError as exc:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
        raise MalformedEvent(f"invalid event fields: {fields}") from None


def json_schema() -> dict[str, Any]:
    return WorkEvent.model_json_schema()


if __name__ == "__main__":  # regenerate include/schemas/work_event.v1.json
    print(json.dumps(json_schema(), indent=2, sort_keys=True))
