"""The Airflow user of ``reconcile_jobs``' cross-check, provisioned by every deployment.

``reconcile_jobs`` asks Airflow's REST API which ``classify_documents`` task instances failed
(:mod:`triage.reconciliation.airflow_view`): it reads DAG runs and task instances of that DAG
and nothing else. It logs in as ``triage_reconcile`` through the ``airflow_api`` connection
(host = the API server, login and password for ``POST /auth/token``); that user may read and
may not trigger, clear, pause or edit anything, nor read connections or variables.

- **The local deployment** (``make up``, ``./airflow.sh``, ``make run``, ``make chaos``, ``make
  distributed``) runs Airflow's SimpleAuthManager, whose roles are fixed: ``viewer`` is the
  least of them (it reads every DAG, run, task instance, log and XCom; it cannot act, nor read
  connections, variables or the configuration). :func:`local_settings` adds
  ``triage_reconcile:viewer`` to ``[core] simple_auth_manager_users``, generates its password
  into SimpleAuthManager's password file (mode 0600) before the API server starts (so Airflow
  never generates, and never prints, one of its own), and returns the ``airflow_api``
  connection for the environment of every Airflow process (``AIRFLOW_CONN_AIRFLOW_API``).
  The password lives in that file only; ``make clean`` deletes it and the next start makes
  another.
- **docker-compose** runs the FabAuthManager: its one-shot ``airflow-init`` runs
  ``python -m triage_tools.deploy.reconcile_user fab`` (:func:`provision_fab`), which makes the
  role ``TriageReconcile`` with exactly ``can_read`` on ``DAG Runs``, ``Task Instances`` and
  ``DAG:classify_documents`` (read on runs and task instances of that DAG only: FAB checks the
  DAG's own resource too; FAB adds ``can_read`` on ``Website`` to every custom role), the user ``triage_reconcile`` with that role alone and a new random
  password at every start, and the ``airflow_api`` connection in the metadata DB (encrypted with
  the Fernet key) through ``airflow connections import``, so the password is never in a
  command line, a file of the checkout or a log.

Only :func:`provision_fab` imports Airflow (FAB's security manager, as ``airflow users`` and
``airflow roles`` do), and only inside the image.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import fcntl
import json
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from triage_tools.deploy.airflow_settings import AirflowSettings, ConnectionSetting, apply

USERNAME = "triage_reconcile"
CONN_ID = "airflow_api"
CONN_ENV = "AIRFLOW_CONN_AIRFLOW_API"
DESCRIPTION = "reconcile_jobs' cross-check: reads classify_documents' runs and task instances"

SIMPLE_ROLE = "viewer"
USERS_ENV = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"
PASSWORDS_FILE_ENV = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"  # SimpleAuthManager's default name
DEFAULT_USERS = "admin:admin"  # [core] simple_auth_manager_users' default
DEFAULT_PORT = 8080

FAB_ROLE = "TriageReconcile"
WATCHED_DAG = "classify_documents"  # triage.reconciliation.airflow_view.DAG_ID
FAB_PERMISSIONS: tuple[tuple[str, str], ...] = (
    ("can_read", "DAG Runs"),
    ("can_read", "Task Instances"),
    ("can_read", f"DAG:{WATCHED_DAG}"),
)
"""FAB checks both global resources for ``GET …/dagRuns/~/taskInstances`` (a task instance is a
run's) and the DAG's own resource for any DAG sub-entity; no other permission."""
FAB_GIVES_EVERY_ROLE: tuple[tuple[str, str], ...] = (("can_read", "Website"),)
"""What FAB itself adds to every custom role whenever the API server starts (``sync_roles``:
access to the UI's home page): left alone, not asked for."""
COMPOSE_API_URL = "http://airflow-apiserver:8080"


# ---------------------------------------------------------------------------------------------
# SimpleAuthManager (the local deployment)


def passwords_file(env: Mapping[str, str]) -> Path:
    """SimpleAuthManager's password file (``[core] simple_auth_manager_passwords_file``)."""
    configured = env.get(PASSWORDS_FILE_ENV)
    return Path(configured) if configured else Path(env["AIRFLOW_HOME"]) / PASSWORDS_FILE


def _configured_users(env: Mapping[str, str]) -> str:
    """``[core] simple_auth_manager_users`` as Airflow would read it: environment, then airflow.cfg."""
    if env.get(USERS_ENV):
        return env[USERS_ENV]
    parser = configparser.RawConfigParser()
    with contextlib.suppress(OSError, configparser.Error):
        parser.read(Path(env["AIRFLOW_HOME"]) / "airflow.cfg", encoding="utf-8")
    return parser.get("core", "simple_auth_manager_users", fallback="") or DEFAULT_USERS


def users_with_reconcile(users: str) -> str:
    """``users`` (``name:role,…``) with ``triage_reconcile:viewer`` in it, whatever it had for that name."""
    entries = [u.strip() for u in users.split(",") if u.strip() and u.split(":", 1)[0].strip() != USERNAME]
    return ",".join([*entries, f"{USERNAME}:{SIMPLE_ROLE}"])


def ensure_password(path: Path, username: str = USERNAME) -> str:
    """``username``'s password (the reconcile user's by default) in SimpleAuthManager's file,
    generated on first use: SimpleAuthManager then finds it and prints nothing.

    Written under the exclusive ``flock`` SimpleAuthManager takes on that file, in place (its
    other entries kept), and the file is made 0600 (it holds every user's password in clear)."""
    with contextlib.suppress(OSError, ValueError):
        known = json.loads(path.read_text(encoding="utf-8") or "{}")
        if isinstance(known, dict) and known.get(username):
            return str(known[username])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+", encoding="utf-8") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            passwords = json.loads(file.read().strip() or "{}")
            if not isinstance(passwords, dict):
                raise ValueError(f"{path} does not hold a JSON object")
            if not passwords.get(username):
                passwords[username] = secrets.token_urlsafe(24)
                file.seek(0)
                file.truncate()
                file.write(json.dumps(passwords) + "\n")
                file.flush()
            os.fchmod(fd, 0o600)
            return str(passwords[username])
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def api_base_url(env: Mapping[str, str]) -> str:
    """The API server of a local deployment: ``[api] base_url`` if set, else localhost and its port."""
    return env.get("AIRFLOW__API__BASE_URL") or f"http://localhost:{env.get('AIRFLOW__API__PORT', DEFAULT_PORT)}"


def api_connection(env: Mapping[str, str], password: str) -> str:
    """The ``airflow_api`` connection in Airflow's JSON form, for ``AIRFLOW_CONN_AIRFLOW_API``."""
    return json.dumps(
        {
            "conn_type": "http",
            "host": api_base_url(env),
            "login": USERNAME,
            "password": password,
            "description": DESCRIPTION,
        }
    )


def local_settings(env: Mapping[str, str]) -> dict[str, str]:
    """What the local deployment adds to its Airflow environment ``env`` (which names
    ``AIRFLOW_HOME``): the reconcile user among SimpleAuthManager's users, and the ``airflow_api``
    connection holding its password (generated now if the password file has none).

    An ``AIRFLOW_CONN_AIRFLOW_API`` already in ``env`` is kept: whoever exported it chose it."""
    settings = {USERS_ENV: users_with_reconcile(_configured_users(env))}
    if CONN_ENV not in env:
        settings[CONN_ENV] = api_connection(env, ensure_password(passwords_file(env)))
    return settings


def human_logins(passwords: Mapping[str, str]) -> dict[str, str]:
    """The users people log in as: every entry of the password file but the reconcile user."""
    return {user: password for user, password in passwords.items() if user != USERNAME}


# ---------------------------------------------------------------------------------------------
# FabAuthManager (docker-compose)


def fab_connection(api_url: str, password: str) -> ConnectionSetting:
    return ConnectionSetting(
        conn_id=CONN_ID,
        conn_type="http",
        conn_host=api_url,
        conn_login=USERNAME,
        conn_password=password,  # type: ignore[arg-type]
    )


def provision_fab(api_url: str = COMPOSE_API_URL, *, airflow: Sequence[str] = ("airflow",)) -> None:
    """Role, user and connection for a FabAuthManager deployment (idempotent; a new password each time).

    Runs with the Airflow configuration of the deployment (inside ``airflow-init``). The role
    gets exactly :data:`FAB_PERMISSIONS`: anything else found on it is removed, but for
    :data:`FAB_GIVES_EVERY_ROLE`. ``DAG:…`` is
    created here if the DAG processor has not made it yet (it makes it when it first writes the
    DAG, and leaves roles alone for a DAG without ``access_control``)."""
    from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

    password = secrets.token_urlsafe(24)
    with get_application_builder() as appbuilder:
        sm: Any = appbuilder.sm
        role = sm.add_role(FAB_ROLE)
        wanted = [sm.create_permission(action, resource) for action, resource in FAB_PERMISSIONS]
        kept = [*wanted, *(sm.get_permission(action, resource) for action, resource in FAB_GIVES_EVERY_ROLE)]
        for permission in list(role.permissions):
            if permission not in kept:
                sm.remove_permission_from_role(role, permission)
        for permission in wanted:
            sm.add_permission_to_role(role, permission)
        user = sm.find_user(username=USERNAME)
        if user is None:
            user = sm.add_user(USERNAME, "Triage", "reconcile_jobs", f"{USERNAME}@triage.invalid", role, password)
        else:
            user.roles, user.active = [role], True
            sm.update_user(user)
            sm.reset_password(user.id, password)
        if user is None:
            raise RuntimeError(f"could not create the Airflow user {USERNAME}")
    apply(AirflowSettings(connections=(fab_connection(api_url, password),)), airflow=airflow)
    print(
        f"{USERNAME}: role {FAB_ROLE} ({', '.join(f'{a} on {r}' for a, r in FAB_PERMISSIONS)}), "
        f"connection {CONN_ID} -> {api_url}",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m triage_tools.deploy.reconcile_user",
        description="Provision reconcile_jobs' Airflow API user and the airflow_api connection "
        "(FabAuthManager: docker-compose's airflow-init). The local deployment does it itself.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    fab = commands.add_parser("fab", help="role TriageReconcile, user triage_reconcile, connection airflow_api")
    fab.add_argument(
        "--api-url",
        default=os.environ.get("TRIAGE_AIRFLOW_API_URL", COMPOSE_API_URL),
        help=f"the API server as the workers reach it (default: $TRIAGE_AIRFLOW_API_URL or {COMPOSE_API_URL})",
    )
    fab.add_argument("--airflow", default="airflow", help="command running the Airflow CLI (default: airflow)")
    args = parser.parse_args(argv)
    provision_fab(args.api_url, airflow=args.airflow.split())
    return 0


if __name__ == "__main__":
    sys.exit(main())
