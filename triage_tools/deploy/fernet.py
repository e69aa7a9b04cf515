"""Does the Fernet key this deployment runs with open the secrets in its Airflow metadata?

Airflow encrypts connection passwords and extras and variable values with ``[core] fernet_key``.
The local deployment keeps that key where Airflow first wrote it, ``$AIRFLOW_HOME/airflow.cfg``
under ``TRIAGE_HOME``, while with ``TRIAGE_DATABASE_URL`` the metadata lives in a server that
outlives ``TRIAGE_HOME``: after ``make clean``, or from another checkout, key and ciphertext no
longer match, ``airflow connections import`` dies with ``InvalidToken`` and a variable reads as
None. The key is deliberately not stored beside the metadata (whoever reads that database would
then read every secret in it). Instead:

- :func:`sealed_entries` reads the ciphertext (read-only SQL on Airflow's ``connection`` and
  ``variable`` tables) and names the entries a key cannot open;
- :func:`check` runs before ``airflow_settings.yaml`` is applied, with the key Airflow itself
  resolves (``airflow config get-value``), and raises :class:`FernetKeyMismatch` whose message is
  the one line an operator needs;
- :func:`forget` deletes the entries that key cannot open, so that the settings can be written
  again (``make reset-secrets``).

No Airflow import: the key comes from the Airflow CLI, the decryption from ``cryptography``.
"""

from __future__ import annotations

import configparser
import hashlib
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from triage.database import DatabaseUrl

RESET_COMMAND = "make reset-secrets"
KEY_ENV = "AIRFLOW__CORE__FERNET_KEY"
# Every way Airflow's configuration can name the key, environment first (Airflow's own order).
_KEY_SOURCES = (KEY_ENV, f"{KEY_ENV}_CMD", f"{KEY_ENV}_SECRET")


class FernetKeyMismatch(RuntimeError):
    """The metadata holds secrets this deployment's key cannot open; the message says what to do."""


@dataclass(frozen=True)
class Sealed:
    """Connection ids and variable keys whose stored secret a key does not open."""

    connections: tuple[str, ...] = ()
    variables: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.connections or self.variables)

    def describe(self) -> str:
        parts = []
        if self.connections:
            parts.append(f"connection{'s' * (len(self.connections) > 1)} {', '.join(self.connections)}")
        if self.variables:
            parts.append(f"variable{'s' * (len(self.variables) > 1)} {', '.join(self.variables)}")
        return " and ".join(parts)


def _fernet(key: str) -> MultiFernet | None:
    """Airflow's reading of ``fernet_key``: comma-separated keys, newest first; empty is no key.

    :raises FernetKeyMismatch: a key that is not a Fernet key (32 url-safe base64 bytes).
    """
    parts = [part.strip() for part in key.split(",") if part.strip()]
    if not parts:
        return None
    try:
        return MultiFernet([Fernet(part.encode()) for part in parts])
    except (ValueError, TypeError):
        # Never the key itself in the message: it is a secret.
        raise FernetKeyMismatch(
            f"the Airflow Fernet key ({KEY_ENV} or [core] fernet_key of airflow.cfg) is not a valid Fernet key"
            " (32 url-safe base64-encoded bytes); set a valid one"
        ) from None


def _opens(fernet: MultiFernet | None, token: str | None) -> bool:
    if not token:
        return True
    if fernet is None:  # Airflow without a key cannot decrypt what was encrypted
        return False
    try:
        fernet.decrypt(token.encode())
    except InvalidToken:
        return False
    return True


def _sealed(conn: psycopg.Connection[Any], fernet: MultiFernet | None, lock: bool = False) -> dict[str, list[Any]]:
    """``{table: [(id, name), ...]}`` of the rows whose encrypted fields ``fernet`` cannot open."""
    queries = {
        "connection": "SELECT id, conn_id, CASE WHEN is_encrypted THEN password END,"
        " CASE WHEN is_extra_encrypted THEN extra END FROM connection"
        " WHERE is_encrypted OR is_extra_encrypted ORDER BY conn_id, id",
        "variable": "SELECT id, key, val FROM variable WHERE is_encrypted ORDER BY key, id",
    }
    found: dict[str, list[Any]] = {table: [] for table in queries}
    for table, query in queries.items():
        if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,):
            continue  # a database Airflow has not migrated yet
        for row_id, name, *tokens in conn.execute(query + (" FOR UPDATE" if lock else "")).fetchall():
            if not all(_opens(fernet, token) for token in tokens):
                found[table].append((row_id, name))
    return found


