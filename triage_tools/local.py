"""The local deployment: Airflow standalone on the embedded PostgreSQL, driven by the make targets
and the ``triage`` command.

    triage prepare                      job migrations, Airflow metadata DB, settings (if changed)
    triage up                           prepare, then ``airflow standalone`` in the background
    triage stop                         stop what ``up`` started, then the embedded PostgreSQL
    triage dags-test DAG DATE [CONF]    one in-process DAG run (``airflow dags test``)
    triage airflow ARGS...              the Airflow CLI against this deployment (``./airflow.sh``)
    triage reset-secrets                delete the connections and variables that another Fernet
                                        key encrypted (make clean)

Everything runs with :func:`triage_tools.deployment.environment` (``TRIAGE_HOME``, ``AIRFLOW_HOME``,
the metadata DB, ``AIRFLOW_CONN_TRIAGE_DB``), after :func:`triage_tools.deployment.prepare`.
``AIRFLOW__CORE__DAGS_FOLDER``, when exported, replaces the checkout's ``dags/`` (tests and
experiments point Airflow at other DAGs that way).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import psutil

from triage_tools.deploy import fernet, reconcile_user
from triage_tools.deployment import airflow_command, prepare, reset_secrets
from triage_tools.processes import alive, kill_group, port_in_use

log = logging.getLogger("triage_tools.local")

API_PORT = 8080
HEALTH_PATH = "/api/v2/monitor/health"
PID_FILE = "standalone.pid"
UP_TIMEOUT = 180.0


def _say(message: str) -> None:
    """Progress goes to stderr, so that ``./airflow.sh ... -o json`` stays parseable."""
    print(f"triage: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# environment


def _triage_home(env: Mapping[str, str]) -> Path:
    return Path(env["TRIAGE_HOME"])


# ---------------------------------------------------------------------------------------------
# up / stop


def _pid_file(env: Mapping[str, str]) -> Path:
    return _triage_home(env) / PID_FILE


def running_pid(env: Mapping[str, str]) -> int | None:
    """The pid of the standalone process ``up`` started, if it still runs."""
    try:
        pid = int(_pid_file(env).read_text().strip())
    except (OSError, ValueError):
        return None
    if not alive(pid):
        return None
    with contextlib.suppress(psutil.Error):  # a pid reused by something else after a reboot
        if "standalone" not in " ".join(psutil.Process(pid).cmdline()):
            return None
    return pid


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
    return reconcile_user.passwords_file(env)


def login(env: Mapping[str, str]) -> dict[str, str]:
    """The users people log in as and their passwords, which the API server generated into
    SimpleAuthManager's password file (never the reconcile user's: see
    :mod:`triage_tools.deploy.reconcile_user`)."""
    try:
        data = json.loads(_passwords_file(env).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return reconcile_user.human_logins({str(k): str(v) for k, v in data.items()}) if isinstance(data, dict) else {}


def admin_login(env: Mapping[str, str]) -> tuple[str, str]:
    """A user who may trigger and unpause DAGs (``admin``, else the first other one), for the
    tools that drive the API (the drill, ``make distributed``); KeyError if there is none yet."""
    users = login(env)
    user = "admin" if "admin" in users else next(iter(users))
    return user, users[user]


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
    print(
        f"reconcile_jobs reads Airflow's API as {reconcile_user.USERNAME} ({reconcile_user.SIMPLE_ROLE}), "
        f"connection {reconcile_user.CONN_ID}"
    )
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
    if port_in_use(port):
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
            kill_group(process.pid)
            process.wait()
            _pid_file(env).unlink(missing_ok=True)
            return 1
        time.sleep(1.0)
    _say(f"Airflow is up after {time.monotonic() - started:.1f}s")
    _print_access(env)
    return 0


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
    if pid is not None and alive(pid):
        kill_group(pid)
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


def dags_test_args(dag_id: str, logical_date: str, conf: Mapping[str, Any] | None) -> list[str]:
    """The arguments of ``airflow dags test`` for one run."""
    args = ["dags", "test", dag_id, logical_date]
    if conf:
        args += ["-c", json.dumps(dict(conf))]
    return args


def start_dags_test(
    dag_id: str,
    logical_date: str,
    conf: Mapping[str, Any] | None,
    env: Mapping[str, str],
    output: IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """``airflow dags test`` in a child of its own; its output to ``output`` (a file) or, by
    default, to this process's. The caller waits for it."""
    args = dags_test_args(dag_id, logical_date, conf)
    if output is None:
        _say("airflow " + shlex.join(args))
        return subprocess.Popen([*airflow_command(), *args], env=dict(env))
    output.write(f"==> airflow {shlex.join(args)} <==\n".encode())
    output.flush()
    argv = [*airflow_command(), *args]
    return subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)


def dags_test(
    dag_id: str, logical_date: str, conf: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> int:
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
    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    raw = argparse.RawDescriptionHelpFormatter
    prep = commands.add_parser(
        "prepare",
        help="job migrations, Airflow metadata DB, airflow_settings.yaml",
        formatter_class=raw,
        description="Apply the job migrations, migrate Airflow's metadata DB and apply\n"
        "airflow_settings.yaml, each only if it changed since the last time.",
    )
    prep.add_argument("--force", action="store_true", help="migrate and apply settings even if recorded as done")
    commands.add_parser(
        "up",
        help="airflow standalone in the background (UI on localhost:8080)",
        formatter_class=raw,
        description="Prepare, then start airflow standalone in the background and wait until\n"
        "it is healthy; prints the UI's address, the login and the log file.",
    )
    commands.add_parser(
        "stop",
        help="stop what up started, then the embedded PostgreSQL",
        formatter_class=raw,
        description="Stop what up started (its whole process group), then the embedded PostgreSQL\n"
        "(a server of TRIAGE_DATABASE_URL is left alone).",
    )
    test = commands.add_parser(
        "dags-test",
        help="one in-process DAG run; exit code 1 if it failed",
        formatter_class=raw,
        description="One in-process DAG run (airflow dags test) on this deployment; exit code 1\nif the run failed.",
    )
    test.add_argument("dag_id", metavar="DAG_ID")
    test.add_argument("logical_date", metavar="DATE", help="YYYY-MM-DD or an ISO timestamp")
    test.add_argument("conf", metavar="CONF", nargs="?", default="{}", help="the run conf as JSON")
    commands.add_parser("airflow", help=f"the Airflow CLI: {prog} airflow ARGS...")
    commands.add_parser(
        "reset-secrets",
        help="delete the connections and variables another Fernet key encrypted",
        formatter_class=raw,
        description="Delete the connections and variables that this deployment's Fernet key\n"
        "cannot open (another checkout's, or from before make clean); the next\n"
        "prepare writes Triage's own again.",
    )
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
