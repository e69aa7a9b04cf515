"""``POST /triage/api/labels``: labelled examples in a batch, as ``triage labels import`` takes them.

    {"examples": [{"source": "helpdesk", "external_id": "T-1", "subject": "...", "body": "...",
                   "label": "billing", "received_at": "...", "channel": "..."}]}

``received_at`` and ``channel`` are optional. Each example is checked on its own by the rules
of the import (:mod:`triage.learning.examples`): the good ones are stored, each bad one gets
its own entry with the reason (a label outside the taxonomy included) and the answer is 422;
with none bad, 201 when any was added, 200 when every one was there already (idempotent by
source and external id). Posting examples is a reviewer's act: it needs the same access as a
review decision (edit access to ``review_jobs``), and the caller is recorded as who labelled.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Final

from fastapi import APIRouter, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from triage.learning.examples import (
    InvalidSource,
    LabelledDocument,
    Refusal,
    TaxonomyNotMigrated,
    check_source,
    parse_example,
)
from triage.web.access import ReviewReader, check_decider
from triage.web.intake import read_body

router = APIRouter(prefix="/api")

MAX_EXAMPLES: Final = 1000
"""Examples in one request; a larger batch is refused whole (413)."""

MAX_BODY_BYTES: Final = 32 << 20
"""The largest request body read (413 past it, never buffered whole)."""


def examples_of(body: bytes) -> list[Any]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise HTTPException(422, "the body is not JSON (UTF-8)") from None
    if not isinstance(data, dict) or set(data) != {"examples"} or not isinstance(data["examples"], list):
        raise HTTPException(422, 'the body is {"examples": [...]} and nothing else')
    if not data["examples"]:
        raise HTTPException(422, "the batch holds no example")
    if len(data["examples"]) > MAX_EXAMPLES:
        raise HTTPException(413, f"at most {MAX_EXAMPLES} examples per request")
    return list(data["examples"])


@router.post("/labels")
async def post_labels(request: Request, caller: ReviewReader) -> JSONResponse:
    check_decider(request, caller)
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise HTTPException(415, "send the examples as application/json")
    examples = examples_of(await read_body(request, MAX_BODY_BYTES))
    return await run_in_threadpool(_store, request, examples, caller.name)


def _store(request: Request, examples: list[Any], labelled_by: str) -> JSONResponse:
    triage = request.app.state.triage
    names = triage.taxonomy()
    entries: dict[int, dict[str, Any]] = {}
    by_source: dict[str, list[tuple[int, LabelledDocument]]] = defaultdict(list)
    for index, raw in enumerate(examples):
        parsed = _parse(index, raw, names)
        if isinstance(parsed, Refusal):
            entries[index] = {
                "index": index,
                "external_id": parsed.external_id,
                "status": "invalid",
                "reason": parsed.reason,
                "detail": parsed.detail,
            }
        else:
            source, example = parsed
            by_source[source].append((index, example))
    for source, chunk in by_source.items():
        try:
            report = triage.import_labels([example for _, example in chunk], source=source, labelled_by=labelled_by)
        except TaxonomyNotMigrated as exc:  # the deployment's taxonomy file is ahead of its ledger
            raise HTTPException(409, str(exc)) from None
        for index, example in chunk:
            external_id = example.payload.external_id
            added = external_id in report.added_ids
            entries[index] = {
                "index": index,
                "source": source,
                "external_id": external_id,
                "status": "added" if added else "already_present",
            }
            report.added_ids.discard(external_id)  # a repeated id in the batch: only its first was added
        for refusal in report.refused:  # an id repeated with another label or text
            entries[refusal.position] = {
                "index": refusal.position,
                "source": source,
                "external_id": refusal.external_id,
                "status": "invalid",
                "reason": refusal.reason,
                "detail": refusal.detail,
            }
    answers = [entries[index] for index in sorted(entries)]
    invalid = any(entry["status"] == "invalid" for entry in answers)
    code = 422 if invalid else 201 if any(entry["status"] == "added" for entry in answers) else 200
    return JSONResponse(jsonable_encoder({"examples": answers}), status_code=code)


def _parse(index: int, raw: Any, names: list[str]) -> tuple[str, LabelledDocument] | Refusal:
    if not isinstance(raw, dict):
        return Refusal(index, "not_an_object", "an example is a JSON object")
    fields = dict(raw)
    source = fields.pop("source", None)
    external_id = fields.pop("external_id", None)
    claimed = external_id if isinstance(external_id, str) else None
    if not isinstance(source, str):
        return Refusal(index, "missing_field", "source is missing or not a string", claimed)
    try:
        check_source(source)
    except InvalidSource as exc:
        return Refusal(index, "invalid_source", str(exc), claimed)
    if external_id is None:
        return Refusal(index, "missing_field", "external_id is missing", None)
    parsed = parse_example({"id": external_id, **fields}, names, position=index)
    return parsed if isinstance(parsed, Refusal) else (source, parsed)
