"""From ``POST`` to label under ``make up`` (issue #15): ``make bench-intake``, with ``make up`` running.

Not part of ``make bench``: it needs the whole deployment (API server, scheduler, DAG processor,
executor) and minutes. It posts ``BENCH_LATENCY_DOCS`` documents (default 1,000) over
``BENCH_LATENCY_SECONDS`` (default 10 s) to ``/triage/api/documents`` of the running deployment,
in requests of 10, one every 10 ms per 1,000 documents a second, as its admin user; then waits
until every job is settled (``completed``, or ``manual_review`` with a reason) and reads, from the
ledger, when each settled (its ``job_events`` row). The documents are the synthetic source's
tickets (the daily run's), most of which the keyword classifier labels. A document's latency is that moment minus the
moment its request was sent (one machine, one clock). Reported: p50 and p99 (goal: p50 under
30 s), the ack latency beside them, and how many ``classify_intake`` runs did the work; written
to ``bench/results/intake-latency.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.common import Figure

PER_REQUEST = 10
RESULTS = Path(__file__).parent / "results" / "intake-latency.json"
SETTLED = ("completed", "manual_review")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def synthetic_tickets(n: int, run: str) -> list[dict[str, Any]]:
    """``n`` tickets of the synthetic source (what a daily run classifies), as intake documents."""
    from datetime import UTC, datetime, timedelta

    from triage.contracts.documents import DocumentPayload
    from triage.sources import build_source

    start = datetime(2026, 12, 1, tzinfo=UTC)
    out = []
    for i, doc in enumerate(build_source("synthetic", documents=n, seed=7).read(start, start + timedelta(days=1))):
        payload = DocumentPayload.from_bytes(doc.content)
        received = payload.received_at.isoformat()
        out.append(
            {
                "source": "latency",
                "external_id": f"{run}-{i}",
                "subject": payload.subject,
                "body": payload.body,
                "received_at": received,
            }
        )
    return out


def main() -> int:
    from triage_tools import deployment, local

    env = deployment.environment()
    base = local.base_url(env)
    if local.health(base) is None:
        print(f"nothing answers at {base}: start `make up` first")
        return 2
    user, password = local.admin_login(env)
    token = httpx.post(f"{base}/auth/token", json={"username": user, "password": password}, timeout=60).json()
    headers = {"Authorization": f"Bearer {token['access_token']}", "Content-Type": "application/json"}
    deadline = time.monotonic() + 300  # a fresh `make up`: until the DAG processor has parsed classify_intake
    while httpx.get(f"{base}/api/v2/dags/classify_intake", headers=headers, timeout=60).status_code != 200:
        if time.monotonic() > deadline:
            print("classify_intake is not parsed after 5 minutes")
            return 2
        time.sleep(2)
    n = int(os.environ.get("BENCH_LATENCY_DOCS", "1000"))
    seconds = float(os.environ.get("BENCH_LATENCY_SECONDS", "10"))
    tickets = synthetic_tickets(n, uuid.uuid4().hex[:8])
    requests = [tickets[b : b + PER_REQUEST] for b in range(0, n, PER_REQUEST)]
    sent_at: dict[str, float] = {}
    acks: list[float] = []
    lock = threading.Lock()
    client = httpx.Client(timeout=120, headers=headers)

    def post(batch: list[dict[str, Any]]) -> None:
        began_wall, began = time.time(), time.perf_counter()
        response = client.post(f"{base}/triage/api/documents", json={"documents": batch})
        took = time.perf_counter() - began
        if response.status_code not in (200, 202):
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        with lock:
            acks.append(took)
            for entry in response.json()["documents"]:
                sent_at[entry["job_id"]] = began_wall

    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        futures = []
        for k, batch in enumerate(requests):
            time.sleep(max(0.0, start + k * seconds / len(requests) - time.perf_counter()))
            futures.append(pool.submit(post, batch))
        for future in futures:
            future.result()
    client.close()
    posted = time.perf_counter() - start

    settled_at: dict[str, float] = {}
    with psycopg.connect(deployment.job_database().libpq(), autocommit=True) as conn:
        deadline = time.monotonic() + 900
        while len(settled_at) < len(sent_at) and time.monotonic() < deadline:
            rows = conn.execute(
                "SELECT e.job_id::text, extract(epoch FROM min(e.at)) FROM triage.job_events e"
                " WHERE e.job_id = ANY(%s::uuid[]) AND e.to_status::text = ANY(%s) GROUP BY e.job_id",
                (list(sent_at), list(SETTLED)),
            ).fetchall()
            settled_at = {job: float(at) for job, at in rows}
            time.sleep(1)
        states: dict[str, int] = dict(
            conn.execute(
                "SELECT status::text, count(*) FROM triage.jobs WHERE id = ANY(%s::uuid[]) GROUP BY 1", (list(sent_at),)
            ).fetchall()
        )
        runs = conn.execute(  # the classify_intake runs whose leases moved these jobs
            "SELECT count(DISTINCT split_part(actor, '/', 2)) FROM triage.job_events"
            " WHERE job_id = ANY(%s::uuid[]) AND actor LIKE 'classify_intake/%%'",
            (list(sent_at),),
        ).fetchone()
    if len(settled_at) < len(sent_at):
        print(f"{len(sent_at) - len(settled_at)} of {len(sent_at)} documents not settled in 15 minutes")
        return 1
    latencies = [settled_at[j] - sent_at[j] for j in sent_at]
    p50, p99 = statistics.median(latencies), _percentile(latencies, 0.99)
    ack_p50, ack_p99 = statistics.median(acks) * 1000, _percentile(acks, 0.99) * 1000
    details = {
        "documents": n,
        "posted_over_s": round(posted, 1),
        "per_request": PER_REQUEST,
        "classify_intake_runs": runs[0] if runs else None,
        "states": states,
    }
    figures = [
        Figure(
            "POST-to-label p50 (make up, keyword)", "s", p50, "goal", 30.0, 1.0, higher_is_better=False, details=details
        ),
        Figure("POST-to-label p99 (make up, keyword)", "s", p99, "POST-to-label p50", p50, higher_is_better=False),
        Figure(
            "intake ack p99 (make up, 10 a request)", "ms", ack_p99, "intake ack p50", ack_p50, higher_is_better=False
        ),
    ]
    for figure in figures:
        print(figure.line())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "command": "make bench-intake",
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "figures": [dict(asdict(f), ratio=round(f.ratio, 3), ok=f.ok) for f in figures],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"results written to {RESULTS}")
    return 1 if figures[0].ok is False else 0


if __name__ == "__main__":
    raise SystemExit(main())
