"""The local deployment: Airflow standalone on the embedded PostgreSQL, driven by the make targets.

    python -m triage_tools.local prepare                      job migrations, Airflow metadata DB, settings
    python -m triage_tools.local up                           prepare, then ``airflow standalone`` in the background
    python -m triage_tools.local stop                         stop what ``up`` started, then the embedded PostgreSQL
    python -m triage_tools.local dags-test DAG DATE [CONF]    one in-process DAG run (``airflow dags test``)
    python -m triage_tools.local airflow ARGS...              the Airflow CLI against this deployment
    python -m triage_tools.local reset-secrets                delete the connections and variables that
                                                        another Fernet key encrypted (make clean)

Everything runs with :func:`triage_tools.deployment.airflow_environment` (``TRIAGE_HOME``, ``AIRFLOW_HOME``, the
metadata DB, ``AIRFLOW_CONN_TRIAGE_DB``). ``AIRFLOW__CORE__DAGS_FOLDER``, when exported, replaces
the checkout's ``dags/`` (tests and experiments point Airflow at other DAGs that way).

``prepare`` is cheap when nothing changed: a state file under ``AIRFLOW_HOME`` records which
Airflow version migrated which metadata database (by its PostgreSQL oid and alembic revision) and
a digest of the applied ``airflow_settings.yaml``; ``airflow db migrate`` and the settings are
applied again only when one of those differs.

No Airflow import here: Airflow reads its configuration at import time, so everything Airflow
does runs in a child ``python -m airflow`` with the environment set.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any, NoReturn

from triage_tools.deploy import fernet

log = logging.getLogger("triage_tools.local")

API_PORT = 8080
HEALTH_PATH = "/api/v2/monitor/health"
STATE_FILE = "triage-prepare.json"
PID_FILE = "standalone.pid"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"  # SimpleAuthManager's default
UP_TIMEOUT = 180.0
STOP_TIMEOUT = 30.0


def _say(message: str) -> None:
    """Progress goes to stderr, so that ``./airflow.sh ... -o json`` stays parseable."""
    print(f"triage: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# environment


def environment() -> dict[str, str]:
    """``os.environ`` plus this deployment's Airflow settings; starts the embedded PostgreSQL."""
    from triage.settings import ENV_ALLOW_DRILL
    from triage_tools.deployment import airflow_environment

    dags_override = os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")
    env = dict(os.environ)
    env.update(airflow_environment())
    if dags_override:
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(Path(dags_override).resolve())
    # `airflow standalone` starts its components as `airflow ...` found on PATH.
    bin_dir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (bin_dir, path) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The local deployment is where drills run (`make run CONF='{"drill": …}'`, `make chaos`);
    # an exported TRIAGE_ALLOW_DRILL=0 still turns them off. docker-compose leaves them off.
    env.setdefault(ENV_ALLOW_DRILL, "1")
    return env


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def side_by_side_env(api_port: int | None = None) -> dict[str, str]:
    """Ports for an Airflow that runs beside another on this machine (``make up`` on 8080/8793):
    the API server on loopback, the Execution API URL its task processes call, and free ports
    for the worker and triggerer log servers."""
    port = api_port or free_port()
    base = f"http://127.0.0.1:{port}"
    return {
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
    }


def airflow_command() -> list[str]:
    """The Airflow CLI of this interpreter."""
    return [sys.executable, "-m", "airflow"]


def _airflow_home(env: Mapping[str, str]) -> Path:
    return Path(env["AIRFLOW_HOME"])


def _triage_home(env: Mapping[str, str]) -> Path:
    return Path(env["TRIAGE_HOME"])


