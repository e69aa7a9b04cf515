"""The Triage Airflow plugin: Triage's pages and API inside Airflow's API server.

Airflow loads this module from the plugins folder (the package ``triage`` beside it is the
library it uses). It mounts the app of :func:`triage.web.app.create_app` at ``/triage``
(``fastapi_apps``) and places two entries in the UI (``external_views``): "Triage" in the
navigation (the review queue) and a "Triage report" tab on DAG run pages, which shows the report
of a ``reconcile_jobs`` run (Airflow 3.3 shows a run tab on every DAG's runs; other DAGs' tabs
say that they have none). Everything behind ``/triage`` goes through Airflow's own
authentication and authorisation (:mod:`triage.web.access`).

Every Airflow process loads the plugins (the scheduler, the DAG processor, each task), and only
the API server serves the app: :class:`TriageApp` builds it on its first request, so importing
this module imports neither FastAPI nor the API server's modules (seconds per task otherwise).
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin


class TriageApp:
    """An ASGI app that builds :func:`triage.web.app.create_app` on its first request."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from triage.web.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class TriagePlugin(AirflowPlugin):
    name = "triage"
    # AirflowPlugin reads its extension points as class attributes (lists, by its own declaration).
    fastapi_apps = [{"app": TriageApp(), "url_prefix": "/triage", "name": "Triage"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012
        {
            "name": "Triage",
            "href": "/triage/review",
            "destination": "nav",
            "url_route": "triage",
            "nav_top_level": True,
        },
        {
            "name": "Triage report",
            "href": "/triage/reports/airflow/{DAG_ID}/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "triage-report",
        },
    ]
