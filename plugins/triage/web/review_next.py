"""One review at a time, least sure first: the page a reviewer works through the queue on.

    GET  /triage/review/next?<filter>&cursor=    the open review the model is least sure of (after
                                                 ``cursor``: the ones skipped), with its document
    POST /triage/review/next/{job_id}            decide (form: decision, note, csrf_token, the
                                                 filter and cursor), then the next one opens
    GET  /triage/review/keys.js                  the page's keys (1-9 a label, r requeue, x reject, s skip)

The page shows the document (subject and body as text, read through the payload store and
checked against its hash, as the job page), why it is in review, and the model's top candidate
labels with their scores (``classifications.candidates``; an answer without them shows its one
label and confidence). The reviewer chooses a label (the candidates first, then the rest of the
taxonomy), requeues, rejects or skips, with an optional note; the next review in uncertainty
order (:mod:`triage.jobs.review_uncertainty`) opens. Skipping moves the cursor past the review
(it stays open for others, and for this reviewer when they start over); a decision keeps the
cursor, so the decided review is simply gone and the next takes its place.

Decisions go through :meth:`triage.web.service.TriageService.decide` with the same checks as the
job page's form (:func:`triage.web.access.check_decider`: edit access to ``review_jobs``, the
session's form token, the same origin); the reviewer is the caller's Airflow identity.

The keys need a script, which every other Triage page forbids: this page's
``Content-Security-Policy`` allows this app's own ``keys.js`` and nothing else (no inline script,
no other origin). Without the script the buttons work as plain form buttons, each with the same
key as its ``accesskey``.
"""

from __future__ import annotations

import uuid
from functools import cache
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from triage.jobs.review_queue import QueueFilter
from triage.jobs.review_uncertainty import UncertainCursor
from triage.web.access import CSRF_FIELD, Caller, ReviewReader, check_decider
from triage.web.pages import DECIDED, TEMPLATES, link, page, service
from triage.web.paging import (
    BadQuery,
    Filter,
    decode_uncertain_cursor,
    encode_uncertain_cursor,
    filter_query,
    parse_filter,
)
from triage.web.service import Refused

router = APIRouter()

KEYS = "123456789"
"""The keys of the labels, in the order shown: the model's candidates first, then the taxonomy's."""
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'self'; base-uri 'none'"
)
"""The app's policy (:data:`triage.web.app.SECURITY_HEADERS`) with one script allowed: this
app's ``keys.js`` (same origin, no inline script)."""


def _cursor(text: str | None) -> UncertainCursor | None:
    if not text:
        return None
    try:
        return decode_uncertain_cursor(text)
    except BadQuery as exc:
        raise HTTPException(400, str(exc)) from None


def choices(candidates: list[dict[str, Any]], taxonomy: list[str]) -> list[dict[str, Any]]:
    """The labels a reviewer may give, the model's candidates first (best first, with their
    scores), then the rest of the taxonomy; the first nine with a key. A candidate outside the
    taxonomy is not offered (a reviewer's label must be in it)."""
    offered: list[dict[str, Any]] = []
    for candidate in candidates:
        name = candidate.get("label")
        if name in taxonomy and all(o["label"] != name for o in offered):
            offered.append({"label": name, "score": candidate.get("score"), "candidate": True})
    offered += [
        {"label": n, "score": None, "candidate": False} for n in taxonomy if all(o["label"] != n for o in offered)
    ]
    for i, choice in enumerate(offered):
        choice["key"] = KEYS[i] if i < len(KEYS) else None
    return offered


def candidates_of(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's candidates of a queue row: as stored, else its one label and confidence.
    Only well-formed entries (a text label, a numeric score) are shown."""
    stored = row.get("candidates")
    if isinstance(stored, list):
        return [
            {"label": c["label"], "score": float(c["score"])}
            for c in stored
            if isinstance(c, dict)
            and isinstance(c.get("label"), str)
            and isinstance(c.get("score"), int | float)
            and not isinstance(c.get("score"), bool)
        ]
    if row.get("model_label"):
        return [{"label": row["model_label"], "score": row.get("model_confidence")}]
    return []


def _next_page(
    request: Request,
    caller: Caller,
    where: QueueFilter,
    after: UncertainCursor | None,
    *,
    status: int = 200,
    notice: str | None = None,
    problem: str | None = None,
) -> HTMLResponse:
    svc = service(request)
    query = filter_query(where)
    here = encode_uncertain_cursor(after) if after else None
    found = svc.queue_by_uncertainty(where, limit=1, after=after)
    context: dict[str, Any] = {
        "notice": notice,
        "problem": problem,
        "query": query,
        "cursor": here,
        "queue_url": link(request, "/review", **query),
        "restart_url": link(request, "/review/next", **query) if after else None,
        "row": None,
    }
    if found.rows:
        row = found.rows[0]
        detail = svc.job(row["job_id"])
        if detail is None:  # gone between the two reads (never deleted): show the next one
            raise HTTPException(404, f"job {row['job_id']} does not exist")
        job = detail["job"]
        candidates = candidates_of(row)
        skip_to = (row["uncertainty"], row["opened_at"], row["review_id"])
        review = next((r for r in detail["reviews"] if r["resolved_at"] is None), None)
        context.update(
            row=row,
            job=job,
            review=review,
            document=svc.document(job),
            candidates=candidates,
            choices=choices(candidates, svc.taxonomy()),
            skip_url=link(request, "/review/next", **query, cursor=encode_uncertain_cursor(skip_to)),
            job_url=link(request, f"/review/jobs/{job['id']}"),
            action=link(request, f"/review/next/{job['id']}"),
        )
    response = page(request, "next.html.j2", caller, status, **context)
    response.headers["Content-Security-Policy"] = PAGE_CSP
    return response


@router.get("/review/next", response_class=HTMLResponse)
def next_review(
    request: Request, caller: ReviewReader, where: Filter, cursor: str | None = None, decided: str | None = None
) -> HTMLResponse:
    return _next_page(request, caller, where, _cursor(cursor), notice=DECIDED.get(decided or ""))


@router.post("/review/next/{job_id}", response_class=HTMLResponse)
async def decide_next(job_id: uuid.UUID, request: Request, caller: ReviewReader) -> Response:
    form = await request.form()
    check_decider(request, caller, str(form.get(CSRF_FIELD) or ""))
    field = {
        k: str(form.get(k) or "") for k in ("decision", "note", "cursor", "reason", "source", "batch", "older_than")
    }
    try:
        where = parse_filter(
            reason=field["reason"], source=field["source"], batch=field["batch"], older_than=field["older_than"]
        )
    except BadQuery as exc:
        raise HTTPException(400, str(exc)) from None
    after = _cursor(field["cursor"])
    action, _, label = field["decision"].partition(":")
    try:
        done = service(request).decide(
            job_id, action, label=label or None, note=field["note"] or None, reviewer=caller.name
        )
    except Refused as exc:  # nothing changed: the page again (this review, or the next if it is gone), saying why
        return _next_page(request, caller, where, after, status=exc.status, problem=exc.message)
    target = link(request, "/review/next", **filter_query(where), cursor=field["cursor"] or None, decided=done.outcome)
    return RedirectResponse(target, status_code=303)


@cache
def _keys_script() -> bytes:
    return (TEMPLATES / "review-keys.js").read_bytes()


@router.get("/review/keys.js", include_in_schema=False)
def keys_script() -> Response:
    """The page's keyboard handling (static; no data in it, so no login is asked for)."""
    return Response(_keys_script(), media_type="text/javascript", headers={"Cache-Control": "max-age=300"})
