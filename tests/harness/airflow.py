"""Helpers for tests that need a real, running Airflow 3 (scheduler, DAG processor, API server).

No tests here. Typical use::

    home = server_homes.make("airflow")         # not tmp_path: see tests/conftest.py
    env = airflow_test_env(home, metadata_url=url.airflow_metadata_url(), dags_folder=dags)
    migrate_metadata(env)                       # a fresh metadata database; the `deployment`
                                                # fixture clones a migrated template instead
    with running_airflow(env, dags, wait_for_dags=["classify_documents"]) as af:
        airflow_cli(af.env, "dags", "unpause", "classify_documents")
        af.post("/api/v2/backfills", {"dag_id": "classify_documents",
                                      "from_date": "2026-11-01T00:00:00Z", "to_date": "2026-11-03T00:00:00Z"})
        runs = wait_for_runs(af.env, "classify_documents", 3, run_type="backfill")

Why the API server: with the LocalExecutor the scheduler's task processes talk to Airflow only
through the Execution API, which the API server serves (``[core] execution_api_server_url``,
default ``{[api] base_url}/execution/``). Without it every task stays ``queued`` and then fails.

Each component is its own process group (``triage_tools.processes.Processes``) with its output in a log file
under ``$AIRFLOW_HOME/harness-logs``; teardown SIGTERMs the groups, then SIGKILLs what is left.
Ports (API server, the scheduler's and triggerer's log servers) are picked free, so tests can
run next to ``make up`` on 8080/8793/8794; each pytest-xdist worker picks from ports of its own
(:func:`free_port`), so two workers never race for one. ``simple_auth_manager_all_admins`` lets
the helpers call the REST API without a token.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triage_tools.local import health
from triage_tools.processes import ComponentExited, Processes

PROJECT_ROOT = Path(__file__).resolve().parents[2]
AIRFLOW = (sys.executable, "-m", "airflow")
FINISHED = frozenset({"success", "failed"})


class HarnessError(RuntimeError):
    """Airflow did not start, or runs did not reach the expected states in time."""


def free_port() -> int:
    """A free loopback port; under pytest-xdist, one of this worker's class: ``port // 2`` modulo
    the worker count is the worker's index (// 2: Linux hands out odd ports to ``bind(0)``). A
    port is free when asked for and taken only later, when Airflow binds it: two workers asking
    at once could be handed the same one; ports of two classes never meet.

    ``make test`` runs two pytest processes at once (the unit, ledger and airflow tiers on xdist
    workers, the e2e tier in one process beside them), as ``make test-drills`` does (the drills
    and the 3.13 smoke): it gives each the classes of all the workers of both
    (``TRIAGE_TEST_PORT_CLASSES``) and the second the classes after the first's
    (``TRIAGE_TEST_PORT_CLASS_FIRST``), so no two workers of the two runs share one."""
    from triage_tools.processes import free_port as local_free_port

    workers = int(os.environ.get("TRIAGE_TEST_PORT_CLASSES") or os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    index += int(os.environ.get("TRIAGE_TEST_PORT_CLASS_FIRST", "0"))
    for _ in range(1000):  # the kernel hands out ports at random: about `workers` tries
        port = local_free_port()
        if port // 2 % workers == index % workers:
            return port
    raise HarnessError(f"no free port of worker {index} of {workers}")


def airflow_test_env(
    home: Path,
    *,
    metadata_url: str,
    dags_folder: Path,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A complete environment for Airflow processes of a test.

    :param home: an empty directory for ``AIRFLOW_HOME``, from the ``server_homes`` fixture
        (never under ``tmp_path``: see tests/conftest.py).
    :param metadata_url: SQLAlchemy URL of the (fresh) metadata database, e.g.
        ``DatabaseUrl.airflow_metadata_url()``.
    :param extra: added last (``AIRFLOW_CONN_TRIAGE_DB``, ``TRIAGE_DATABASE_URL``, ...).
    """
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_"))}
    plugins = str(PROJECT_ROOT / "plugins")
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
            "AIRFLOW__CORE__DAGS_FOLDER": str(Path(dags_folder).resolve()),
            "AIRFLOW__CORE__PLUGINS_FOLDER": plugins,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            # Every component must sign and check the Execution API's tokens with the same key.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__WORKERS": "1",
            # A DAG file is parsed again when it changes (Airflow sorts by modification time); an
            # unchanged one every 30 s by default, which costs an idle deployment ~1.5 CPU-s a
            # minute here (docs/performance.md). No test changes what a DAG file reads without
            # editing it, so an unchanged file is parsed once per test.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "PYTHONPATH": os.pathsep.join(p for p in (plugins, os.environ.get("PYTHONPATH", "")) if p),
            "PYTHONUNBUFFERED": "1",
            "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
            # The DAG tests drill (fault rates in the run conf), as `make run` and `make chaos` do.
            "TRIAGE_ALLOW_DRILL": "1",
        }
    )
    env.update(extra or {})
    return env