def _as_sealed(found: dict[str, list[Any]]) -> Sealed:
    return Sealed(tuple(name for _, name in found["connection"]), tuple(name for _, name in found["variable"]))


def sealed_entries(metadata: DatabaseUrl, key: str) -> Sealed:
    """The connections and variables in the Airflow metadata database ``metadata`` that ``key``
    does not open (only encrypted fields are tried; a database Airflow never migrated has none).

    :raises FernetKeyMismatch: ``key`` is not a valid Fernet key.
    """
    fernet = _fernet(key)
    with psycopg.connect(metadata.libpq(), autocommit=True, connect_timeout=10) as conn:
        return _as_sealed(_sealed(conn, fernet))


def _airflow(env: Mapping[str, str], args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "airflow", *args]
    result = subprocess.run(argv, env=dict(env), text=True, capture_output=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-2000:])
        raise subprocess.CalledProcessError(result.returncode, ["airflow", *args])
    return result


def airflow_key(env: Mapping[str, str]) -> str:
    """The Fernet key Airflow resolves in ``env`` (environment, ``_CMD``, ``_SECRET``, airflow.cfg).

    Airflow logs warnings to stdout too; the value is the last line. Never printed or logged.
    """
    lines = _airflow(env, ["config", "get-value", "core", "fernet_key"]).stdout.strip().splitlines()
    return lines[-1].strip() if lines else ""


def key_fingerprint(env: Mapping[str, str]) -> str:
    """A digest of where the key comes from (the environment and airflow.cfg), read without
    Airflow: a change of key changes it, so that the caller checks the key again."""
    material = [env.get(name, "") for name in _KEY_SOURCES]
    parser = configparser.RawConfigParser(strict=False)
    try:
        parser.read(_config_file(env), encoding="utf-8")
        material += [parser.get("core", option, fallback="") for option in ("fernet_key", "fernet_key_cmd")]
    except (configparser.Error, OSError, UnicodeDecodeError):
        material.append("unreadable")
    return hashlib.sha256("\0".join(material).encode()).hexdigest()


def _config_file(env: Mapping[str, str]) -> Path:
    return Path(env.get("AIRFLOW_CONFIG") or Path(env.get("AIRFLOW_HOME", ".")) / "airflow.cfg")


def _metadata(env: Mapping[str, str]) -> DatabaseUrl:
    return DatabaseUrl.parse(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])


def _has_encrypted(metadata: DatabaseUrl) -> bool:
    """Whether there is anything to open at all (saves asking Airflow for its key, ~3 s)."""
    return bool(sealed_entries(metadata, ""))  # no key opens nothing encrypted


def check(env: Mapping[str, str]) -> None:
    """Refuse a metadata database whose secrets the deployment's key cannot open.

    :raises FernetKeyMismatch: with the one line that says what to do.
    """
    # Always asked (~3 s, once per application of the settings): a malformed key is refused here
    # too, before Airflow fails on it with a traceback.
    metadata = _metadata(env)
    sealed = sealed_entries(metadata, airflow_key(env))
    if sealed:
        where = f"{metadata.database} on {metadata.host or 'localhost'}"
        ours = KEY_ENV if any(env.get(name) for name in _KEY_SOURCES) else _config_file(env)
        raise FernetKeyMismatch(
            f"the Airflow metadata database {where} holds {sealed.describe()} encrypted with another"
            f" Fernet key than this deployment's (from {ours}):"
            f" set {KEY_ENV} to the key that wrote them, or run `{RESET_COMMAND}` to delete them"
            " (the next make run writes Triage's again from airflow_settings.yaml)"
        )


def forget(env: Mapping[str, str]) -> Sealed:
    """Delete the connections and variables the deployment's key cannot open; what was deleted.

    Plain SQL in one transaction, the rows locked while they are tried: Airflow's own
    ``connections delete`` decrypts a connection as it loads it and fails on exactly these rows.
    """
    metadata = _metadata(env)
    if not _has_encrypted(metadata):
        return Sealed()
    fernet = _fernet(airflow_key(env))
    with psycopg.connect(metadata.libpq(), connect_timeout=10) as conn, conn.transaction():
        found = _sealed(conn, fernet, lock=True)
        for table, rows in found.items():  # table names are the two literals of _sealed
            conn.execute(f"DELETE FROM {table} WHERE id = ANY(%s)", ([row_id for row_id, _ in rows],))
    return _as_sealed(found)