def _run_airflow(env: Mapping[str, str], args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run ``airflow ARGS`` quietly; raise with its output if it fails."""
    argv = [*airflow_command(), *args]
    result = subprocess.run(argv, env=dict(env), text=True, capture_output=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise subprocess.CalledProcessError(result.returncode, ["airflow", *args])
    return result


# ---------------------------------------------------------------------------------------------
# prepare


def _metadata_identity(env: Mapping[str, str]) -> dict[str, Any]:
    """Which metadata database this is (oid changes when it is recreated) and its alembic revision."""
    import psycopg

    from triage.database import DatabaseUrl

    url = DatabaseUrl.parse(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    with psycopg.connect(url.libpq(), autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT d.oid::bigint, current_database() FROM pg_database d WHERE d.datname = current_database()"
        ).fetchone()
        revision = None
        if conn.execute("SELECT to_regclass('public.alembic_version')").fetchone()[0] is not None:  # type: ignore[index]
            found = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            revision = found[0] if found else None
    assert row is not None
    return {
        "database_oid": row[0],
        "database": row[1],
        "server": f"{url.host or 'localhost'}:{url.port or 5432}",
        "revision": revision,
    }


def _settings_digest(env: Mapping[str, str], settings_file: Path) -> str:
    """A digest of what applying ``settings_file`` would write (after placeholders and shadowing)."""
    from triage_tools.deploy.airflow_settings import (
        apply_commands,
        connections_import_json,
        load_airflow_settings,
        without_environment_overrides,
    )

    settings = without_environment_overrides(load_airflow_settings(settings_file, environ=env), env)
    material = json.dumps(
        {
            "connections": connections_import_json(settings),
            "commands": apply_commands(settings, connections_file="c.json", airflow=("airflow",)),
            "fernet_key": fernet.key_fingerprint(env),  # another key: check it opens the metadata first
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()


def _read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def settings_file() -> Path:
    from triage.settings import project_root

    return Path(os.environ.get("TRIAGE_AIRFLOW_SETTINGS", project_root() / "airflow_settings.yaml"))


def prepare(*, force: bool = False, verbose: bool = False) -> dict[str, str]:
    """Make the local deployment ready to run Airflow; returns its environment.

    1. start the embedded PostgreSQL (or use ``TRIAGE_DATABASE_URL``);
    2. apply the job-table migrations (and, embedded, create the DAGs' login role ``triage_worker``);
    3. ``airflow db migrate`` unless this Airflow version already migrated this metadata DB;
    4. apply ``airflow_settings.yaml`` unless the same content was applied to this metadata DB
       with the same Fernet key, after checking that the key opens the secrets already there.

    :raises triage_tools.deploy.fernet.FernetKeyMismatch: the metadata DB holds secrets encrypted with
        another key (its message is the one line to show).
    """
    from triage.database import DatabaseUrl
    from triage_tools.deployment import is_embedded, migrate

    timings: dict[str, float] = {}
    started = time.monotonic()
    env = environment()  # starts the embedded server; its job database is in the environment
    timings["database"] = time.monotonic() - started

    step = time.monotonic()
    migrate(DatabaseUrl.parse(env["TRIAGE_DATABASE_URL"]), embedded=is_embedded())
    timings["job migrations"] = time.monotonic() - step

    home = _airflow_home(env)
    home.mkdir(parents=True, exist_ok=True)
    state_path = home / STATE_FILE
    state = {} if force else _read_state(state_path)
    airflow_version = metadata.version("apache-airflow")

    step = time.monotonic()
    identity = _metadata_identity(env)
    migrated = (
        state.get("airflow_version") == airflow_version
        and state.get("metadata") == {k: identity[k] for k in ("database_oid", "database", "server")}
        and state.get("revision") is not None
        and state.get("revision") == identity["revision"]
        and (home / "airflow.cfg").exists()
    )
    if not migrated:
        _say(f"airflow db migrate (Airflow {airflow_version})")
        _run_airflow(env, ["db", "migrate"])
        identity = _metadata_identity(env)
        state = {
            "airflow_version": airflow_version,
            "metadata": {k: identity[k] for k in ("database_oid", "database", "server")},
            "revision": identity["revision"],
        }
        state_path.write_text(json.dumps(state, indent=2), encoding="utf-8")
    timings["airflow db migrate" if not migrated else "airflow db check"] = time.monotonic() - step

    step = time.monotonic()
    file = settings_file()
    digest = _settings_digest(env, file)
    if state.get("settings_digest") != digest:
        # Before Airflow trips over secrets it cannot decrypt (raises FernetKeyMismatch).
        fernet.check(env)
        _say(f"applying {file.name}")
        argv = [
            sys.executable,
            "-m",
            "triage_tools.deploy.airflow_settings",
            str(file.resolve()),
            "--airflow",
            shlex.join(airflow_command()),
        ]
        # From the folder holding triage_tools: `-m` finds this checkout's tools, installed or not.
        tools_root = Path(__file__).resolve().parents[1]
        result = subprocess.run(argv, env=env, cwd=tools_root, text=True, capture_output=True, check=False)
        if result.returncode != 0:
            sys.stderr.write(result.stdout + result.stderr)
            raise subprocess.CalledProcessError(result.returncode, argv)
        state["settings_digest"] = digest
        state_path.write_text(json.dumps(state, indent=2), encoding="utf-8")
    timings["airflow settings"] = time.monotonic() - step

    total = time.monotonic() - started
    if verbose or total > 5:
        _say("prepared in {:.1f}s ({})".format(total, ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())))
    return env


def reset_secrets() -> int:
    """Delete the connections and variables this deployment's Fernet key cannot open (another
    checkout's, or from before ``make clean``); the next ``prepare`` writes Triage's again."""
    env = environment()
    forgotten = fernet.forget(env)
    state_path = _airflow_home(env) / STATE_FILE
    state = _read_state(state_path)
    if state.pop("settings_digest", None) is not None:
        state_path.write_text(json.dumps(state, indent=2), encoding="utf-8")
    if forgotten:
        print(f"deleted {forgotten.describe()}: another Fernet key had encrypted them")
    else:
        print("this deployment's Fernet key opens every connection and variable: nothing deleted")
    return 0


# ---------------------------------------------------------------------------------------------
# up / stop


def _pid_file(env: Mapping[str, str]) -> Path:
    return _triage_home(env) / PID_FILE


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own child that exited) still answers kill(0).
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields and fields[0] == "Z":
            return False
    return True


def running_pid(env: Mapping[str, str]) -> int | None:
    """The pid of the standalone process ``up`` started, if it still runs."""
    try:
        pid = int(_pid_file(env).read_text().strip())
    except (OSError, ValueError):
        return None
    if not _alive(pid):
        return None
    with contextlib.suppress(OSError):  # a pid reused by something else after a reboot
        if b"standalone" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return None
    return pid


def _port_in_use(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def health(base_url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """The API server's health document, or None if it does not answer."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + HEALTH_PATH, timeout=timeout) as response:
            doc = json.loads(response.read().decode())
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError, urllib.error.URLError):
        return None


def _healthy(doc: dict[str, Any] | None, components: Sequence[str]) -> bool:
    if not doc:
        return False
    return all((doc.get(name) or {}).get("status") == "healthy" for name in components)


def _passwords_file(env: Mapping[str, str]) -> Path:
    configured = env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")
    return Path(configured) if configured else _airflow_home(env) / PASSWORDS_FILE


def login(env: Mapping[str, str]) -> dict[str, str]:
    """The SimpleAuthManager users and passwords ``airflow standalone`` generated."""
    try:
        data = json.loads(_passwords_file(env).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def base_url(env: Mapping[str, str]) -> str:
    port = env.get("AIRFLOW__API__PORT", str(API_PORT))
    return f"http://localhost:{port}"


def _print_access(env: Mapping[str, str]) -> None:
    print(f"Airflow UI: {base_url(env)}")
    users = login(env)
    for user, password in users.items():
        print(f"login: {user} / {password}   (from {_passwords_file(env)})")
    if not users:
        print(f"login: see {_passwords_file(env)}")
    print(f"logs: {_triage_home(env) / 'logs' / 'standalone.log'}")


def up(timeout: float = UP_TIMEOUT) -> int:
    """``airflow standalone`` in the background; returns once its API server and scheduler are healthy."""
    env = prepare()
    url = base_url(env)
    pid = running_pid(env)
    if pid is not None:
        print(f"Airflow is already running (pid {pid})")
        _print_access(env)
        return 0
    port = int(env.get("AIRFLOW__API__PORT", API_PORT))
    if _port_in_use(port):
        _say(f"port {port} is taken by another process (another Airflow?); stop it first")
        return 1
    logs = _triage_home(env) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / "standalone.log"
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            [*airflow_command(), "standalone"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends it and its components
        )
    _pid_file(env).write_text(f"{process.pid}\n")
    _say(f"airflow standalone started (pid {process.pid}), logs in {log_path}")
    started = time.monotonic()
    while True:
        if process.poll() is not None:
            _pid_file(env).unlink(missing_ok=True)
            _say(f"airflow standalone exited with {process.returncode}; last lines of {log_path}:")
            sys.stderr.write("".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-40:]))
            return 1
        if _healthy(health(url), ("metadatabase", "scheduler")) and login(env):
            break
        if time.monotonic() - started > timeout:
            _say(f"Airflow did not become healthy within {timeout:.0f}s; stopping it; see {log_path}")
            _kill_group(process.pid)
            process.wait()
            _pid_file(env).unlink(missing_ok=True)
            return 1
        time.sleep(1.0)
    _say(f"Airflow is up after {time.monotonic() - started:.1f}s")
    _print_access(env)
    return 0