def airflow_cli(
    env: Mapping[str, str], *args: str, check: bool = True, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``airflow ARGS`` with ``env``; raises :class:`HarnessError` with its output if it fails."""
    result = subprocess.run(
        [*AIRFLOW, *args], env=dict(env), text=True, capture_output=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise HarnessError(
            f"airflow {' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


class AirflowCli:
    """``airflow ARGS`` for one environment, each command forked from one process that imported
    Airflow once (triage_tools/warm.py, ``execution_api=False``): a cold CLI process
    costs 3-4.5 CPU-s, ~2.5 of them importing Airflow. Each command is still Airflow's own command
    line in a process of its own, with its exit code and output; a command whose environment
    differs from the warm one in what Airflow reads at import runs cold (:func:`airflow_cli`)."""

    def __init__(self, env: Mapping[str, str], log: Path) -> None:
        from triage_tools.warm import WarmAirflow

        self.env = dict(env)
        self._warm = WarmAirflow(self.env, log, execution_api=False)

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 180, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """As :func:`airflow_cli` (``env`` defaults to this one's)."""
        result = self._warm.run(args, env if env is not None else self.env, timeout)
        if check and result.returncode != 0:
            raise HarnessError(
                f"airflow {' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def close(self) -> None:
        self._warm.close()

    def __enter__(self) -> AirflowCli:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def json_output(stdout: str) -> Any:
    """The JSON document of ``airflow ... -o json`` (:func:`triage_tools.local.json_output`)."""
    from triage_tools.local import json_output as parse

    try:
        return parse(stdout)
    except ValueError as exc:
        raise HarnessError(str(exc)) from None


def migrate_metadata(env: Mapping[str, str]) -> None:
    """``airflow db migrate`` (a fresh database takes ~3.5 s: Airflow creates the tables and stamps)."""
    airflow_cli(env, "db", "migrate")


@dataclass
class RunningAirflow:
    """What :func:`running_airflow` yields."""

    env: dict[str, str]
    base_url: str
    processes: Processes

    def get(self, path: str, timeout: float = 10) -> Any:
        return _request(self.base_url + path, timeout=timeout)

    def post(self, path: str, body: Mapping[str, Any], timeout: float = 30) -> Any:
        return _request(self.base_url + path, body=body, method="POST", timeout=timeout)

    def patch(self, path: str, body: Mapping[str, Any], timeout: float = 30) -> Any:
        return _request(self.base_url + path, body=body, method="PATCH", timeout=timeout)

    def logs(self, tail: int = 60) -> str:
        """The last lines of every component's log (for assertion messages)."""
        return self.processes.logs(tail)

    def unpause(self, dag_id: str) -> None:
        self.patch(f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def import_errors(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v2/importErrors").get("import_errors", []))


# A GET is asked again when the API server (one worker) is too busy to answer in time, as it is
# while other tests' Airflow processes share the two cores: polls must not die of one slow answer.
GET_ATTEMPTS = 3

# Bearer tokens of the deployments whose auth manager has users (``running_airflow(login=...)``),
# by API base URL: every helper that calls such a deployment (``wait_for_runs``, ``task_states``,
# ...) sends its token, as it sends nothing to one whose users are all admins.
_TOKENS: dict[str, str] = {}


def _auth_headers(url: str) -> dict[str, str]:
    token = next((token for base, token in _TOKENS.items() if url.startswith(base + "/")), None)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _login(base_url: str, username: str, password: str) -> str:
    """A bearer token of ``username`` from the auth manager's ``POST /auth/token``."""
    body = json.dumps({"username": username, "password": password}).encode()
    req = urllib.request.Request(
        f"{base_url}/auth/token", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as response:
        return str(json.loads(response.read())["access_token"])


def _request(url: str, *, body: Mapping[str, Any] | None = None, method: str = "GET", timeout: float = 10) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **_auth_headers(url)}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    attempts = GET_ATTEMPTS if method == "GET" else 1  # only a GET is safe to send twice
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                text = response.read().decode()
            break
        except urllib.error.HTTPError as exc:
            raise HarnessError(
                f"{method} {url}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:2000]}"
            ) from None
        except (TimeoutError, urllib.error.URLError) as exc:  # URLError: a connect that timed out
            timed_out = isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)
            if not timed_out or attempt == attempts:
                raise
    return json.loads(text) if text else None


@contextlib.contextmanager
def running_airflow(
    env: Mapping[str, str],
    dags_folder: Path,
    timeout: float = 120,
    *,
    wait_for_dags: Collection[str] = (),
    api_port: int | None = None,
    triggerer: bool = False,
    login: tuple[str, str] | None = None,
) -> Iterator[RunningAirflow]:
    """Run ``airflow api-server``, ``scheduler`` and ``dag-processor`` for a test (and
    ``triggerer`` with ``triggerer=True``: a deferred task resumes only through one).

    Returns once the API server reports the metadata DB, the scheduler and the DAG processor
    healthy and every DAG of ``wait_for_dags`` is parsed; raises :class:`HarnessError` (with the
    components' logs) if that takes more than ``timeout`` seconds or a component exits.

    :param env: from :func:`airflow_test_env` (or any env with ``AIRFLOW_HOME`` and the metadata
        DB); ports are added to a copy, which the yielded object carries as ``.env``.
    :param api_port: the API server's port, when the caller must know it beforehand (default: a
        free one of this worker's).
    :param login: ``(username, password)`` of a deployment whose auth manager has users (not
        ``simple_auth_manager_all_admins``): the helpers then call its API with that user's token.
    """
    run_env = dict(env)
    run_env["AIRFLOW__CORE__DAGS_FOLDER"] = str(Path(dags_folder).resolve())
    from triage_tools.processes import side_by_side_env

    run_env.update(side_by_side_env(api_port or free_port()))
    # the log servers' ports too, from this worker's own ports (side_by_side_env picks any free one)
    run_env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(free_port())
    run_env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"] = str(free_port())
    base_url = run_env["AIRFLOW__API__BASE_URL"]
    run_env.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_urlsafe(32))
    home = Path(run_env["AIRFLOW_HOME"])
    log_dir = home / "harness-logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    components = ["api-server", "scheduler", "dag-processor", *(["triggerer"] if triggerer else [])]
    airflow = RunningAirflow(env=run_env, base_url=base_url, processes=Processes(log_dir))
    try:
        for name in components:
            airflow.processes.start(name, [*AIRFLOW, name], run_env)
        _wait_ready(airflow, wait_for_dags, timeout, triggerer=triggerer, login=login)
        yield airflow
    finally:
        _TOKENS.pop(base_url, None)
        airflow.processes.stop(components, timeout=20)


def _wait_ready(
    airflow: RunningAirflow,
    dag_ids: Collection[str],
    timeout: float,
    *,
    triggerer: bool = False,
    login: tuple[str, str] | None = None,
) -> None:
    wanted = ["metadatabase", "scheduler", "dag_processor", *(["triggerer"] if triggerer else [])]
    deadline = time.monotonic() + timeout
    pending = set(dag_ids)
    while True:
        try:
            airflow.processes.check()
        except ComponentExited as exc:
            raise HarnessError(f"airflow {exc}") from None
        doc = health(airflow.base_url)
        healthy = bool(doc) and all(((doc or {}).get(c) or {}).get("status") == "healthy" for c in wanted)
        if healthy and login is not None and airflow.base_url not in _TOKENS:
            with contextlib.suppress(OSError, ValueError, KeyError):
                _TOKENS[airflow.base_url] = _login(airflow.base_url, *login)
        if healthy and (login is None or airflow.base_url in _TOKENS):
            for dag_id in list(pending):
                with contextlib.suppress(HarnessError, OSError, ValueError):
                    airflow.get(f"/api/v2/dags/{dag_id}")
                    pending.discard(dag_id)
            if not pending:
                return
        if time.monotonic() > deadline:
            errors = ""
            with contextlib.suppress(Exception):
                errors = json.dumps(airflow.import_errors(), indent=2)
            raise HarnessError(
                f"Airflow not ready after {timeout:.0f}s (health {doc}, DAGs not parsed {sorted(pending)}, "
                f"import errors {errors})\n{airflow.logs()}"
            )
        time.sleep(0.5)


def api_client(base_url: str, username: str, password: str, timeout: float = 60) -> Any:
    """An ``httpx.Client`` of Airflow's public API as ``username`` (a bearer token from ``POST
    /auth/token``), for deployments whose auth manager has users (``make up``'s, FAB's)."""
    import httpx

    response = httpx.post(f"{base_url}/auth/token", json={"username": username, "password": password}, timeout=timeout)
    if response.status_code != 201:
        raise HarnessError(f"POST /auth/token as {username}: HTTP {response.status_code}: {response.text[:500]}")
    return httpx.Client(
        base_url=base_url, timeout=timeout, headers={"Authorization": f"Bearer {response.json()['access_token']}"}
    )


def wait_for_first_run(api: Any, dag_id: str, timeout: float = 300) -> dict[str, Any]:
    """The first run of ``dag_id`` (by id) once it has finished, read with ``api`` (:func:`api_client`)."""
    deadline = time.monotonic() + timeout
    while True:
        response = api.get(f"/api/v2/dags/{dag_id}/dagRuns", params={"order_by": "id", "limit": 1})
        runs = response.json().get("dag_runs", []) if response.status_code == 200 else []
        if runs and runs[0]["state"] in FINISHED:
            return dict(runs[0])
        if time.monotonic() > deadline:
            raise HarnessError(f"no finished {dag_id} run after {timeout:.0f}s: {response.text[:2000]}")
        time.sleep(2.0)


def list_runs(env: Mapping[str, str], dag_id: str) -> list[dict[str, Any]]:
    """Every run of ``dag_id``: the REST API when ``env`` names a running API server, else the CLI.

    REST rows carry ``dag_run_id``, ``state``, ``run_type``, ``logical_date``,
    ``data_interval_start``/``end``, ``conf``...; CLI rows (``airflow dags list-runs -o json``)
    only ``run_id``, ``state``, ``run_after``, ``logical_date``, ``start_date``, ``end_date``. Both are
    normalised to have ``run_id`` and ``run_type``.
    """
    base_url = env.get("AIRFLOW__API__BASE_URL")
    rows: list[dict[str, Any]]
    if base_url and health(base_url) is not None:
        rows, offset = [], 0
        while True:
            page = _request(f"{base_url}/api/v2/dags/{dag_id}/dagRuns?limit=100&offset={offset}&order_by=id")
            rows += page["dag_runs"]
            offset += len(page["dag_runs"])
            if not page["dag_runs"] or offset >= page["total_entries"]:
                break
        for row in rows:
            row.setdefault("run_id", row.get("dag_run_id"))
    else:
        rows = json_output(airflow_cli(env, "dags", "list-runs", dag_id, "-o", "json").stdout)
        for row in rows:
            row.setdefault("run_type", str(row["run_id"]).split("__", 1)[0])
    return rows


def wait_for_runs(
    env: Mapping[str, str],
    dag_id: str,
    n: int,
    states: Collection[str] = ("success",),
    timeout: float = 120,
    *,
    run_type: str | None = None,
    poll: float = 1.0,
    where: Callable[[dict[str, Any]], bool] | None = None,
) -> list[dict[str, Any]]:
    """Wait until ``n`` runs of ``dag_id`` (of ``run_type``, and for which ``where`` holds, if
    given: the runs a test of a shared deployment owns) are finished; return them.

    Returns the runs (sorted by logical date) once ``n`` of them have finished and all finished
    ones are in ``states``. Raises :class:`HarnessError` as soon as a run finishes in a state not
    in ``states`` (e.g. ``failed`` while waiting for ``success``), or after ``timeout``. Each look
    (a health check and a page of runs) costs the API server ~22 ms of CPU here: one a second,
    not two, while the runs take tens of seconds.
    """
    wanted = set(states)
    deadline = time.monotonic() + timeout
    runs: list[dict[str, Any]] = []
    while True:
        runs = [
            r
            for r in list_runs(env, dag_id)
            if (run_type is None or r.get("run_type") == run_type) and (where is None or where(r))
        ]
        finished = [r for r in runs if r.get("state") in FINISHED | wanted]
        unexpected = [r for r in finished if r.get("state") not in wanted]
        if unexpected:
            raise HarnessError(
                f"{dag_id}: runs ended {[(r['run_id'], r['state']) for r in unexpected]}, wanted {sorted(wanted)}"
            )
        if len(finished) >= n:
            return sorted(finished, key=lambda r: str(r.get("logical_date") or r.get("run_after")))
        if time.monotonic() > deadline:
            raise HarnessError(
                f"{dag_id}: {len(finished)}/{n} runs in {sorted(wanted)} after {timeout:.0f}s: "
                f"{[(r['run_id'], r.get('state')) for r in runs]}"
            )
        time.sleep(poll)


def task_states(env: Mapping[str, str], dag_id: str, run_id: str) -> dict[str, str | None]:
    """``task_id -> state`` of one run (REST API of a running harness)."""
    base_url = env["AIRFLOW__API__BASE_URL"]
    quoted = urllib.parse.quote(run_id, safe="")
    page = _request(f"{base_url}/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances?limit=1000")
    return {
        ti["task_id"] + (f"[{ti['map_index']}]" if ti.get("map_index", -1) >= 0 else ""): ti["state"]
        for ti in page["task_instances"]
    }


def task_log(
    env: Mapping[str, str], dag_id: str, run_id: str, task_id: str, try_number: int = 1, tail: int = 80
) -> str:
    """The last lines of one task try's log (REST API of a running harness), for assertion messages.

    Never raises: a log that cannot be read says why instead, so the failure it explains stays the
    one reported.
    """
    base_url = env["AIRFLOW__API__BASE_URL"]
    quoted = urllib.parse.quote(run_id, safe="")
    url = (
        f"{base_url}/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances/{task_id}/logs/{try_number}?full_content=true"
    )
    req = urllib.request.Request(url, headers={"Accept": "text/plain", **_auth_headers(url)})
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            text = response.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as exc:
        return f"(the log of {dag_id}/{task_id} try {try_number} could not be read: {exc})"
    lines = text.splitlines()[-tail:]
    return f"-- log of {dag_id}/{task_id} try {try_number} (last {len(lines)} lines) --\n" + "\n".join(lines)
