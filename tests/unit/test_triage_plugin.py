"""The Airflow plugin module (``plugins/triage_plugin.py``): what it declares, and that loading it
costs the processes that never serve it nothing (every task loads the plugins)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[2]

LOADED = """
import json, sys
import triage_plugin
heavy = sorted(m for m in sys.modules if m == "fastapi" or m.startswith(("fastapi.", "airflow.api_fastapi", "triage.web")))
print(json.dumps(heavy))
"""


def test_loading_the_plugin_imports_no_web_stack() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    done = subprocess.run(
        [sys.executable, "-c", LOADED], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_the_plugin_mounts_the_app_and_places_the_views() -> None:
    from triage_plugin import TriageApp, TriagePlugin

    [mounted] = TriagePlugin.fastapi_apps
    assert mounted["url_prefix"] == "/triage"
    assert isinstance(mounted["app"], TriageApp)
    views = {v["destination"]: v for v in TriagePlugin.external_views}
    assert views["nav"]["href"] == "/triage/review"
    assert views["dag_run"]["href"] == "/triage/reports/airflow/{DAG_ID}/{RUN_ID}"
    assert len({v["url_route"] for v in TriagePlugin.external_views}) == 2


def test_the_app_is_built_on_its_first_request_and_asks_for_a_login() -> None:
    from triage_plugin import TriageApp

    client = TestClient(TriageApp())
    assert client.get("/api/reviews").status_code == 401
    page = client.get("/review")
    assert page.status_code == 401
    assert "text/html" in page.headers["content-type"]
    assert "default-src 'none'" in page.headers["content-security-policy"]
