"""The event registry: ``include/schemas/`` is what consumers validate against, so a model may
not drift from its committed schema, and a published version may change only additively.

When a test here fails: a change a consumer can see needs, by the compatibility rule
(``docs/events.md``, :mod:`triage.contracts.events`), either nothing more than regenerating the
files (``make schemas``: a new payload key, a new event type) or ``SCHEMA_VERSION + 1`` with
files of its own (anything else: the envelope is closed). ``tests/unit/frozen/`` keeps version 1
as it was published before this rule; the current file must stay additive to it.
"""

from __future__ import annotations

import copy
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest

from tests.unit.frozen import FROZEN_V1, v1_consumer
from triage.contracts.event_payloads import PAYLOADS
from triage.contracts.events import EVENT_TYPES, SCHEMA_VERSION, SUPPORTED_VERSIONS, WorkEvent, registry
from triage_tools.schemas import SCHEMAS, differences


def published(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / name).read_text(encoding="utf-8"))


def test_every_model_is_exactly_its_committed_schema_and_nothing_else_is_committed() -> None:
    assert differences() == [], "include/schemas/ and the models differ: see this test's module doc"


def test_every_supported_version_and_only_those_is_published() -> None:
    assert {p.name for p in SCHEMAS.glob("work_event.v*.json")} == {f"work_event.v{v}.json" for v in SUPPORTED_VERSIONS}
    for version in SUPPORTED_VERSIONS:
        assert published(f"work_event.v{version}.json")["properties"]["schema_version"]["const"] == version


def test_every_event_type_has_a_payload_schema_and_payloads_are_open() -> None:
    assert set(PAYLOADS) == EVENT_TYPES
    for event_type in EVENT_TYPES:
        schema = published(f"payloads/{event_type}.v{SCHEMA_VERSION}.json")
        assert schema["additionalProperties"] is True, f"{event_type}: a consumer must be able to ignore new keys"


# -- the compatibility rule, mechanically --------------------------------------------------------


def additive_problems(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Why ``new`` is not an additive change of ``old`` (an envelope schema): empty when every
    event ``old`` accepts of the types ``old`` knows, ``new`` accepts too, and ``new`` adds
    nothing to the closed envelope. Wording (titles, descriptions) may change; an enum may grow
    only for ``event_type`` (new types: consumers skip those they do not know)."""
    problems = []
    if new.get("additionalProperties") != old.get("additionalProperties"):
        problems.append("additionalProperties changed")
    if set(new.get("required", [])) - set(old.get("required", [])):
        problems.append(f"newly required: {sorted(set(new['required']) - set(old.get('required', [])))}")
    old_props, new_props = old["properties"], new["properties"]
    if removed := set(old_props) - set(new_props):
        problems.append(f"removed: {sorted(removed)}")
    if (added := set(new_props) - set(old_props)) and old.get("additionalProperties") is False:
        problems.append(f"added to a closed object: {sorted(added)}")
    for name in set(old_props) & set(new_props):
        before, after = (_meaning(old_props[name]), _meaning(new_props[name]))
        if name == "event_type" and "enum" in before and "enum" in after:
            missing = set(before.pop("enum")) - set(after.pop("enum"))
            problems += [f"event_type lost {sorted(missing)}"] if missing else []
        if before != after:
            problems.append(f"{name} changed: {before} -> {after}")
    return problems


def _meaning(prop: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in copy.deepcopy(prop).items() if k not in ("title", "description")}


def test_the_published_v1_is_additive_to_v1_as_frozen() -> None:
    assert additive_problems(FROZEN_V1, published("work_event.v1.json")) == []


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s["properties"].pop("payload_ref"), id="field removed"),
        pytest.param(lambda s: s["properties"].__setitem__("tenant", {"type": "string"}), id="envelope field added"),
        pytest.param(lambda s: s["properties"]["attempt"].__setitem__("type", "string"), id="field retyped"),
        pytest.param(lambda s: s["required"].append("payload"), id="field newly required"),
        pytest.param(lambda s: s["properties"]["event_type"]["enum"].remove("job.reviewed"), id="event type dropped"),
        pytest.param(lambda s: s["properties"]["attempt"].__setitem__("minimum", 1), id="range narrowed"),
    ],
)
def test_the_rule_refuses_what_a_v1_consumer_could_not_read(change: Any) -> None:
    changed = copy.deepcopy(FROZEN_V1)
    change(changed)
    assert additive_problems(FROZEN_V1, changed) != []


def test_the_rule_accepts_new_event_types_and_new_wording() -> None:
    changed = copy.deepcopy(FROZEN_V1)
    changed["properties"]["event_type"]["enum"].append("job.archived")
    changed["properties"]["payload"]["description"] = "reworded"
    assert additive_problems(FROZEN_V1, changed) == []


# -- a v1 consumer ------------------------------------------------------------------------------


EXAMPLES: dict[str, dict[str, Any] | None] = {
    "job.registered": None,
    "job.completed": {"label": "billing", "confidence": 0.93, "classifier_version": "keyword-v1"},
    "job.requeued": {"resolution": "requeued", "resolved_by": "alice"},
    "job.reviewed": {"resolution": "rejected", "resolved_by": "alice"},
    "job.needs_review": {"reason": "retries_exhausted", "error_class": "timeout"},
    "job.failed": {"reason": "unsupported_schema", "error_class": "unsupported_schema"},
}


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_what_the_relay_writes_validates_against_the_published_schemas(event_type: str) -> None:
    assert set(EXAMPLES) == EVENT_TYPES
    event = WorkEvent(
        event_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        event_type=event_type,  # type: ignore[arg-type]  # every name of EVENT_TYPES, a str here
        attempt=1,
        occurred_at=datetime(2026, 11, 1, tzinfo=UTC),
        correlation_id="c-1",
        payload_ref="p",
        payload=EXAMPLES[event_type],
    )
    written = json.loads(event.to_json())  # the sinks' encoding (triage.pipeline.publish)
    checker = jsonschema.FormatChecker()
    jsonschema.validate(written, published(f"work_event.v{SCHEMA_VERSION}.json"), format_checker=checker)
    jsonschema.validate(written.get("payload", {}), published(f"payloads/{event_type}.v{SCHEMA_VERSION}.json"))
    read = v1_consumer(event.to_json())
    assert (read is None) == (event_type in ("job.needs_review", "job.failed"))  # new types: skipped


def test_the_registry_names_the_envelope_and_one_payload_per_type() -> None:
    assert set(registry()) == {f"work_event.v{SCHEMA_VERSION}.json"} | {
        f"payloads/{t}.v{SCHEMA_VERSION}.json" for t in EVENT_TYPES
    }
