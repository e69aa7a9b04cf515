"""Where the job database is, in every form the project needs it.

Users give one libpq URL (``TRIAGE_DATABASE_URL``): TCP (``postgresql://u:p@host:5432/db``) or a
socket directory (``postgresql://postgres:@/db?host=/path/to/dir``). This module is the one place
that turns it into SQLAlchemy's URL, Airflow's metadata URL and Airflow's connection JSON. The
JSON form is used for ``triage_db`` because a URI with ``?host=DIR`` loses the socket directory in
``PostgresHook.get_sqlalchemy_engine()``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import psycopg
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

ENV_DATABASE_URL = "TRIAGE_DATABASE_URL"
TRIAGE_DATABASE = "triage"
AIRFLOW_DATABASE = "airflow"


class DatabaseUrlError(ValueError):
    """The database URL cannot be understood."""


@dataclass(frozen=True, slots=True)
class DatabaseUrl:
    """A PostgreSQL location: ``host`` is a hostname or a socket directory (starts with ``/``)."""

    database: str
    user: str | None = None
    password: str | None = None
    host: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, url: str) -> DatabaseUrl:
        """Parse a libpq URL or keyword/value string."""
        if url.startswith("postgresql+"):  # a SQLAlchemy URL: drop the driver part
            url = "postgresql" + url[url.index("://") :]
        try:
            params: dict[str, Any] = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:  # any syntax problem
            raise DatabaseUrlError(f"not a PostgreSQL URL: {exc}") from None
        port = params.get("port")
        try:
            port_number = int(port) if port not in (None, "") else None
        except ValueError:
            raise DatabaseUrlError(f"port is not a number: {port!r}") from None
        return cls(
            database=str(params.get("dbname") or params.get("user") or "postgres"),
            user=params.get("user") or None,
            password=params.get("password"),
            host=params.get("host") or None,
            port=port_number,
        )

    @property
    def is_socket(self) -> bool:
        return bool(self.host and self.host.startswith("/"))

    def with_database(self, database: str) -> DatabaseUrl:
        return replace(self, database=database)

    def sqlalchemy_url(self, driver: str = "psycopg") -> sa.URL:
        """SQLAlchemy's form; a socket directory travels as the ``host`` query parameter."""
        if self.is_socket:
            return sa.URL.create(
                f"postgresql+{driver}",
                username=self.user,
                password=self.password,
                port=self.port,
                database=self.database,
                query={"host": self.host or ""},
            )
        return sa.URL.create(
            f"postgresql+{driver}",
            username=self.user,
            password=self.password,
            host=self.host,
            port=self.port,
            database=self.database,
        )

    def libpq(self) -> str:
        """A libpq URL (psql, pg_dump, ``TRIAGE_DATABASE_URL``)."""
        auth = ""
        if self.user:
            auth = quote(self.user, safe="")
            if self.password is not None:
                auth += ":" + quote(self.password, safe="")
            auth += "@"
        netloc = "" if self.is_socket else (self.host or "")
        if self.port and not self.is_socket:
            netloc += f":{self.port}"
        url = f"postgresql://{auth}{netloc}/{quote(self.database, safe='')}"
        query = []
        if self.is_socket:
            query.append(f"host={quote(self.host or '', safe='/')}")
            if self.port:
                query.append(f"port={self.port}")
        return url + ("?" + "&".join(query) if query else "")

    def airflow_metadata_url(self) -> str:
        """``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``."""
        return self.sqlalchemy_url().render_as_string(hide_password=False)

    def airflow_connection_json(self) -> str:
        """``AIRFLOW_CONN_TRIAGE_DB``: the JSON form, which keeps a socket directory."""
        conn: dict[str, Any] = {"conn_type": "postgres", "schema": self.database}
        if self.host:
            conn["host"] = self.host
        if self.port:
            conn["port"] = self.port
        if self.user:
            conn["login"] = self.user
        if self.password:
            conn["password"] = self.password
        return json.dumps(conn)

    def __repr__(self) -> str:  # never print a password
        return f"DatabaseUrl({self.libpq_redacted()!r})"

    def libpq_redacted(self) -> str:
        return replace(self, password="***" if self.password else self.password).libpq()


def configured_url() -> DatabaseUrl | None:
    """The job database from ``TRIAGE_DATABASE_URL``, or None when it is unset (the developer
    tools then start the embedded server; the product itself never does)."""
    raw = os.environ.get(ENV_DATABASE_URL, "").strip()
    return DatabaseUrl.parse(raw) if raw else None


def engine_options(**kwargs: Any) -> dict[str, Any]:
    """``kwargs`` for :func:`sqlalchemy.create_engine` with the job database's defaults; the one
    place engine options are chosen, for :func:`create_engine` and for the Airflow hook's engine
    (``triage.adapters.ledger_db.engine_from_hook``)."""
    kwargs.setdefault("pool_pre_ping", True)
    connect_args = kwargs["connect_args"] = dict(kwargs.get("connect_args") or {})
    # No server-side prepared statements: the ledger's statements take arrays through unnest,
    # and the generic plan PostgreSQL switches to after five runs misjudges their size (it
    # doubled the cost of recording outcomes, measured). Planning them costs ~0.3 ms.
    connect_args.setdefault("prepare_threshold", None)
    return kwargs


def create_engine(url: DatabaseUrl, **kwargs: Any) -> sa.Engine:
    """An engine for the job database outside Airflow (the CLI, the tools, the tests)."""
    return sa.create_engine(url.sqlalchemy_url(), **engine_options(**kwargs))
