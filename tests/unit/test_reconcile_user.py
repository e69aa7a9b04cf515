"""reconcile_jobs' Airflow API user as the local deployment provisions it (SimpleAuthManager),
and the rights the FabAuthManager role gets, without Airflow running (the running deployments:
tests/drills/test_make_up.py and tests/drills/test_reconcile_user_fab.py)."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import pytest

from triage.reconciliation import airflow_view
from triage_tools.deploy import reconcile_user as ru


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"AIRFLOW_HOME": str(tmp_path / "airflow")}


def stored(env: dict[str, str]) -> dict[str, str]:
    return json.loads(ru.passwords_file(env).read_text())


@pytest.mark.parametrize(
    ("configured", "expected"),
    [
        pytest.param("admin:admin", "admin:admin,triage_reconcile:viewer", id="airflow-default"),
        pytest.param("alice:op, bob:viewer", "alice:op,bob:viewer,triage_reconcile:viewer", id="own-users-kept"),
        pytest.param("triage_reconcile:admin,admin:admin", "admin:admin,triage_reconcile:viewer", id="never-more"),
        pytest.param("admin:admin,triage_reconcile:viewer", "admin:admin,triage_reconcile:viewer", id="idempotent"),
    ],
)
def test_the_reconcile_user_joins_the_configured_users_as_a_viewer(configured: str, expected: str) -> None:
    assert ru.users_with_reconcile(configured) == expected


def test_the_users_come_from_the_environment_then_airflow_cfg_then_airflows_default(env: dict[str, str]) -> None:
    assert ru.local_settings(env)[ru.USERS_ENV] == "admin:admin,triage_reconcile:viewer"
    cfg = Path(env["AIRFLOW_HOME"]) / "airflow.cfg"
    cfg.write_text("[core]\nsimple_auth_manager_users = carol:admin\n")
    assert ru.local_settings(env)[ru.USERS_ENV] == "carol:admin,triage_reconcile:viewer"
    env[ru.USERS_ENV] = "dave:op"
    assert ru.local_settings(env)[ru.USERS_ENV] == "dave:op,triage_reconcile:viewer"


def test_the_password_is_generated_once_into_a_private_file_beside_airflows(env: dict[str, str]) -> None:
    path = ru.passwords_file(env)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"admin": "generated-by-airflow"}) + "\n")
    path.chmod(0o644)

    first = ru.ensure_password(path)
    again = ru.ensure_password(path)

    assert first == again
    assert len(first) >= 32
    assert stored(env) == {"admin": "generated-by-airflow", ru.USERNAME: first}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_fresh_home_gets_a_password_file_of_mode_0600(env: dict[str, str]) -> None:
    password = ru.ensure_password(ru.passwords_file(env))
    assert stored(env) == {ru.USERNAME: password}
    assert stat.S_IMODE(ru.passwords_file(env).stat().st_mode) == 0o600


def test_concurrent_first_uses_agree_on_one_password(env: dict[str, str]) -> None:
    path = ru.passwords_file(env)
    seen: list[str] = []
    threads = [threading.Thread(target=lambda: seen.append(ru.ensure_password(path))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(seen)) == 1
    assert stored(env) == {ru.USERNAME: seen[0]}


def test_the_connection_names_the_api_server_and_the_user(env: dict[str, str]) -> None:
    settings = ru.local_settings(env)
    conn = json.loads(settings[ru.CONN_ENV])
    assert conn == {
        "conn_type": "http",
        "host": "http://localhost:8080",
        "login": ru.USERNAME,
        "password": stored(env)[ru.USERNAME],
        "description": ru.DESCRIPTION,
    }
    side_by_side = {**env, "AIRFLOW__API__PORT": "9191"}
    assert json.loads(ru.local_settings(side_by_side)[ru.CONN_ENV])["host"] == "http://localhost:9191"
    with_base = {**side_by_side, "AIRFLOW__API__BASE_URL": "http://127.0.0.1:9191"}
    assert json.loads(ru.local_settings(with_base)[ru.CONN_ENV])["host"] == "http://127.0.0.1:9191"


def test_an_exported_connection_is_kept(env: dict[str, str]) -> None:
    env[ru.CONN_ENV] = '{"conn_type": "http", "host": "http://elsewhere:8080"}'
    assert ru.CONN_ENV not in ru.local_settings(env)


def test_people_never_see_the_reconcile_users_password(env: dict[str, str]) -> None:
    from triage_tools import local

    path = ru.passwords_file(env)
    ru.ensure_password(path)
    assert local.login(env) == {}  # up waits for Airflow's own users, not for this one
    path.write_text(json.dumps({**stored(env), "admin": "a"}))
    assert local.login(env) == {"admin": "a"}
    assert local.admin_login(env) == ("admin", "a")


def test_the_fab_role_reads_classify_documents_runs_and_task_instances_and_nothing_else() -> None:
    assert ru.WATCHED_DAG == airflow_view.DAG_ID
    assert {action for action, _ in ru.FAB_PERMISSIONS} == {"can_read"}
    assert {resource for _, resource in ru.FAB_PERMISSIONS} == {
        "DAG Runs",
        "Task Instances",
        f"DAG:{airflow_view.DAG_ID}",
    }


def test_the_fab_connection_keeps_its_password_out_of_the_import_commands() -> None:
    from triage_tools.deploy.airflow_settings import AirflowSettings, apply_commands, connections_import_json

    settings = AirflowSettings(connections=(ru.fab_connection(ru.COMPOSE_API_URL, "pa55-word"),))
    commands = apply_commands(settings, connections_file="c.json")
    assert commands == [["airflow", "connections", "import", "c.json", "--overwrite"]]
    assert json.loads(connections_import_json(settings)) == {
        ru.CONN_ID: {"conn_type": "http", "host": ru.COMPOSE_API_URL, "login": ru.USERNAME, "password": "pa55-word"}
    }