class ComponentExited(RuntimeError):
    """A component a caller started and waits on has exited."""


@dataclass
class Processes:
    """Child processes (Airflow components, Redis, Celery workers), each the leader of its own
    process group, with its output in ``<log_dir>/<name>.log``."""

    log_dir: Path
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log_dir / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.running[name] = proc
        if name not in self.started:
            self.started.append(name)
        return proc

    def check(self) -> None:
        for name, proc in self.running.items():
            if proc.poll() is not None:
                raise ComponentExited(f"{name} exited with {proc.returncode}\n{self.logs()}")

    def logs(self, tail: int = 30) -> str:
        """The last ``tail`` lines of every component started, running or stopped."""
        parts = []
        for name in self.started:
            lines = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"==> {self.log_dir / name}.log <==\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self, names: Sequence[str], timeout: float = 30.0) -> None:
        """SIGTERM the groups of ``names`` together, SIGKILL what is left after ``timeout``."""
        procs = [self.running.pop(n) for n in names if n in self.running]
        kill_groups([p.pid for p in procs], timeout)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def _kill_group(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``timeout``."""
    kill_groups([pid], timeout)


def kill_groups(pids: Sequence[int], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process groups led by ``pids`` at once, then SIGKILL what is left after ``timeout``.

    Group leaders started by the caller must still be reaped by it (``Popen.wait``). A zombie
    leader keeps its group id alive, so such a group counts as gone once no other member lives.
    """
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if _group_alive(pid)]
        if left:
            time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if _alive(pid):
        return True
    # The leader is gone or a zombie: the group lives on only if another member does.
    with contextlib.suppress(OSError):
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pid and fields[0] != "Z":
                    return True
        return False
    return True


