"""The Triage pages: the review queue, a job with its document, decisions, and the reports.

    GET  /triage/review                        open reviews (filter, page), oldest first (order=uncertainty:
                                               least sure first)
    GET  /triage/review/jobs/{job_id}          the job: document, model's answer, events, decision form
    POST /triage/review/jobs/{job_id}          decide (form: action, label, note, csrf_token)
    GET  /triage/review/bulk?<filter>          preview a bulk decision: the first jobs the filter selects
    POST /triage/review/bulk                   decide on exactly the previewed jobs
    GET  /triage/reports/latest · /triage/reports/{run_id} · /triage/reports/trend
    GET  /triage/reports/airflow/{dag_id}/{dag_run_id}   the tab on a reconcile_jobs run page

Templates are ``include/web/*.html.j2`` (autoescaped: a document's text is shown as text).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup

from triage.jobs.sql.reads.review_queue import QueuePage
from triage.jobs.sql.reads.review_uncertainty import UncertainPage
from triage.reconciliation import render
from triage.reconciliation.charts import duration, line_chart
from triage.web.access import CSRF_FIELD, REPORT_DAG, Caller, ReportReader, ReviewReader, check_decider
from triage.web.paging import (
    Filter,
    OrderedPosition,
    RunId,
    encode_cursor,
    encode_uncertain_cursor,
    filter_query,
)
from triage.web.service import BULK_LIMIT, Refused, TriageService

router = APIRouter()
TEMPLATES = Path(__file__).resolve().parents[3] / "include" / "web"
DECIDED = {"applied": "Decision applied.", "already_applied": "You had already made this decision; nothing changed."}


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters["duration"] = lambda s: duration(float(s or 0))
    env.filters["when"] = lambda t: f"{t:%Y-%m-%d %H:%M:%S %Z}" if t is not None else ""
    return env


ENV = _env()


def link(request: Request, path: str, **query: Any) -> str:
    """A URL of this app (under the prefix it is mounted at)."""
    base = request.scope.get("root_path", "")
    params = {k: v for k, v in query.items() if v is not None}
    return f"{base}{path}" + (f"?{urlencode(params)}" if params else "")


def page(request: Request, template: str, caller: Caller | None, status: int = 200, **context: Any) -> HTMLResponse:
    html = ENV.get_template(template).render(
        caller=caller, url=lambda path, **q: link(request, path, **q), csrf_field=CSRF_FIELD, **context
    )
    return HTMLResponse(html, status_code=status)


def error_page(request: Request, status: int, message: str, login: str | None) -> HTMLResponse:
    return page(request, "message.html.j2", None, status, title=f"{status}", message=message, login=login, back=None)


def service(request: Request) -> TriageService:
    return request.app.state.triage


@router.get("/", include_in_schema=False)
def home(request: Request) -> Response:
    return RedirectResponse(link(request, "/review"), status_code=303)


@router.get("/review", response_class=HTMLResponse)
def queue(request: Request, caller: ReviewReader, where: Filter, position: OrderedPosition) -> HTMLResponse:
    size, uncertain = position.size, position.order == "uncertainty"
    result: QueuePage | UncertainPage
    if uncertain:  # least sure first (triage.jobs.sql.reads.review_uncertainty): the order kept in every link
        result = service(request).queue_by_uncertainty(where, limit=size, after=position.after_uncertain)
        query = {**filter_query(where), "order": position.order}
        cursor = encode_uncertain_cursor(result.next_after) if result.next_after else None
    else:
        result = service(request).queue(where, limit=size, after=position.after)
        query = filter_query(where)
        cursor = encode_cursor(result.next_after) if result.next_after else None
    after = position.after_uncertain or position.after
    next_url = link(request, "/review", **query, limit=size, cursor=cursor) if cursor else None
    return page(
        request,
        "queue.html.j2",
        caller,
        rows=result.rows,
        where=where,
        query=query,
        next_url=next_url,
        first_url=link(request, "/review", **query, limit=size) if after is not None else None,
        bulk_url=link(request, "/review/bulk", **filter_query(where)),
        uncertain=uncertain,
        bulk_limit=BULK_LIMIT,
    )


def _job_page(request: Request, caller: Caller, job_id: uuid.UUID, status: int = 200, **extra: Any) -> HTMLResponse:
    svc = service(request)
    found = svc.job(job_id)
    if found is None:
        raise HTTPException(404, f"job {job_id} does not exist")
    open_review = next((r for r in found["reviews"] if r["resolved_at"] is None), None)
    latest = found["classifications"][-1] if found["classifications"] else None
    return page(
        request,
        "job.html.j2",
        caller,
        status,
        d=found,
        job=found["job"],
        open_review=open_review,
        model=latest,
        document=svc.document(found["job"]),
        labels=svc.taxonomy(),
        **{"notice": None, "problem": None, **extra},
    )


@router.get("/review/jobs/{job_id}", response_class=HTMLResponse)
def job(job_id: uuid.UUID, request: Request, caller: ReviewReader, decided: str | None = None) -> HTMLResponse:
    return _job_page(request, caller, job_id, notice=DECIDED.get(decided or ""))


@router.post("/review/jobs/{job_id}", response_class=HTMLResponse)
async def decide(job_id: uuid.UUID, request: Request, caller: ReviewReader) -> Response:
    form = await request.form()
    check_decider(request, caller, str(form.get(CSRF_FIELD) or ""))
    action, label, note = (str(form.get(k) or "") for k in ("action", "label", "note"))
    try:
        done = service(request).decide(job_id, action, label=label or None, note=note or None, reviewer=caller.name)
    except Refused as exc:  # nothing changed: the job's page again, saying why
        if exc.status == 404:
            raise HTTPException(404, exc.message) from None
        return _job_page(request, caller, job_id, exc.status, problem=exc.message)
    return RedirectResponse(link(request, f"/review/jobs/{job_id}", decided=done.outcome), status_code=303)


@router.get("/review/bulk", response_class=HTMLResponse)
def bulk_preview(request: Request, caller: ReviewReader, where: Filter) -> HTMLResponse:
    svc = service(request)
    preview = svc.queue(where, limit=BULK_LIMIT)
    return page(
        request,
        "bulk.html.j2",
        caller,
        rows=preview.rows,
        more=preview.next_after is not None,
        where=where,
        labels=svc.taxonomy(),
        report=None,
        bulk_limit=BULK_LIMIT,
    )


@router.post("/review/bulk", response_class=HTMLResponse)
async def bulk_decide(request: Request, caller: ReviewReader) -> HTMLResponse:
    form = await request.form()
    check_decider(request, caller, str(form.get(CSRF_FIELD) or ""))
    try:
        ids = [uuid.UUID(str(v)) for v in form.getlist("job_id")]
    except ValueError:
        raise HTTPException(422, "job_id: not a job id") from None
    action, label, note = (str(form.get(k) or "") for k in ("action", "label", "note"))
    try:
        report = service(request).decide_many(ids, action, label=label or None, note=note or None, reviewer=caller.name)
    except Refused as exc:
        raise HTTPException(exc.status, exc.message) from None
    return page(
        request, "bulk.html.j2", caller, rows=[], more=False, where=None, labels=[], report=report, bulk_limit=0
    )


# -- reports ------------------------------------------------------------------------------------


def _report_page(request: Request, caller: Caller, found: dict[str, Any] | None, missing: str) -> HTMLResponse:
    if found is None:
        return page(request, "message.html.j2", caller, 404, title="No report", message=missing, login=None, back=None)
    nav = [(link(request, "/review"), "Review queue"), (link(request, "/reports/trend"), "Trend across runs")]
    if found["before"] is not None:
        nav.append((link(request, f"/reports/{found['before']}"), f"← run {found['before']}"))
    if found["after"] is not None:
        nav.append((link(request, f"/reports/{found['after']}"), f"run {found['after']} →"))
    nav.append((link(request, "/reports/latest"), "Latest"))
    summary = found["summary"]
    summary.setdefault("run", {}).setdefault("id", found["id"])
    return HTMLResponse(render.html(summary, {"nav": nav, "job": link(request, "/review/jobs/")}))


@router.get("/reports/latest", response_class=HTMLResponse)
def latest_report(request: Request, caller: ReportReader) -> HTMLResponse:
    found = service(request).report()
    return _report_page(request, caller, found, "No reconciliation run has finished yet: trigger reconcile_jobs.")


def quality_trend_charts(runs: list[dict[str, Any]], points: list[str]) -> dict[str, str]:
    """Coverage and audited precision per classifier version over the runs, one line per version
    (as the report's own quality chart: a share a run did not measure is drawn as 0)."""
    versions = list(dict.fromkeys(q["version"] for r in runs for q in r["quality"]))
    by_run = [{q["version"]: q for q in r["quality"]} for r in runs]

    def series(key: str) -> list[tuple[str, list[float]]]:
        return [(str(v), [100 * ((run.get(v) or {}).get(key) or 0) for run in by_run]) for v in versions]

    return {
        "quality_coverage": line_chart("Coverage per classifier version (%)", points, series("coverage")),
        "quality_precision": line_chart("Audited precision per classifier version (%)", points, series("precision")),
    }


@router.get("/reports/trend", response_class=HTMLResponse)
def trend(request: Request, caller: ReportReader) -> HTMLResponse:
    runs = service(request).trend()
    points = [f"run {r['id']}" for r in runs]
    charts = {
        "backlog": line_chart(
            "Open reviews and unfinished jobs",
            points,
            [("open reviews", [r["open_reviews"] for r in runs]), ("unfinished", [r["unfinished"] for r in runs])],
        ),
        "repairs": line_chart(
            "Repairs and conflicts",
            points,
            [("repaired", [r["repaired"] for r in runs]), ("conflicts", [r["conflicts"] for r in runs])],
        ),
        **quality_trend_charts(runs, points),
    }
    svg = {k: Markup(v) for k, v in charts.items()}  # built from escaped parts (charts.py)
    return page(request, "trend.html.j2", caller, runs=runs, charts=svg)


@router.get("/reports/airflow/{dag_id}/{dag_run_id}", response_class=HTMLResponse)
def report_of_dag_run(dag_id: str, dag_run_id: str, request: Request, caller: ReportReader) -> HTMLResponse:
    """The report tab of a DAG run page. Airflow 3.3 shows a plugin's run tab on every DAG's
    runs; only ``reconcile_jobs`` runs have a report."""
    if dag_id != REPORT_DAG:
        message = f"Triage reports belong to {REPORT_DAG} runs; {dag_id} runs have none."
        back = link(request, "/reports/latest")
        return page(request, "message.html.j2", caller, 404, title="No report", message=message, login=None, back=back)
    found = service(request).report(dag_run_id=dag_run_id)
    return _report_page(request, caller, found, f"The run {dag_run_id} has not recorded a report (yet).")


@router.get("/reports/{run_id}", response_class=HTMLResponse)
def report(run_id: RunId, request: Request, caller: ReportReader) -> HTMLResponse:
    found = service(request).report(run_id=run_id)
    return _report_page(request, caller, found, f"No finished reconciliation run {run_id}.")
