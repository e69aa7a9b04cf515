"""``triage_tools.warm``: Airflow commands forked from one process that imported Airflow once
(``make run``'s two ``airflow dags test`` runs, the DAG tests, the tests' Airflow CLI commands).
Each command keeps what a process of its own gives: its exit code, its output where it was sent
(appended, for ``make run``'s log), and the environment it was given."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from triage_tools.warm import WarmAirflow


def airflow_env(home: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    }


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1].strip()


def test_each_command_has_its_own_exit_code_output_and_environment(tmp_path: Path) -> None:
    env = airflow_env(tmp_path / "airflow")
    version = metadata.version("apache-airflow")
    with WarmAirflow(env, tmp_path / "warm.log", execution_api=False) as airflow:
        done = airflow.run(["version"], env, timeout=300)
        assert (done.returncode, last_line(done.stdout)) == (0, version), done.stderr[-2000:]

        refused = airflow.run(["no-such-command"], env, timeout=300)  # argparse exits 2
        assert refused.returncode == 2
        assert "no-such-command" in refused.stderr

        log = tmp_path / "run.log"
        for _ in range(2):  # make run: both runs' output in one file
            airflow.start(["version"], stdout=log, stderr=log, append=True)
            assert airflow.wait(timeout=300) == 0
        assert log.read_text().count(version) == 2

        # Another value of a key Airflow reads at import: a cold process, which sees it.
        other = {**env, "AIRFLOW__CORE__DEFAULT_TIMEZONE": "Europe/Paris"}
        cold = airflow.run(["config", "get-value", "core", "default_timezone"], other, timeout=300)
        assert (cold.returncode, last_line(cold.stdout)) == (0, "Europe/Paris")
        # A key read at run time (the REST API's URL), given to one command only: the warm
        # process's child, which sees it too.
        api = {**env, "AIRFLOW__API__BASE_URL": "http://127.0.0.1:1"}
        got = airflow.run(["config", "get-value", "api", "base_url"], api, timeout=300)
        assert (got.returncode, last_line(got.stdout)) == (0, "http://127.0.0.1:1")
