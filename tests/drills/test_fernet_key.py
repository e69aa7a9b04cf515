"""``make run`` on Airflow metadata that another Fernet key encrypted (issue #11, item 16).

With ``TRIAGE_DATABASE_URL`` the metadata lives in a server that outlives ``TRIAGE_HOME``, where
Airflow keeps its key (``airflow.cfg``): after ``make clean``, or from another checkout, the key
is new and the secrets in the metadata are not its own. ``airflow connections import`` used to
die there with ``cryptography.fernet.InvalidToken`` and a traceback; now ``prepare`` refuses in
one line that says what to do, and both ways out it names work.

Real embedded PostgreSQL, real Airflow CLI (``python -m triage_tools.local`` in a child, as the make
targets run it); the metadata is written once with key A by a first deployment home.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml
from cryptography.fernet import Fernet

from tests.conftest import ServerHomes
from triage.database import DatabaseUrl
from triage_tools.deploy.fernet import KEY_ENV, RESET_COMMAND, FernetKeyMismatch, Sealed, sealed_entries

ROOT = Path(__file__).resolve().parents[2]


def _settings_secrets() -> Sealed:
    """What airflow_settings.yaml writes encrypted: every connection but the job database's
    (triage_db, triage_db_review, triage_db_maintenance: in the environment, so skipped) and every
    variable, read from the file so that a new entry is covered without editing this test."""
    settings = yaml.safe_load((ROOT / "airflow_settings.yaml").read_text())["airflow"]
    connections = sorted(c["conn_id"] for c in settings["connections"] if not c["conn_id"].startswith("triage_db"))
    return Sealed(tuple(connections), tuple(sorted(v["variable_name"] for v in settings["variables"])))


TRIAGE_SECRETS = _settings_secrets()

pytestmark = pytest.mark.slow  # about twenty Airflow CLI processes


@dataclass
class Metadata:
    url: DatabaseUrl
    env: dict[str, str]  # the make targets' environment, without TRIAGE_HOME
    key_a: str  # the key of the first deployment home, which wrote the secrets


def local(env: dict[str, str], home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``python -m triage_tools.local ARGS`` (``make up``'s and ``./airflow.sh``'s first step is ``prepare``)."""
    return python(env, home, "triage_tools.local", *args, **extra)


def python(env: dict[str, str], home: Path, module: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env={**env, "TRIAGE_HOME": str(home), **extra},
        cwd=ROOT,
        text=True,
        capture_output=True,
        check=False,
        timeout=600,
    )


@pytest.fixture(scope="module")
def metadata(pg_server: DatabaseUrl, template_db: str, server_homes: ServerHomes) -> Iterator[Metadata]:
    suffix = uuid.uuid4().hex[:10]
    metadata_db, jobs_db = f"airflow_fernet_{suffix}", f"triage_fernet_{suffix}"
    with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{metadata_db}"')
        conn.execute(f'CREATE DATABASE "{jobs_db}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
    url = pg_server.with_database(metadata_db)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRIAGE_"))}
    env.update(
        PYTHONPATH=str(ROOT / "plugins"),
        TRIAGE_DATABASE_URL=pg_server.with_database(jobs_db).libpq(),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=url.airflow_metadata_url(),
    )
    homes: list[Path] = []
    try:
        first = server_homes.make("fernet-a")
        homes.append(first)
        done = local(env, first, "prepare")
        assert done.returncode == 0, done.stderr
        parser = configparser.RawConfigParser()
        parser.read(first / "airflow" / "airflow.cfg")
        yield Metadata(url=url, env=env, key_a=parser.get("core", "fernet_key"))
    finally:
        with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{metadata_db}" WITH (FORCE)')
            conn.execute(f'DROP DATABASE IF EXISTS "{jobs_db}" WITH (FORCE)')
        for home in homes:
            server_homes.remove(home)


@pytest.fixture
def new_home(server_homes: ServerHomes) -> Iterator[Path]:
    """A deployment home as after ``make clean``: no airflow.cfg, so Airflow makes a new key."""
    home = server_homes.make("fernet-new")
    yield home
    server_homes.remove(home)


@pytest.mark.parametrize(
    ("key", "sealed"),
    [
        pytest.param("{a}", Sealed(), id="the-key-that-wrote-them"),
        pytest.param("{new}", TRIAGE_SECRETS, id="another-key"),
        pytest.param("{new},{a}", Sealed(), id="a-rotation-list-with-the-old-key"),
        pytest.param("", TRIAGE_SECRETS, id="no-key"),
    ],
)
def test_the_entries_a_key_cannot_open_are_named(metadata: Metadata, key: str, sealed: Sealed) -> None:
    # Placeholders no Fernet key can contain: a new key holds an "A" about every other time.
    given = key.format(new=Fernet.generate_key().decode(), a=metadata.key_a)
    assert sealed_entries(metadata.url, given) == sealed


def test_a_malformed_key_is_refused_without_saying_it(metadata: Metadata) -> None:
    with pytest.raises(FernetKeyMismatch, match="not a valid Fernet key") as raised:
        sealed_entries(metadata.url, "not-a-key-at-all")
    assert "not-a-key-at-all" not in str(raised.value)


def test_a_new_key_on_old_metadata_stops_with_one_line_saying_what_to_do(metadata: Metadata, new_home: Path) -> None:
    done = python(metadata.env, new_home, "triage_tools.run", "--date", "2026-11-01")  # what make run runs

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "InvalidToken" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if "Fernet" in line]
    assert line.startswith("make run: the Airflow metadata database ")
    assert KEY_ENV in line
    assert f"`{RESET_COMMAND}`" in line
    assert "connection triage_llm" in line
    assert str(new_home / "airflow" / "airflow.cfg") in line  # where the new key is
    assert "applying airflow_settings.yaml" not in done.stderr  # refused before, nothing half-written
    assert sealed_entries(metadata.url, metadata.key_a) == Sealed()


def test_the_old_key_in_the_environment_opens_them(metadata: Metadata, new_home: Path) -> None:
    done = local(metadata.env, new_home, "prepare", **{KEY_ENV: metadata.key_a})

    assert done.returncode == 0, done.stderr
    assert sealed_entries(metadata.url, metadata.key_a) == Sealed()


def test_reset_secrets_deletes_what_the_key_cannot_open_and_the_next_run_writes_them_again(
    metadata: Metadata, new_home: Path
) -> None:
    reset = local(metadata.env, new_home, "reset-secrets")

    assert reset.returncode == 0, reset.stderr
    assert "deleted connection triage_llm and variables" in reset.stdout
    parser = configparser.RawConfigParser()
    parser.read(new_home / "airflow" / "airflow.cfg")
    new_key = parser.get("core", "fernet_key")
    assert sealed_entries(metadata.url, "") == Sealed()  # nothing encrypted is left

    done = local(metadata.env, new_home, "prepare")

    assert done.returncode == 0, done.stderr
    assert sealed_entries(metadata.url, new_key) == Sealed()
    assert sealed_entries(metadata.url, "") == TRIAGE_SECRETS  # written again, with the new key
