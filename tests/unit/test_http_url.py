"""The URL of an HTTP-style connection (model API, label action, webhook, Airflow API) from every
form an Airflow connection comes in."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from triage.adapters.connections import http_url


def conn(**fields: Any) -> SimpleNamespace:
    base: dict[str, Any] = {"conn_type": "http", "host": None, "port": None, "schema": None, "extra_dejson": {}}
    return SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "url"),
    [
        ({"host": "http://127.0.0.1:9000/labels"}, "http://127.0.0.1:9000/labels"),  # JSON form, whole URL
        ({"host": "h.example", "port": 8000, "schema": "labels"}, "http://h.example:8000/labels"),  # URI form
        ({"conn_type": "https", "host": "h.example", "schema": "v1/labels"}, "https://h.example/v1/labels"),
        (
            {"host": "h.example", "schema": "https", "extra_dejson": {"scheme": "https", "path": "/labels"}},
            "https://h.example/labels",
        ),
        ({"host": "h.example"}, "http://h.example"),
    ],
)
def test_http_url(fields: dict[str, Any], url: str) -> None:
    assert http_url(conn(**fields)) == url


@pytest.mark.parametrize(
    ("fields", "url"),
    [
        ({"host": "model.example", "port": 8000}, "http://model.example:8000/v1"),  # the model API's default path
        ({"host": "model.example", "schema": "https"}, "https://model.example/v1"),
        ({"host": "model.example", "schema": "api/v2"}, "http://model.example/api/v2"),  # URI form: its path wins
        ({"host": "http://127.0.0.1:9/v1/"}, "http://127.0.0.1:9/v1/"),  # a whole URL, exactly as given
    ],
)
def test_http_url_default_path(fields: dict[str, Any], url: str) -> None:
    assert http_url(conn(**fields), default_path="/v1") == url


def test_http_url_default_port() -> None:
    assert http_url(conn(host="localhost"), default_port=8080) == "http://localhost:8080"
    assert http_url(conn(host="localhost", port=9090), default_port=8080) == "http://localhost:9090"


@pytest.mark.parametrize(
    ("env", "url"),
    [
        pytest.param({}, "http://localhost:8080", id="airflow-default"),
        pytest.param({"AIRFLOW__API__PORT": "8181"}, "http://localhost:8181", id="moved-port"),
        pytest.param(
            {"AIRFLOW__API__PORT": "8181", "AIRFLOW__API__BASE_URL": "https://airflow.example/"},
            "https://airflow.example",
            id="base-url-wins",
        ),
    ],
)
def test_the_api_server_is_found_at_its_one_port(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str
) -> None:
    """Where product code calls or links Airflow's API server without a connection saying so
    (alert links, reconcile_jobs' cross-check): ``[api] base_url``, else localhost at
    ``[api] port``; a server moved with AIRFLOW__API__PORT was linked and called on 8080."""
    from triage.adapters.connections import api_server_url
    from triage.operators.alerts import run_link

    for name in ("AIRFLOW__API__PORT", "AIRFLOW__API__BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert api_server_url() == url
    assert run_link("classify_documents", "manual__1") == f"{url}/dags/classify_documents/runs/manual__1"
