"""The JSON API under ``/triage/api``: the same data and decisions as the pages, for scripts.

    GET  /triage/api/jobs/{job_id}            the job, its events, review rows, classifications
    GET  /triage/api/jobs/{job_id}/document   its document as text/plain (hash-verified)
    GET  /triage/api/reviews?reason=&source=&batch=&older_than=&order=oldest|uncertainty&limit=&cursor=
    POST /triage/api/reviews/{job_id}         {"action": "label"|"requeue"|"reject", "label", "note"}
    POST /triage/api/labels                   labelled examples in a batch (:mod:`triage.web.labels`)
    GET  /triage/api/reports/latest · /triage/api/reports/{run_id} · /triage/api/reports/trend

Bad input gets a 4xx whose ``detail`` says what is wrong, before anything changes.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from triage.web.access import ReportReader, ReviewReader, check_decider, describe
from triage.web.paging import Filter, OrderedPosition, RunId, encode_cursor, encode_uncertain_cursor
from triage.web.service import Refused, TriageService

router = APIRouter(prefix="/api")


class ReviewBody(BaseModel):
    """A reviewer's decision on one job."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["label", "requeue", "reject"]
    label: str | None = Field(default=None, max_length=200)
    note: str | None = Field(default=None, max_length=2000)


def service(request: Request) -> TriageService:
    return request.app.state.triage


def _job_or_404(svc: TriageService, job_id: uuid.UUID) -> dict[str, Any]:
    found = svc.job(job_id)
    if found is None:
        raise HTTPException(404, f"job {job_id} does not exist")
    return found


@router.get("/jobs/{job_id}")
def get_job(job_id: uuid.UUID, request: Request, caller: ReviewReader) -> Any:
    found = _job_or_404(service(request), job_id)
    return jsonable_encoder({**found, "caller": describe(caller)})


@router.get("/jobs/{job_id}/document", response_class=PlainTextResponse)
def get_document(job_id: uuid.UUID, request: Request, caller: ReviewReader) -> PlainTextResponse:
    svc = service(request)
    document = svc.document(_job_or_404(svc, job_id)["job"])
    if document.text is None:
        raise HTTPException(502, f"the document cannot be read: {document.problem}")
    headers = {"X-Triage-Truncated": "true"} if document.truncated else {}
    return PlainTextResponse(document.text, headers={**headers, "X-Content-Type-Options": "nosniff"})


@router.get("/reviews")
def list_reviews(request: Request, caller: ReviewReader, where: Filter, position: OrderedPosition) -> Any:
    """Open reviews, oldest first; ``order=uncertainty``: what the model is least sure of first
    (each row then carries its ``uncertainty`` and the model's ``candidates``)."""
    svc = service(request)
    if position.order == "uncertainty":
        uncertain = svc.queue_by_uncertainty(where, limit=position.size, after=position.after_uncertain)
        rows = uncertain.rows
        next_cursor = encode_uncertain_cursor(uncertain.next_after) if uncertain.next_after else None
    else:
        page = svc.queue(where, limit=position.size, after=position.after)
        rows = page.rows
        next_cursor = encode_cursor(page.next_after) if page.next_after else None
    return jsonable_encoder(
        {"reviews": rows, "next_cursor": next_cursor, "order": position.order, "caller": describe(caller)}
    )


@router.post("/reviews/{job_id}")
def decide(job_id: uuid.UUID, body: ReviewBody, request: Request, caller: ReviewReader) -> Any:
    check_decider(request, caller)
    try:
        done = service(request).decide(job_id, body.action, label=body.label, note=body.note, reviewer=caller.name)
    except Refused as exc:
        raise HTTPException(exc.status, exc.message) from None
    return jsonable_encoder(
        {
            "job_id": done.job_id,
            "outcome": done.outcome,
            "status": done.status,
            "resolved_by": done.resolved_by,
            "resolved_at": done.resolved_at,
            "label_action": done.label_action,
        }
    )


@router.get("/reports/trend")
def report_trend(request: Request, caller: ReportReader) -> Any:
    return jsonable_encoder({"runs": service(request).trend()})


@router.get("/reports/latest")
def latest_report(request: Request, caller: ReportReader) -> Any:
    found = service(request).report()
    if found is None:
        raise HTTPException(404, "no reconciliation run has finished yet")
    return jsonable_encoder(found)


@router.get("/reports/{run_id}")
def report(run_id: RunId, request: Request, caller: ReportReader) -> Any:
    found = service(request).report(run_id=run_id)
    if found is None:
        raise HTTPException(404, f"no finished reconciliation run {run_id}")
    return jsonable_encoder(found)
