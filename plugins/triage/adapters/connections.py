"""What every adapter reads from Airflow's configuration: the URL an HTTP-style connection
names, a Variable, and where Airflow's own API server is."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Variable, conf


def api_server_url() -> str:
    """Airflow's API server where no connection names it (alert links, reconcile_jobs'
    cross-check): ``[api] base_url``, else localhost at ``[api] port`` (Airflow's default 8080).
    A server moved with ``AIRFLOW__API__PORT`` is then found on its port, not on 8080."""
    base = str(conf.get("api", "base_url", fallback="") or "").rstrip("/")
    return base or f"http://localhost:{conf.getint('api', 'port', fallback=8080)}"


def http_url(conn: Any, *, default_path: str = "", default_port: int | None = None) -> str:
    """The URL an HTTP-style connection names, in every form Airflow gives one.

    A whole URL in ``host`` (the JSON form) is taken exactly as it is (a trailing ``/`` may
    matter to the endpoint). Otherwise: the scheme is
    ``schema`` when that is ``http``/``https``, else ``https`` for an ``https`` connection type,
    else extra ``scheme``, else ``http``; then host and port; the path is ``schema`` when that
    is not a scheme (the URI form ``http://h:8000/labels`` puts it there), else extra ``path``,
    else ``default_path``.
    """
    host = conn.host or ""
    if "://" in host:
        return str(host)
    host = host.rstrip("/")
    extra = conn.extra_dejson or {}
    schema = conn.schema or ""
    if schema in ("http", "https"):
        scheme, path = schema, extra.get("path", default_path)
    else:
        scheme = "https" if conn.conn_type == "https" else str(extra.get("scheme", "http"))
        path = schema or extra.get("path", default_path)
    port = conn.port or default_port
    return f"{scheme}://{host}{f':{port}' if port else ''}" + (f"/{str(path).lstrip('/')}" if path else "")


def variable(name: str) -> str | None:
    """An Airflow Variable, or None when it is not set."""
    value = Variable.get(name, default=None)
    return str(value) if value not in (None, "") else None
