"""The local deployment's task preload (issue #29): ``make up``'s scheduler runs the LocalExecutor's
workers from a forkserver that imported the task modules once (``[scheduler] mp_start_method``
``forkserver``, ``mp_forkserver_preload`` = ``triage_tools.deployment.TASK_PRELOAD``), so a task
process no longer imports them. docs/performance.md, "Where the time of a run goes"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from triage_tools import deployment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env_of(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., dict[str, str]]:
    """environment() (what ``make up`` exports to ``airflow standalone``) for an exported
    environment, without starting a database."""

    def fake_airflow_environment() -> dict[str, str]:
        return {"TRIAGE_HOME": str(tmp_path), "AIRFLOW_HOME": str(tmp_path / "airflow")}

    monkeypatch.setattr(deployment, "airflow_environment", fake_airflow_environment)
    (tmp_path / "airflow").mkdir()

    def env_of(**exported: str) -> dict[str, str]:
        for key in ("AIRFLOW__SCHEDULER__MP_START_METHOD", "AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD"):
            monkeypatch.delenv(key, raising=False)
        for key, value in exported.items():
            monkeypatch.setenv(key, value)
        return deployment.environment()

    return env_of


def test_make_ups_scheduler_starts_tasks_from_a_preloaded_forkserver(env_of: Callable[..., dict[str, str]]) -> None:
    """Airflow itself reads the settings ``make up`` exports: the scheduler's start method and
    the modules its forkserver imports (read the way ``airflow scheduler`` applies them)."""
    env = env_of()
    read = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json; from airflow.configuration import conf;"
            " from airflow.utils.process_utils import resolve_mp_start_method;"
            " print(json.dumps([resolve_mp_start_method('scheduler'),"
            " conf.get('scheduler', 'mp_forkserver_preload'), resolve_mp_start_method('dag_processor')]))",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    method, preload, dag_processor = json.loads(read.stdout.strip().splitlines()[-1])
    assert method == "forkserver"
    assert preload.split(",") == list(deployment.TASK_PRELOAD)
    assert dag_processor is None  # the DAG processor still imports DAG files afresh


def test_an_exported_start_method_wins(env_of: Callable[..., dict[str, str]]) -> None:
    env = env_of(AIRFLOW__SCHEDULER__MP_START_METHOD="fork")
    assert env["AIRFLOW__SCHEDULER__MP_START_METHOD"] == "fork"


def test_every_preloaded_module_imports() -> None:
    """The forkserver skips a module that fails to import without a word (multiprocessing's
    ``forkserver.main``), so a renamed module would quietly cost every task its imports again."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), os.environ.get("PYTHONPATH", "")])}
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run(
        [sys.executable, "-c", code, *deployment.TASK_PRELOAD], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(name.startswith("triage.") for name in deployment.TASK_PRELOAD)


def test_the_celery_deployment_gives_the_preload_back(env_of: Callable[..., dict[str, str]]) -> None:
    """``make distributed``'s scheduler is built on the same environment, but its tasks run in
    the Celery workers: it keeps Airflow's start method (an exported one stays)."""
    from triage_tools.celery_deployment import celery_environment

    base = {**env_of(), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg://u:p@127.0.0.1:5432/airflow"}
    env = celery_environment(base, broker_url="redis://127.0.0.1:6379/0", api_port=18080, concurrency=2)
    assert not set(deployment.TASK_PRELOAD_SETTINGS) & set(env)
    exported = {**base, "AIRFLOW__SCHEDULER__MP_START_METHOD": "spawn"}
    env = celery_environment(exported, broker_url="redis://127.0.0.1:6379/0", api_port=18080, concurrency=2)
    assert env["AIRFLOW__SCHEDULER__MP_START_METHOD"] == "spawn"
