"""Intake over HTTP: ``POST /triage/api/documents`` and ``GET /triage/api/documents/{job_id}``.

    POST /triage/api/documents        one document {source, external_id, subject, body, received_at,
                                      channel?, correlation_id?, metadata?}, or {"documents": [...]}
    GET  /triage/api/documents/{id}   where that document's job is: state, label, review reason

The order of a POST, each step refusing before the next begins: the caller (401 without a
token, 403 without the right to trigger ``classify_intake``: the auth manager's DAG-run create
on it, or 503 while Airflow has not parsed that DAG; 403 for a post with the UI session from
another origin), ``Content-Type: application/json`` (415: a page of another site cannot send that
without a CORS preflight, which this app never grants), backpressure (429 with ``Retry-After``
while the intake queue holds its bound), the body (413 past the byte limit, counted while it
is read: a declared ``Content-Length`` over it is refused before a byte is read), the JSON and
the batch size (422, 413), each document (422 for the invalid ones, which register nothing),
each valid document's source (403 for the whole request when one is not the caller's to post
for, :mod:`triage.web.intake_bindings`), then payloads and jobs, committed, then the asset
event, then the answer. A document is acknowledged only after its job committed: an answer lost
on the way (the server killed after the commit) is repaired by posting again, which answers the
same job id.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response
from pydantic_core import to_json
from starlette.concurrency import run_in_threadpool

from triage import settings
from triage.contracts.intake import INTAKE_DAG_ID, IntakeDocument, Problem, parse_documents, validate_body
from triage.jobs.store.intake import Accepted
from triage.web.access import READ, refusal, same_origin, session_of
from triage.web.intake_bindings import BindingError, configured, roles_of
from triage.web.intake_service import IntakeService, NoIntakeClassifier, NotAnnounced
from triage.web.service import TriageService
from triage.web.token_cache import Known, KnownCaller, TokenCache

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api")

TRIGGER = "POST"


async def intake_poster(request: Request, caller: KnownCaller) -> Known:
    """The caller, if the auth manager lets them trigger ``classify_intake`` (Airflow's verdict on
    a bearer token reused for a few seconds: :mod:`triage.web.token_cache`). A post that carries
    the UI session is refused from another origin or ``null``, as every session request of the
    app that changes something (:func:`~triage.web.access.same_origin`)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

    if not caller.may(TRIGGER, INTAKE_DAG_ID, DagAccessEntity.RUN):
        raise refusal(INTAKE_DAG_ID, f"posting documents needs the right to trigger {INTAKE_DAG_ID}")
    if session_of(request) is not None:
        same_origin(request)
    return caller


async def intake_reader(caller: KnownCaller) -> str:
    if not caller.may(READ, INTAKE_DAG_ID):
        raise refusal(INTAKE_DAG_ID, f"reading a document's state needs read access to {INTAKE_DAG_ID}")
    return str(caller.user.get_name())


Poster = Annotated[Known, Depends(intake_poster)]
Reader = Annotated[str, Depends(intake_reader)]


def intake(request: Request) -> IntakeService:
    return request.app.state.intake


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it exceeds ``limit`` bytes (never buffered past it)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise HTTPException(status.HTTP_400_BAD_REQUEST, "Content-Length is not a number")
        if int(declared) > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"the body is over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"the body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def documents_of(body: bytes, max_documents: int) -> tuple[list[Any], bool]:
    """The posted documents and whether they came as a batch (``{"documents": [...]}``)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise HTTPException(422, "the body is not JSON (UTF-8)") from None
    if not isinstance(data, dict):
        raise HTTPException(422, 'the body is one document (a JSON object) or {"documents": [...]}')
    if "documents" not in data:
        return [data], False
    if set(data) != {"documents"} or not isinstance(data["documents"], list):
        raise HTTPException(422, 'a batch is {"documents": [...]} and nothing else')
    items = data["documents"]
    if not items:
        raise HTTPException(422, "the batch holds no document")
    if len(items) > max_documents:
        raise HTTPException(
            status.HTTP_413_CONTENT_TOO_LARGE,
            f"{len(items)} documents in one request; at most {max_documents} (TRIAGE_INTAKE_MAX_DOCUMENTS)",
        )
    return items, True


def read_documents(
    body: bytes, max_documents: int
) -> tuple[int, list[tuple[int, IntakeDocument, bytes]], list[Problem], bool]:
    """How many documents ``body`` holds, the valid ones (with their index and payload's
    bytes), a :class:`Problem` per invalid one, and whether they came as a batch.

    A body valid throughout is read in one pass (:func:`validate_body`); any other goes through
    ``json.loads`` and a validation per document, which says what is wrong where."""
    fast = validate_body(body)
    if fast is not None and 0 < len(fast[0]) <= max_documents:
        documents, batch = fast
        try:
            return len(documents), [(i, d, d.payload_bytes()) for i, d in enumerate(documents)], [], batch
        except (ValueError, ArithmeticError, RecursionError):
            pass  # what the payload contract refuses: the per-document path names the document
    items, batch = documents_of(body, max_documents)
    valid, problems = parse_documents(items)
    return len(items), valid, problems, batch


def check_sources(caller: Known, documents: Sequence[IntakeDocument]) -> None:
    """Refuse the request (403, nothing registered) when any document's source is not the
    caller's to post for (:mod:`triage.web.intake_bindings`); 503 when the bindings cannot be read."""
    try:
        bindings = configured()
    except BindingError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, f"intake is misconfigured, nothing was accepted: {exc}"
        ) from None
    user, roles = str(caller.user.get_name()), roles_of(caller.user)
    refusals = [r for source in sorted({d.source for d in documents}) if (r := bindings.refusal(source, user, roles))]
    if refusals:
        more = f"; and {len(refusals) - 5} sources more" if len(refusals) > 5 else ""
        raise HTTPException(status.HTTP_403_FORBIDDEN, "; ".join(refusals[:5]) + more + "; nothing was accepted")