def stop() -> int:
    """Stop what ``up`` started (its whole process group), then the embedded PostgreSQL."""
    import warnings

    from triage.database import configured_url
    from triage.settings import triage_home
    from triage_tools import embedded

    warnings.filterwarnings("ignore", module="platformdirs")  # XDG_RUNTIME_DIR unset, from pgserver
    home = triage_home()
    pid_file = home / PID_FILE
    try:
        pid: int | None = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None and _alive(pid):
        _kill_group(pid)
        print(f"Airflow standalone stopped (pid {pid})")
    else:
        print("Airflow standalone was not running")
    pid_file.unlink(missing_ok=True)
    if configured_url() is not None:
        print("TRIAGE_DATABASE_URL is set: leaving the database server alone")
    else:
        print("embedded PostgreSQL stopped" if embedded.stop() else "embedded PostgreSQL was not running")
    return 0


# ---------------------------------------------------------------------------------------------
# CLI and dag runs


def airflow_cli(args: Sequence[str]) -> NoReturn:
    """Replace this process with ``airflow ARGS`` in the prepared environment."""
    env = prepare()
    argv = [*airflow_command(), *args]
    os.execve(argv[0], argv, env)


def json_output(stdout: str) -> Any:
    """The JSON document of an ``airflow ... -o json`` output: Airflow logs warnings to stdout too."""
    for line in reversed(stdout.splitlines()):
        stripped = line.strip()
        if stripped.startswith(("[{", "[]", "{")):
            with contextlib.suppress(ValueError):
                return json.loads(stripped)
    raise ValueError(f"no JSON document in the Airflow output: {stdout[-500:]!r}")


def start_dags_test(
    dag_id: str,
    logical_date: str,
    conf: Mapping[str, Any] | None,
    env: Mapping[str, str],
    output: IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """``airflow dags test`` in a child of its own; its output to ``output`` (a file) or, by
    default, to this process's. The caller waits for it."""
    args = ["dags", "test", dag_id, logical_date]
    if conf:
        args += ["-c", json.dumps(dict(conf))]
    if output is None:
        _say("airflow " + shlex.join(args))
        return subprocess.Popen([*airflow_command(), *args], env=dict(env))
    output.write(f"==> airflow {shlex.join(args)} <==\n".encode())
    output.flush()
    argv = [*airflow_command(), *args]
    return subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)


