"""``airflow_settings.yaml`` applied to a real metadata database with this interpreter's Airflow:
the CLI commands run one after another in the applier's own process
(``triage_tools.deploy.airflow_settings.in_process``), and a command that fails still fails the
apply with its exit code, as a process of its own would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg

from tests.harness.deployment import ROOT, Deployment
from triage.database import DatabaseUrl

SETTINGS = """\
airflow:
  connections:
    - conn_id: settings_probe_http
      conn_type: http
      conn_host: http://127.0.0.1:9/v1
      conn_password: probe-secret
      conn_extra: {}
  pools:
    - pool_name: settings_probe_pool
      pool_slot: 3
      pool_description: probe
  variables:
    - variable_name: settings_probe_a
      variable_value: first
    - variable_name: settings_probe_b
      variable_value: second
"""


def apply(deployment: Deployment, settings: Path, **env: str) -> subprocess.CompletedProcess[str]:
    airflow = f"{sys.executable} -m airflow"
    return subprocess.run(
        [sys.executable, "-m", "triage_tools.deploy.airflow_settings", str(settings), "--airflow", airflow],
        env={**deployment.env, **env},
        cwd=ROOT,
        text=True,
        capture_output=True,
        check=False,
        timeout=300,
    )


def test_the_settings_are_written_by_airflows_commands_in_one_process(deployment: Deployment, tmp_path: Path) -> None:
    settings = tmp_path / "airflow_settings.yaml"
    settings.write_text(textwrap.dedent(SETTINGS))

    done = apply(deployment, settings)

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("+ ") == 4  # connections import, pools set, two variables set
    metadata = DatabaseUrl.parse(deployment.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    with psycopg.connect(metadata.libpq()) as conn:
        pool = conn.execute("SELECT slots, description FROM slot_pool WHERE pool = 'settings_probe_pool'").fetchone()
        variables: dict[str, bool] = dict(
            conn.execute("SELECT key, is_encrypted FROM variable WHERE key LIKE 'settings_probe_%'")
        )
        connection = conn.execute(
            "SELECT conn_type, host, is_encrypted FROM connection WHERE conn_id = 'settings_probe_http'"
        ).fetchone()
    assert pool == (3, "probe")
    assert variables == {"settings_probe_a": True, "settings_probe_b": True}  # encrypted, as `variables set` does
    assert connection == ("http", "http://127.0.0.1:9/v1", True)
    assert "probe-secret" not in done.stdout + done.stderr

    again = apply(deployment, settings)  # idempotent, as each command is
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_failing_command_fails_the_apply_with_its_exit_code(deployment: Deployment, tmp_path: Path) -> None:
    settings = tmp_path / "airflow_settings.yaml"
    settings.write_text(textwrap.dedent(SETTINGS))
    metadata = DatabaseUrl.parse(deployment.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    gone = metadata.with_database(f"{metadata.database}_missing").airflow_metadata_url()

    done = apply(deployment, settings, AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=gone)

    assert done.returncode != 0
    [said] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert "connections import" in said, done.stderr[-3000:]
    assert done.stdout.count("+ ") == 1  # stopped at the first command