def _entry(index: int, external_id: str, found: Accepted) -> dict[str, Any]:
    return {
        "index": index,
        "external_id": external_id,
        "job_id": found.job_id,  # a UUID: written by to_json, not str() in Python
        "status": "accepted" if found.new else "existing",
        "job_status": found.status,
        "correlation_id": found.correlation_id,
    }


def answer(
    count: int,
    valid_ids: dict[int, str],
    accepted: Sequence[Accepted],
    problems: Sequence[Problem],
    batch: bool,
) -> Response:
    """202 when a document was registered now, 200 when every one was known, 422 when any is
    invalid (the valid ones of a batch registered all the same: each entry says). Written by
    pydantic's ``to_json`` (the bytes ``JSONResponse`` writes, an eighth of its time)."""
    entries = [
        _entry(index, external_id, found)
        for (index, external_id), found in zip(valid_ids.items(), accepted, strict=True)
    ]
    if problems:
        entries += [
            {"index": p.index, "external_id": p.external_id, "status": "invalid", "errors": p.errors} for p in problems
        ]
        entries.sort(key=lambda entry: entry["index"])
    if len(entries) != count:
        raise AssertionError(f"{len(entries)} answers for {count} documents")
    code = 422 if problems else 202 if any(a.new for a in accepted) else 200
    if batch:
        body: dict[str, Any] = {"documents": entries}
    elif problems:
        body = {"detail": entries}
    else:
        body = {k: v for k, v in entries[0].items() if k != "index"}
    headers = {"Location": f"documents/{accepted[0].job_id}"} if not batch and accepted else {}
    return Response(to_json(body), status_code=code, headers=headers, media_type="application/json")


@router.post("/documents", status_code=202)
async def post_documents(request: Request, caller: Poster) -> Response:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "send the documents as application/json")
    service = intake(request)
    full = service.queue_full_known()  # a depth measured less than a second ago: no thread hop
    if full is None:
        full = await run_in_threadpool(service.queue_full)
    if full:
        retry_after = str(settings.intake_retry_after())
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"the intake queue holds {service.max_queued} documents not yet classified; post again later",
            headers={"Retry-After": retry_after},
        )
    body = await read_body(request, settings.intake_max_body_bytes())
    count, valid, problems, batch = read_documents(body, settings.intake_max_documents())
    check_sources(caller, [doc for _i, doc, _p in valid])
    accepted: list[Accepted] = []
    if valid:
        documents = [(doc, payload) for _i, doc, payload in valid]
        try:
            accepted = await run_in_threadpool(service.accept, documents, str(caller.user.get_name()))
        except NoIntakeClassifier as exc:
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE, f"intake is misconfigured, nothing was accepted: {exc}"
            ) from None
        except NotAnnounced as exc:
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                f"{exc}; the documents are stored: post them again to hear their job ids",
                headers={"Retry-After": "5"},
            ) from None
    return answer(count, {i: doc.external_id for i, doc, _p in valid}, accepted, problems, batch)


@router.get("/documents/{job_id}")
def document_status(job_id: uuid.UUID, request: Request, caller: Reader) -> Any:
    found = intake(request).status(job_id)
    if found is None:
        raise HTTPException(404, f"job {job_id} does not exist")
    return jsonable_encoder(found)


def install(app: Any, service: IntakeService | None, triage: TriageService, tokens: TokenCache | None = None) -> None:
    """Mount intake on the Triage app, with its service and token cache (tests give their own)."""
    app.state.intake = service or IntakeService(triage)
    app.state.tokens = TokenCache() if tokens is None else tokens  # an empty cache is falsy
    app.include_router(router)
