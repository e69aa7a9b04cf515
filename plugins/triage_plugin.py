"""The Triage Airflow plugin: Triage's pages and API inside Airflow's API server.

Airflow loads this module from the plugins folder (the package ``triage`` beside it is the
library it uses). It mounts :func:`triage.web.app.create_app` at ``/triage`` (``fastapi_apps``)
and places two entries in the UI (``external_views``): "Triage" in the navigation (the review
queue) and a "Triage report" tab on DAG run pages, which shows the report of a
``reconcile_jobs`` run (Airflow 3.3 shows a run tab on every DAG's runs; other DAGs' tabs say
that they have none). Everything behind ``/triage`` goes through Airflow's own authentication
and authorisation (:mod:`triage.web.access`).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from triage.web.app import create_app


class TriagePlugin(AirflowPlugin):
    name = "triage"
    # AirflowPlugin reads its extension points as class attributes (lists, by its own declaration).
    fastapi_apps = [{"app": create_app(), "url_prefix": "/triage", "name": "Triage"}]  # noqa: RUF012
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
