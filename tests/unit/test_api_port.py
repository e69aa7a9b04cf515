"""Every URL of the local deployment follows the API server's one port (``AIRFLOW__API__PORT``).

``make up`` with ``AIRFLOW__API__PORT=8181`` (8080 taken) started the API server on 8181 while
task processes still called the Execution API on Airflow's default, localhost:8080: every task
failed at once (connection refused). tests/drills/test_make_up.py runs a deployment that sets the
port alone and watches reconcile_jobs succeed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from triage_tools import deployment


@pytest.fixture
def env_of(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., dict[str, str]]:
    """environment() for an exported environment, without starting a database."""

    def fake_airflow_environment() -> dict[str, str]:
        return {"TRIAGE_HOME": str(tmp_path), "AIRFLOW_HOME": str(tmp_path / "airflow")}

    monkeypatch.setattr(deployment, "airflow_environment", fake_airflow_environment)
    (tmp_path / "airflow").mkdir()

    def env_of(**exported: str) -> dict[str, str]:
        for key in ("AIRFLOW__API__PORT", "AIRFLOW__API__BASE_URL", "AIRFLOW__CORE__EXECUTION_API_SERVER_URL"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.delenv("AIRFLOW_CONN_AIRFLOW_API", raising=False)
        for key, value in exported.items():
            monkeypatch.setenv(key, value)
        return deployment.environment()

    return env_of


def test_a_moved_api_server_moves_every_url(env_of: Callable[..., dict[str, str]]) -> None:
    env = env_of(AIRFLOW__API__PORT="8181")
    assert env["AIRFLOW__API__PORT"] == "8181"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://localhost:8181/execution/"
    assert json.loads(env["AIRFLOW_CONN_AIRFLOW_API"])["host"].endswith(":8181")
    assert not [key for key, value in env.items() if key.startswith("AIRFLOW") and ":8080" in value]


def test_the_default_port(env_of: Callable[..., dict[str, str]]) -> None:
    env = env_of()
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://localhost:8080/execution/"


def test_an_exported_base_url_or_execution_url_wins(env_of: Callable[..., dict[str, str]]) -> None:
    env = env_of(AIRFLOW__API__PORT="8181", AIRFLOW__API__BASE_URL="http://127.0.0.1:8181/")
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8181/execution/"
    env = env_of(AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://api.internal:9000/execution/")
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://api.internal:9000/execution/"
