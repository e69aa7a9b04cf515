"""deploy/helm/values.yaml against the official Airflow chart's own values schema (the part it
uses, kept in tests/data/helm/ with its source and license), and against what Triage needs."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "deploy" / "helm" / "values.yaml"
SCHEMA = ROOT / "tests" / "data" / "helm" / "airflow-chart-values.schema.json"


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return yaml.safe_load(VALUES.read_text())


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_values_follow_the_charts_schema(values: dict[str, Any], validator: jsonschema.Draft7Validator) -> None:
    assert set(values) <= set(validator.schema["properties"]), "a key the kept schema lacks: copy it from the chart"
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(values)]
    assert errors == []


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        pytest.param(("images", "airflow", "pullPolicy"), "Sometimes", id="enum"),
        pytest.param(("images", "airflow", "registry"), "x", id="unknown-key"),
        pytest.param(("executor",), "celery", id="pattern"),
        pytest.param(("secret", 0, "secretKeyName"), "x", id="unknown-secret-key"),
        pytest.param(("migrateDatabaseJob", "env", 0, "valueFrom", "secretKeyRef", "keyName"), "x", id="k8s-type"),
    ],
)
def test_the_schema_refuses_what_the_chart_refuses(
    values: dict[str, Any], validator: jsonschema.Draft7Validator, path: tuple[Any, ...], bad: str
) -> None:
    broken = copy.deepcopy(values)
    node: Any = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    assert not validator.is_valid(broken)


def test_the_image_is_triages_at_the_pinned_airflow(values: dict[str, Any]) -> None:
    airflow = re.search(r"^apache-airflow==([\w.]+)$", (ROOT / "requirements.txt").read_text(), re.M)
    assert airflow
    assert values["images"]["airflow"]["tag"] == airflow[1]
    assert values["images"]["airflow"]["repository"].endswith("/triage-airflow")
    # The chart decides by `airflowVersion` (default: the chart's own appVersion, an older Airflow
    # than the image's) which commands and settings its pods get: it must name the image's Airflow.
    assert values["airflowVersion"] == airflow[1]


def test_an_external_postgresql_and_the_connections_from_secrets(values: dict[str, Any]) -> None:
    assert values["postgresql"]["enabled"] is False
    assert values["data"]["metadataSecretName"]
    names = {s["envName"] for s in values["secret"]}
    assert {"AIRFLOW_CONN_TRIAGE_DB", "AIRFLOW_CONN_TRIAGE_LLM", "AIRFLOW_CONN_AIRFLOW_API"} <= names
    # Connections (credentials) come from Secrets only, never as plain values.
    assert not [e["name"] for e in values["env"] if e["name"].startswith("AIRFLOW_CONN_")]


def test_the_migration_job_runs_the_ledgers_then_airflows_then_the_pool(values: dict[str, Any]) -> None:
    job = values["migrateDatabaseJob"]
    assert job["enabled"] is True
    bash, flag, script = job["args"]
    assert (bash, flag) == ("bash", "-c")
    lines = [line.strip() for line in script.splitlines() if line.strip()]
    # The ledger's first: Airflow's pods wait for Airflow's migrations, so they then find both done.
    assert lines[:3] == ["set -e", "python -m triage migrate", "airflow db migrate"]
    pool = shlex.split(lines[3])
    settings = yaml.safe_load((ROOT / "airflow_settings.yaml").read_text())["airflow"]["pools"]
    (llm_api,) = [p for p in settings if p["pool_name"] == "llm_api"]
    assert pool == ["airflow", "pools", "set", "llm_api", str(llm_api["pool_slot"]), llm_api["pool_description"]]


def test_only_the_migration_job_sees_the_owner_role(values: dict[str, Any]) -> None:
    (owner,) = values["migrateDatabaseJob"]["env"]
    assert owner["name"] == "TRIAGE_DATABASE_URL"
    assert owner["valueFrom"]["secretKeyRef"] == {"name": "triage-migrate", "key": "url"}
    assert "TRIAGE_DATABASE_URL" not in {e["name"] for e in values["env"]}
    assert "TRIAGE_DATABASE_URL" not in {s["envName"] for s in values["secret"]}


def test_payloads_go_to_remote_storage(values: dict[str, Any]) -> None:
    env = {e["name"]: e["value"] for e in values["env"]}
    assert "://" in env["AIRFLOW_VAR_TRIAGE_PAYLOAD_BASE"]
