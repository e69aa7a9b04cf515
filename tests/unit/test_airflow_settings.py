"""airflow_settings.yaml and its loader: the project file, the CLI commands, malformed files."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from triage.settings import Retention
from triage_tools.deploy.airflow_settings import (
    AirflowSettings,
    SettingsError,
    apply,
    apply_commands,
    connections_import_json,
    in_process,
    load_airflow_settings,
    main,
    without_environment_overrides,
)

ROOT = Path(__file__).resolve().parents[2]
PROJECT_FILE = ROOT / "airflow_settings.yaml"
ENV = {"TRIAGE_HOME": "/srv/triage"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "airflow_settings.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def load_text(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> AirflowSettings:
    return load_airflow_settings(write(tmp_path, text), environ=environ or {})


SMALL = """\
airflow:
  connections:
    - conn_id: triage_db
      conn_type: postgres
      conn_host: db.internal
      conn_schema: triage
      conn_login: triage_app
      conn_password: pw
      conn_port: 5432
      conn_extra: {}
  pools:
    - pool_name: llm_api
      pool_slot: 8
      pool_description: model calls
  variables:
    - variable_name: triage_reports_dir
      variable_value: /srv/reports
"""


# -- the project's file ---------------------------------------------------------------------------


@pytest.fixture
def project() -> AirflowSettings:
    return load_airflow_settings(PROJECT_FILE, environ=ENV)


def test_project_file_has_the_job_database(project: AirflowSettings) -> None:
    db = project.connection("triage_db")
    assert db.conn_type == "postgres"
    assert db.conn_schema == "triage"
    assert db.conn_login == "triage_app"
    assert db.conn_host
    assert db.conn_port == 5432


def test_project_file_has_an_openai_compatible_model(project: AirflowSettings) -> None:
    llm = project.connection("triage_llm")
    assert llm.conn_type == "http"
    assert llm.conn_host == "http://127.0.0.1:8000/v1"
    assert llm.conn_password is not None
    assert llm.conn_extra == {
        "model": "gpt-4o-mini",
        "temperature": 0.0,
        "timeout": 30,
        "prompt_version": "p1",
        # No budget unless the environment sets one (docs/model-calls.md).
        "requests_per_minute": "",
        "tokens_per_minute": "",
        "budget_burst_seconds": 1,
        "budget_max_wait_seconds": 60,
        "batch_size": 10000,
        "batch_poll_seconds": 60,
    }


def test_project_file_takes_the_model_budgets_from_the_environment() -> None:
    environ = {**ENV, "TRIAGE_LLM_REQUESTS_PER_MINUTE": "3000", "TRIAGE_LLM_TOKENS_PER_MINUTE": "250000"}
    extra = load_airflow_settings(PROJECT_FILE, environ=environ).connection("triage_llm").conn_extra
    assert (extra["requests_per_minute"], extra["tokens_per_minute"]) == ("3000", "250000")


def test_project_file_has_the_llm_pool_and_variables(project: AirflowSettings) -> None:
    assert [(p.pool_name, p.pool_slot) for p in project.pools] == [("llm_api", 32)]
    assert {v.variable_name: v.variable_value for v in project.variables} == {
        "triage_payload_base": "/srv/triage/payloads",
        "triage_reports_dir": "/srv/triage/reports",
        "triage_event_sink": "/srv/triage/events/outbox.jsonl",
        "triage_retention": RETENTION_JSON,
    }


RETENTION_JSON = (
    '{"outbox": 7, "job_events": 30, "classifications": 30, "payloads": 30, "event_files": 14, "reports": 30}'
)


def test_project_file_sets_the_retention_defaults_the_code_has() -> None:
    """The file says what an operator gets without it: the defaults of ``Retention``."""
    assert Retention.parse(RETENTION_JSON) == Retention()


def test_project_file_takes_the_model_endpoint_from_the_environment() -> None:
    settings = load_airflow_settings(
        PROJECT_FILE, environ={**ENV, "TRIAGE_LLM_URL": "https://llm.example/v1", "TRIAGE_LLM_MODEL": "m"}
    )
    llm = settings.connection("triage_llm")
    assert llm.conn_host == "https://llm.example/v1"
    assert llm.conn_extra["model"] == "m"


def test_project_file_needs_triage_home() -> None:
    with pytest.raises(SettingsError, match="TRIAGE_HOME is not set"):
        load_airflow_settings(PROJECT_FILE, environ={})


# -- commands -------------------------------------------------------------------------------------


def test_apply_commands(tmp_path: Path) -> None:
    settings = load_text(tmp_path, SMALL)
    assert apply_commands(settings, connections_file="/run/c.json") == [
        ["airflow", "connections", "import", "/run/c.json", "--overwrite"],
        ["airflow", "pools", "set", "llm_api", "8", "model calls"],
        ["airflow", "variables", "set", "triage_reports_dir", "/srv/reports"],
    ]


def test_apply_commands_with_another_airflow_command(tmp_path: Path) -> None:
    settings = load_text(tmp_path, SMALL)
    commands = apply_commands(settings, connections_file="c.json", airflow=["./airflow.sh"])
    assert {tuple(c[:1]) for c in commands} == {("./airflow.sh",)}


def test_apply_commands_without_connections_needs_no_file(tmp_path: Path) -> None:
    settings = load_text(tmp_path, "airflow:\n  pools:\n    - {pool_name: p, pool_slot: 1}\n")
    assert apply_commands(settings, connections_file="unused") == [["airflow", "pools", "set", "p", "1", ""]]


def test_connections_file_must_be_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.json"):
        apply_commands(load_text(tmp_path, SMALL), connections_file="c.yaml")


def test_connections_import_json(project: AirflowSettings) -> None:
    document = json.loads(connections_import_json(project))
    assert document["triage_db"] == {
        "conn_type": "postgres",
        "host": "localhost",
        "schema": "triage",
        "login": "triage_app",
        "password": "triage_app",
        "port": 5432,
    }
    llm = document["triage_llm"]
    assert json.loads(llm["extra"])["prompt_version"] == "p1"
    assert "schema" not in llm


def test_environment_overrides_are_skipped(project: AirflowSettings) -> None:
    environ = {
        "AIRFLOW_CONN_TRIAGE_DB": "{}",
        "AIRFLOW_CONN_TRIAGE_DB_REVIEW": "{}",
        "AIRFLOW_CONN_TRIAGE_DB_MAINTENANCE": "{}",
        "AIRFLOW_VAR_TRIAGE_REPORTS_DIR": "/x",
    }
    applied = without_environment_overrides(project, environ)
    assert [c.conn_id for c in applied.connections] == ["triage_llm"]
    assert "triage_reports_dir" not in [v.variable_name for v in applied.variables]
    assert applied.pools == project.pools


def test_apply_runs_each_command_with_the_connections_file_present(tmp_path: Path) -> None:
    settings = load_text(tmp_path, SMALL)
    seen: list[list[str]] = []
    files: dict[str, object] = {}

    def run(argv: list[str]) -> None:
        seen.append(argv)
        if argv[1:3] == ["connections", "import"]:
            path = Path(argv[3])
            files["content"] = json.loads(path.read_text())
            files["dir_mode"] = path.parent.stat().st_mode & 0o777
            files["path"] = path

    apply(settings, run=run)
    assert [argv[1:3] for argv in seen] == [["connections", "import"], ["pools", "set"], ["variables", "set"]]
    assert files["content"]["triage_db"]["password"] == "pw"  # type: ignore[index]  # the captured file's JSON, typed object
    assert files["dir_mode"] == 0o700
    assert not Path(str(files["path"])).exists(), "the file with passwords must not outlive apply()"


@pytest.mark.parametrize(
    ("airflow", "in_this_process"),
    [
        pytest.param(lambda: [sys.executable, "-m", "airflow"], True, id="this-interpreters-airflow"),
        pytest.param(lambda: ["airflow"], False, id="airflow-on-path"),
        pytest.param(lambda: ["./airflow.sh"], False, id="a-wrapper-script"),
        pytest.param(lambda: ["/usr/bin/python3", "-m", "airflow"], False, id="another-interpreter"),
    ],
)
def test_commands_run_in_this_process_only_with_this_interpreters_airflow(
    airflow: Callable[[], list[str]], in_this_process: bool
) -> None:
    assert (in_process(airflow()) is not None) is in_this_process


def test_main_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", "{}")
    assert main([str(write(tmp_path, SMALL)), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "skip connection triage_db: AIRFLOW_CONN_TRIAGE_DB is set",
        "airflow pools set llm_api 8 'model calls'",
        "airflow variables set triage_reports_dir /srv/reports",
    ]


def test_main_reports_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing.yaml"), "--dry-run"]) == 2
    assert "cannot read" in capsys.readouterr().err


# -- placeholders ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "environ", "expected"),
    [
        pytest.param("${A}", {"A": "x"}, "x", id="set"),
        pytest.param("${A:-d}", {}, "d", id="default"),
        pytest.param("${A:-d}", {"A": ""}, "", id="set-empty-wins-over-default"),
        pytest.param("${A:-}", {}, "", id="empty-default"),
        pytest.param("$${A}", {"A": "x"}, "${A}", id="escaped"),
        pytest.param("a$b", {}, "a$b", id="lone-dollar"),
        pytest.param("${A}/${B:-b}", {"A": "a"}, "a/b", id="several"),
    ],
)
def test_placeholders(tmp_path: Path, value: str, environ: dict[str, str], expected: str) -> None:
    text = f"airflow:\n  variables:\n    - variable_name: v\n      variable_value: '{value}'\n"
    settings = load_text(tmp_path, text, environ)
    assert settings.variables[0].variable_value == expected


@given(st.text())
def test_escaping_every_dollar_gives_the_text_back(value: str) -> None:
    """``$$`` is a literal ``$``: any text survives once its dollars are doubled."""
    from triage_tools.deploy.airflow_settings import _interpolate

    assert _interpolate(value.replace("$", "$$"), {}, "v") == value
    if "$" not in value:
        assert _interpolate(value, {}, "v") == value


# -- malformed files ------------------------------------------------------------------------------


def _conn(**fields: object) -> str:
    base: dict[str, object] = {"conn_id": "c", "conn_type": "postgres"}
    base.update(fields)
    return json.dumps({"airflow": {"connections": [{k: v for k, v in base.items() if v is not None}]}})


def _pool(**fields: object) -> str:
    base: dict[str, object] = {"pool_name": "p", "pool_slot": 1}
    base.update(fields)
    return json.dumps({"airflow": {"pools": [{k: v for k, v in base.items() if v is not None}]}})


def _variable(**fields: object) -> str:
    base: dict[str, object] = {"variable_name": "v", "variable_value": "x"}
    base.update(fields)
    return json.dumps({"airflow": {"variables": [{k: v for k, v in base.items() if v is not None}]}})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("airflow: [\n", "not valid YAML", id="not-yaml"),
        pytest.param("- airflow\n", "expected a mapping", id="top-level-list"),
        pytest.param("", "expected a mapping", id="empty-file"),
        pytest.param("connections: []\n", r"airflow: Field required", id="no-airflow-key"),
        pytest.param("airflow: {}\nastro: {}\n", "astro: Extra inputs", id="unknown-top-level-key"),
        pytest.param("airflow: {secrets: []}\n", "airflow.secrets: Extra inputs", id="unknown-section"),
        pytest.param(
            "airflow: {connections: {}}\n",
            "airflow.connections: Input should be a valid tuple",
            id="section-not-a-list",
        ),
        pytest.param(_conn(conn_type=None), r"connections\[0\]\.conn_type: Field required", id="no-conn-type"),
        pytest.param(_conn(conn_type=""), r"conn_type: String should have at least 1", id="empty-conn-type"),
        pytest.param(_conn(conn_hostname="h"), r"conn_hostname: Extra inputs", id="misspelt-field"),
        pytest.param(_conn(conn_id="triage db"), r"conn_id: String should match", id="bad-conn-id"),
        pytest.param(_conn(conn_port="abc"), r"conn_port: Input should be a valid integer", id="port-not-int"),
        pytest.param(
            _conn(conn_port=True), r"conn_port: Value error, expected an integer, not a boolean", id="port-bool"
        ),
        pytest.param(
            _conn(conn_port=70000), r"conn_port: Input should be less than or equal to 65535", id="port-range"
        ),
        pytest.param(_conn(conn_host=5), r"conn_host: Input should be a valid string", id="host-not-str"),
        pytest.param(_conn(conn_extra="{nope"), r"conn_extra: Value error, not valid JSON", id="extra-bad-json"),
        pytest.param(_conn(conn_extra=[1]), r"conn_extra: Input should be a valid dictionary", id="extra-list"),
        pytest.param(_pool(pool_slot="many"), r"pool_slot: Input should be a valid integer", id="slots-not-int"),
        pytest.param(_pool(pool_slot=False), r"pool_slot: Value error, expected an integer", id="slots-bool"),
        pytest.param(
            _pool(pool_slot=-2), r"pool_slot: Input should be greater than or equal to -1", id="slots-negative"
        ),
        pytest.param(_pool(pool_name=None), r"pool_name: Field required", id="no-pool-name"),
        pytest.param(
            _variable(variable_value=32), r"variable_value: Input should be a valid string", id="value-unquoted-number"
        ),
        pytest.param(_variable(variable_value=None), r"variable_value: Field required", id="no-value"),
        pytest.param(
            json.dumps({"airflow": {"connections": [{"conn_id": "c", "conn_type": "http"}] * 2}}),
            r"connections: duplicate names \['c'\]",
            id="duplicate-conn-id",
        ),
        pytest.param(
            json.dumps({"airflow": {"pools": [{"pool_name": "p", "pool_slot": 1}] * 2}}),
            r"pools: duplicate names \['p'\]",
            id="duplicate-pool",
        ),
        pytest.param(
            _variable(variable_value="${UNSET_FOR_TEST}"), "UNSET_FOR_TEST is not set", id="unset-placeholder"
        ),
        pytest.param(_variable(variable_value="${BROKEN"), "malformed placeholder", id="unclosed-placeholder"),
        pytest.param(_variable(variable_value="${A-b}"), "malformed placeholder", id="unsupported-placeholder"),
    ],
)
def test_malformed_settings_raise(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_text(tmp_path, text)


def test_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        load_airflow_settings(tmp_path / "nope.yaml", environ={})


def test_errors_never_echo_a_password(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as caught:
        load_text(tmp_path, _conn(conn_password=["s3cr3t-value"]))
    assert "s3cr3t-value" not in str(caught.value)
    assert "s3cr3t-value" not in repr(load_text(tmp_path, _conn(conn_password="s3cr3t-value")))


def test_default_environment_is_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIAGE_TEST_PLACEHOLDER", "from-env")
    path = write(tmp_path, _variable(variable_value="${TRIAGE_TEST_PLACEHOLDER}"))
    assert load_airflow_settings(path).variables[0].variable_value == "from-env"
    assert os.environ["TRIAGE_TEST_PLACEHOLDER"] == "from-env"
