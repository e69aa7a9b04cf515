"""The published JSON schema of each event version is pinned: ``include/schemas/`` is what
consumers validate against, so the model may not drift from it without a new ``schema_version``.

When a test here fails: a change a consumer can see (a field added, removed, renamed, retyped,
a new event type) needs ``SCHEMA_VERSION + 1`` with its own file, the old one kept while it is
supported; only a change of wording may rewrite the current file, with::

    PYTHONPATH=plugins python -c "import json; from triage.contracts.events import json_schema, \
SCHEMA_VERSION as v; open(f'include/schemas/work_event.v{v}.json', 'w').write(json.dumps(json_schema(), \
indent=2, sort_keys=True) + '\\n')"
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest

from triage.contracts.events import SCHEMA_VERSION, SUPPORTED_VERSIONS, WorkEvent, json_schema

SCHEMAS = Path(__file__).resolve().parents[2] / "include" / "schemas"


def published(version: int) -> str:
    return (SCHEMAS / f"work_event.v{version}.json").read_text(encoding="utf-8")


def test_the_current_version_is_exactly_the_published_schema() -> None:
    assert published(SCHEMA_VERSION) == json.dumps(json_schema(), indent=2, sort_keys=True) + "\n", (
        f"WorkEvent no longer matches include/schemas/work_event.v{SCHEMA_VERSION}.json: see this test's module doc"
    )


def test_every_supported_version_and_only_those_is_published() -> None:
    assert {p.name for p in SCHEMAS.glob("work_event.v*.json")} == {f"work_event.v{v}.json" for v in SUPPORTED_VERSIONS}
    for version in SUPPORTED_VERSIONS:
        assert json.loads(published(version))["properties"]["schema_version"]["const"] == version


@pytest.mark.parametrize("event_type", ["job.registered", "job.completed", "job.requeued", "job.reviewed"])
def test_what_the_relay_writes_validates_against_the_published_schema(event_type: str) -> None:
    event = WorkEvent(
        event_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        event_type=event_type,
        attempt=1,  # type: ignore[arg-type]
        occurred_at=datetime(2026, 11, 1, tzinfo=UTC),
        correlation_id="c-1",
        payload_ref="p",
    )
    written = json.loads(event.model_dump_json())  # the sinks' encoding (triage.pipeline.publish)
    jsonschema.validate(written, json.loads(published(SCHEMA_VERSION)), format_checker=jsonschema.FormatChecker())