def dags_test(dag_id: str, logical_date: str, conf: Mapping[str, Any] | None = None,
              env: Mapping[str, str] | None = None) -> int:  # fmt: skip
    """One DAG run in this process's child (``airflow dags test``); its exit code.

    ``airflow dags test`` exits 1 ("DagRun failed") when the run ends failed, 0 when it succeeds.

    :param env: from :func:`prepare` (default: prepare now).
    """
    return start_dags_test(dag_id, logical_date, conf, dict(env) if env is not None else prepare()).wait()


DESCRIPTION = """\
The local deployment: Airflow standalone on the embedded PostgreSQL (or on
TRIAGE_DATABASE_URL), with its home under .triage/airflow (or $TRIAGE_HOME/airflow).

prepare applies the job migrations, migrates Airflow's metadata DB and applies
airflow_settings.yaml, each only when it changed since the last time.
"""


def main(argv: Sequence[str] | None = None, prog: str = "python -m triage_tools.local") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _main(argv, prog)
    except fernet.FernetKeyMismatch as exc:
        _say(str(exc))
        return 1


def _main(argv: list[str], prog: str) -> int:
    if argv and argv[0] == "airflow":  # everything after it belongs to Airflow, options included
        airflow_cli(argv[1:])
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    raw = argparse.RawDescriptionHelpFormatter
    prep = commands.add_parser(
        "prepare", help="job migrations, Airflow metadata DB, airflow_settings.yaml", formatter_class=raw,
        description="Apply the job migrations, migrate Airflow's metadata DB and apply\n"
                    "airflow_settings.yaml, each only if it changed since the last time.",
    )  # fmt: skip
    prep.add_argument("--force", action="store_true", help="migrate and apply settings even if recorded as done")
    commands.add_parser(
        "up", help="airflow standalone in the background (UI on localhost:8080)", formatter_class=raw,
        description="Prepare, then start airflow standalone in the background and wait until\n"
                    "it is healthy; prints the UI's address, the login and the log file.",
    )  # fmt: skip
    commands.add_parser(
        "stop", help="stop what up started, then the embedded PostgreSQL", formatter_class=raw,
        description="Stop what up started (its whole process group), then the embedded PostgreSQL\n"
                    "(a server of TRIAGE_DATABASE_URL is left alone).",
    )  # fmt: skip
    test = commands.add_parser(
        "dags-test", help="one in-process DAG run; exit code 1 if it failed", formatter_class=raw,
        description="One in-process DAG run (airflow dags test) on this deployment; exit code 1\n"
                    "if the run failed.",
    )  # fmt: skip
    test.add_argument("dag_id", metavar="DAG_ID")
    test.add_argument("logical_date", metavar="DATE", help="YYYY-MM-DD or an ISO timestamp")
    test.add_argument("conf", metavar="CONF", nargs="?", default="{}", help="the run conf as JSON")
    commands.add_parser("airflow", help=f"the Airflow CLI: {prog} airflow ARGS...")
    commands.add_parser(
        "reset-secrets", help="delete the connections and variables another Fernet key encrypted",
        formatter_class=raw,
        description="Delete the connections and variables that this deployment's Fernet key\n"
                    "cannot open (another checkout's, or from before make clean); the next\n"
                    "prepare writes Triage's own again.",
    )  # fmt: skip
    args = parser.parse_args(argv)
    for chatty in ("pgserver", "alembic.runtime.plugins", "alembic.runtime.migration"):
        logging.getLogger(chatty).setLevel(logging.WARNING)

    if args.command == "prepare":
        prepare(force=args.force, verbose=True)
        return 0
    if args.command == "up":
        return up()
    if args.command == "stop":
        return stop()
    if args.command == "reset-secrets":
        return reset_secrets()
    if args.command == "dags-test":
        try:
            conf = json.loads(args.conf or "{}")
        except ValueError as exc:
            parser.error(f"CONF is not valid JSON: {exc}")
        if not isinstance(conf, dict):
            parser.error("CONF must be a JSON object")
        return dags_test(args.dag_id, args.logical_date, conf)
    return 2  # pragma: no cover - argparse refuses unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
