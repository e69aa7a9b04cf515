"""The FastAPI app the Triage plugin mounts at ``/triage`` in Airflow's API server.

    from triage.web.app import create_app
    app = create_app()                          # what plugins/triage_plugin.py mounts
    app = create_app(TriageService(store, payload_base=..., taxonomy_names=[...]))  # tests
    app = create_app(service, IntakeService(service, announce=..., classifier_version=...))  # tests
    app = create_app(service, intake_service, TokenCache(clock=...))  # tests: a token cache of their own

Pages are HTML rendered on the server (no script: they work inside the Airflow UI's frame and
with scripts off), every value escaped; the API is JSON. Both answer an error in their own
form: a page gets a page saying what went wrong (with Airflow's login link on a 401), the API
a JSON ``detail``. Every response forbids scripts and framing by other sites.
"""

from __future__ import annotations

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from triage.adapters.http_actions import default_label_action
from triage.web import api, intake, labels, pages, review_next
from triage.web.access import login_url
from triage.web.intake_service import IntakeService
from triage.web.service import TriageService
from triage.web.token_cache import TokenCache

SECURITY_HEADERS = {
    # No script at all, styles inline only, forms posted to this server only, framed only by it.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response that does not set its own.

    A plain ASGI middleware: Starlette's ``@app.middleware("http")`` (``BaseHTTPMiddleware``)
    runs each request in a task of its own and passes the response through a stream, which
    cost a tenth of an intake request's CPU (measured, docs/performance.md)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(
    triage: TriageService | None = None, intake_service: IntakeService | None = None, tokens: TokenCache | None = None
) -> FastAPI:
    app = FastAPI(
        title="Triage",
        description="Triage's intake, review queue, jobs and reconciliation reports (behind Airflow's auth)",
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    app.state.triage = triage or TriageService(label_action=default_label_action)
    app.include_router(api.router)
    app.include_router(labels.router)
    intake.install(app, intake_service, app.state.triage, tokens)
    app.include_router(review_next.router)
    app.include_router(pages.router)

    app.add_middleware(SecurityHeaders)

    def _is_api(request: Request) -> bool:
        return request.url.path.removeprefix(request.scope.get("root_path", "")).startswith("/api/")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if _is_api(request):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        login = login_url(str(request.url)) if exc.status_code == 401 else None
        return pages.error_page(request, exc.status_code, str(exc.detail), login)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = [
            {"where": ".".join(str(p) for p in e.get("loc", ())), "problem": e.get("msg")} for e in exc.errors()
        ]
        if _is_api(request):
            return JSONResponse({"detail": problems}, status_code=422)
        text = "; ".join(f"{p['where']}: {p['problem']}" for p in problems)
        return pages.error_page(request, 422, text, None)

    return app
