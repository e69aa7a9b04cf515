"""Version 1 of the event contract as published before the compatibility rule (session 7): the
schema file, copied from ``include/schemas/work_event.v1.json`` at that time, and a consumer
written against it. Never regenerated: it stands for the consumers already out there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

FROZEN_V1: dict[str, Any] = json.loads((Path(__file__).parent / "work_event.v1.json").read_text(encoding="utf-8"))
V1_TYPES = frozenset(FROZEN_V1["properties"]["event_type"]["enum"])


def v1_consumer(raw: bytes | str) -> dict[str, Any] | None:
    """A consumer written against version 1 as frozen: it routes on ``event_type`` first and
    skips types it does not know (the rule), then validates the rest with its copy of the
    schema (raising on anything it cannot read). Returns the event, or None when skipped."""
    event: dict[str, Any] = json.loads(raw)
    if event.get("event_type") not in V1_TYPES:
        return None
    jsonschema.validate(event, FROZEN_V1, format_checker=jsonschema.FormatChecker())
    return event
