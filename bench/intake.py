"""Intake through HTTP against a bare INSERT of the same rows (issue #15).

``python -m bench intake`` (``BENCH_INTAKE_DOCS`` documents, default 20,000): concurrent clients
(``BENCH_INTAKE_CLIENTS``, default 8) post batches of 100 documents on loopback to the Triage app
served by uvicorn in a process of its own (``tests/ledger/intake_server.py``: the app as
Airflow's API server mounts it, Airflow's SimpleAuthManager checking a JWT on every request, and
its revoked-token table in a PostgreSQL metadata database as ``make up``'s;
``BENCH_INTAKE_WORKERS`` server processes, default 1 as Airflow's ``[api] workers``). Each
request is authenticated, read and validated (one pass over a valid body; per document
otherwise), its payloads stored as one fsynced pack, its jobs and outbox events registered and
answered by one statement that is its own transaction, then announced (a line in a file here:
the asset event of a real API server is a row in Airflow's metadata database, not measured; nor
is Airflow's access log middleware). Beside it, in the same run, on a database of its own: the
same rows by a bare ``INSERT`` into a copy of ``triage.jobs`` without its triggers (as
``bench/ledger.py``'s baseline: one statement per 100 rows, as many connections as clients, no
payload, no event log, no outbox, no answer). Each side posts or inserts half of the documents
twice, in the order intake, bare, bare, intake, so that a load drifting during the run weighs
on both alike. Reported: documents per second of each, their ratio
(goal >= 0.3), the acknowledgement latency of a request (p50, p99), and (on the embedded server,
whose CPU is the benchmark's alone) documents per CPU-second of each, which a loaded machine
disturbs less.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.common import Figure, scratch_database, server_cpu_seconds
from tests.ledger.intake_server import free_port, wait_listening
from triage_tools.deploy.reconcile_user import PASSWORDS_FILE_ENV, ensure_password

BATCH = 100
ROOT = Path(__file__).resolve().parents[1]


def documents() -> int:
    return int(os.environ.get("BENCH_INTAKE_DOCS", "20000"))


def clients() -> int:
    return int(os.environ.get("BENCH_INTAKE_CLIENTS", "8"))


def workers() -> int:
    return int(os.environ.get("BENCH_INTAKE_WORKERS", "1"))


def _tree_cpu(process: Any) -> float:
    """CPU seconds of a server process and its live children (uvicorn's worker processes)."""
    total = 0.0
    for proc in (process, *process.children(recursive=True)):
        try:
            total += sum(proc.cpu_times()[:2])
        except Exception:  # noqa: BLE001 - a process that exited meanwhile
            continue
    return total


def _doc(i: int, run: str) -> dict[str, Any]:
    return {
        "source": "bench",
        "external_id": f"{run}-{i}",
        "subject": f"Order {i}: refund please",
        "body": "I was charged twice for my order and would like the duplicate charge refunded. " * 4,
        "received_at": "2026-12-01T09:00:00+00:00",
        "metadata": {"queue": "billing", "priority": i % 3},
    }


@contextmanager
def _auth(home: Path, metadata: str) -> Iterator[dict[str, str]]:
    """Airflow's SimpleAuthManager as the API server runs it (an environment for the server
    process), and a JWT of a user who may trigger classify_intake. ``metadata`` is Airflow's
    metadata database (a PostgreSQL one, as ``make up``'s): every request's token is checked
    against its ``revoked_token`` table."""
    # The user's password, written before Airflow looks: SimpleAuthManager prints a password it
    # generates ("Password for user 'bench': ..."), and a bench's output holds no credentials.
    passwords = home / "simple_auth_manager_passwords.json"
    ensure_password(passwords, "bench")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "bench:user",
        PASSWORDS_FILE_ENV: str(passwords),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": "bench-jwt-secret-" + uuid.uuid4().hex + uuid.uuid4().hex,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from airflow import settings
        from airflow.api_fastapi import app as airflow_app
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
        from airflow.models.revoked_token import RevokedToken

        settings.configure_vars()
        settings.configure_orm()
        RevokedToken.__table__.create(settings.engine, checkfirst=True)
        airflow_app.purge_cached_app()
        manager = airflow_app.init_auth_manager()
        token = manager.generate_jwt(SimpleAuthManagerUser(username="bench", role="user"))
        yield {**env, "BENCH_TOKEN": str(token)}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _post_all(url: str, token: str, bodies: list[bytes], n_clients: int) -> tuple[float, list[float]]:
    """Every body posted by ``n_clients`` threads (keep-alive clients); wall seconds and each
    request's latency."""
    latencies: list[float] = []
    lock, queue = threading.Lock(), list(reversed(bodies))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    failures: list[str] = []

    def client() -> None:
        with httpx.Client(timeout=120, headers=headers) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                began = time.perf_counter()
                response = http.post(url, content=body)
                took = time.perf_counter() - began
                with lock:
                    latencies.append(took)
                    if response.status_code not in (200, 202):
                        failures.append(f"{response.status_code} {response.text[:200]}")

    seconds = _on_threads(client, n_clients)
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed, e.g. {failures[0]}")
    return seconds, latencies


def _on_threads(client: Any, n: int) -> float:
    """Seconds for ``n`` threads running ``client`` side by side, from the first start to the last end."""
    threads = [threading.Thread(target=client) for _ in range(n)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - began


def _bare_insert(url: str, run: str, n: int, n_clients: int) -> float:
    """The same rows by a bare multi-row INSERT, 100 a statement, on ``n_clients`` connections."""
    rows = [
        (f"bench/{len(f'{run}-{i}')}:{run}-{i}/{uuid.uuid4().hex}/keyword-v1", "bench", f"{run}-{i}", uuid.uuid4().hex)
        for i in range(n)
    ]
    chunks = [rows[i : i + BATCH] for i in range(0, n, BATCH)]
    lock = threading.Lock()
    sql = (
        "INSERT INTO plain.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
        " classifier_version, correlation_id, batch_key, step, status, max_attempts) VALUES "
    )

    def client() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                with lock:
                    if not chunks:
                        return
                    chunk = chunks.pop()
                values = ",".join(
                    ["(%s, %s, %s, %s, 'file:///p', 'keyword-v1', %s, 'intake', 'classify', 'queued', 4)"] * len(chunk)
                )
                params = [v for key, source, ext, sha in chunk for v in (key, source, ext, sha, key)]
                conn.execute(sql + values, params)

    return _on_threads(client, n_clients)


def run() -> list[Figure]:
    n, n_clients, n_workers = documents(), clients(), workers()
    run_id = uuid.uuid4().hex[:6]
    bodies = [
        json.dumps({"documents": [_doc(i, run_id) for i in range(b, min(b + BATCH, n))]}).encode()
        for b in range(0, n, BATCH)
    ]
    half = len(bodies) // 2
    n_first = sum(len(json.loads(b)["documents"]) for b in bodies[:half])
    with (
        tempfile.TemporaryDirectory() as tmp,
        scratch_database(migrate=False) as airflow_db,
        _auth(Path(tmp), airflow_db.airflow_metadata_url()) as env,
        scratch_database() as url,
        scratch_database() as bare_url,
    ):
        with psycopg.connect(bare_url.libpq(), autocommit=True) as conn:  # the ledger's table without its triggers
            conn.execute("CREATE SCHEMA plain")
            conn.execute("CREATE TABLE plain.jobs (LIKE triage.jobs INCLUDING ALL)")
        _bare_insert(bare_url.libpq(), "warm", 4 * BATCH, 1)
        port = free_port()
        server = subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.ledger.intake_server"),
                *(str(port), f"{tmp}/payloads", f"{tmp}/told", "--workers", str(n_workers)),
            ],
            env={**os.environ, **env, "TRIAGE_DATABASE_URL": url.libpq(), "TRIAGE_INTAKE_MAX_QUEUED": str(10 * n)},
            cwd=ROOT,
        )
        try:
            wait_listening(port)
            endpoint = f"http://127.0.0.1:{port}/triage/api/documents"
            warm = json.dumps({"documents": [_doc(i, "warm") for i in range(BATCH)]}).encode()
            # plans, caches, the first pack folder, in every worker
            _post_all(endpoint, env["BENCH_TOKEN"], [warm] * 4 * n_workers, n_workers)
            import psutil

            served = psutil.Process(server.pid)
            wall = bare = server_cpu = pg_intake = pg_bare = 0.0
            latencies: list[float] = []
            # Intake, bare, bare, intake: a load that drifts during the run (the machine is
            # shared) weighs on both sides alike, not on whichever ran second.
            for side, part in (("intake", 0), ("bare", 0), ("bare", 1), ("intake", 1)):
                pg_before, cpu_before = server_cpu_seconds(), _tree_cpu(served)
                if side == "intake":
                    took, answered = _post_all(
                        endpoint, env["BENCH_TOKEN"], bodies[half:] if part else bodies[:half], n_clients
                    )
                    wall, server_cpu = wall + took, server_cpu + _tree_cpu(served) - cpu_before
                    latencies += answered
                    pg_intake += (server_cpu_seconds() or 0) - (pg_before or 0)
                else:
                    size = n - n_first if part else n_first
                    bare += _bare_insert(bare_url.libpq(), f"{run_id}{part}", size, n_clients)
                    pg_bare += (server_cpu_seconds() or 0) - (pg_before or 0)
        finally:
            server.terminate()
            server.wait(30)
        with psycopg.connect(url.libpq()) as conn:
            registered = conn.execute("SELECT count(*) FROM triage.jobs WHERE source = 'bench'").fetchone()
        if registered != (n + BATCH,):  # every document once: the warm-up batch, then the run's
            raise RuntimeError(f"{registered} jobs registered, not {n + BATCH}")
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    details = {
        "documents": n,
        "batch": BATCH,
        "clients": n_clients,
        "requests": len(bodies),
        "server_workers": n_workers,
        "server_cpu_seconds": round(server_cpu, 2),  # the API server's processes
        "server_cpu_share": round(server_cpu / wall, 2),
    }
    figures = [
        Figure(
            "intake docs/s (HTTP, batches of 100)",
            "docs/s",
            n / wall,
            "bare INSERT of the same rows",
            n / bare,
            0.3,
            details=details,
        ),
        Figure(
            "intake ack latency p99 (batch of 100)",
            "ms",
            p99,
            "intake ack latency p50",
            p50,
            higher_is_better=False,
            details=details,
        ),
    ]
    if server_cpu_seconds() is not None:  # the embedded server: its CPU is ours
        intake_cpu, bare_cpu = server_cpu + pg_intake, pg_bare
        figures.append(
            Figure(
                "intake docs per CPU-second (API server + PG)",
                "docs/cpu-s",
                n / intake_cpu,
                "bare INSERT docs per CPU-second (PG)",
                n / bare_cpu,
                details={"intake_cpu_s": round(intake_cpu, 2), "bare_cpu_s": round(bare_cpu, 2), **details},
            )
        )
    return figures
