"""Days back to back on one ledger, at PostgreSQL's level: ``python -m bench ledger-days``.

``BENCH_DAYS`` days (default 6) of ``BENCH_DAY_DOCUMENTS`` keyword documents (default 100,000),
each a fresh day of the synthetic source, registered and then classified and completed in chunks
of one transaction on one scratch ledger, as :mod:`bench.pipeline_profile` runs a day (one
process, no Airflow). After each day: the backend's CPU a document of the day's statements, the
server's CPU beside them (autovacuum, the checkpointer, the WAL writer: the whole embedded
server's CPU over the day, less the statements'), and ``pg_stat_user_tables`` of the tables a
day writes most. It traces what the real run's ten days back to back cannot tell apart: whether
the ledger's own statements cost more as the ledger grows, or the work PostgreSQL does beside
them. CPU, not seconds: the machine is shared. The CPU figures need the embedded server
(with ``TRIAGE_DATABASE_URL``: 0 and ``None``; the counters are still read).
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from bench.common import Figure, scratch_database, server_cpu_seconds
from bench.pipeline import DAY
from bench.pipeline_profile import (
    _client_cpu,
    _no_server,
    _per_doc,
    _server_cpu_by_statement,
    register_day,
    settle_day,
)
from triage.classifiers import Taxonomy, build_classifier
from triage.database import configured_url, create_engine
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.heap import freeze_long_lived
from triage.sources.synthetic import SyntheticSource

TABLES = ("jobs", "classifications", "document_labels")
STATS = sa.text(
    "SELECT relname, n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count, autoanalyze_count"
    " FROM pg_stat_user_tables WHERE schemaname = 'triage' AND relname = ANY(:tables) ORDER BY relname"
)


def _day(store: JobStore, payloads: PayloadStore, d: int, n: int) -> dict[str, Any]:
    """Day ``d``: register, then classify and complete in chunks; CPU a document of each."""
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
    start = DAY + timedelta(days=d)
    docs = list(SyntheticSource(n, seed=d + 1).read(start, start + timedelta(days=1)))
    batch = f"day-{d}"
    local = configured_url() is None  # the backend's /proc is on this machine

    def by_statement() -> Any:
        return _server_cpu_by_statement(store.engine) if local else _no_server()

    server_before = server_cpu_seconds()
    with by_statement() as registered:
        began = _client_cpu()
        register_day(store, payloads, docs, classifier.version, batch)
        register_client = _client_cpu() - began
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.7, 1))
    with by_statement() as chunks:
        began = _client_cpu()
        settle_day(store, handler, classifier.version, batch, actor="bench/ledger-days")
        chunk_client = _client_cpu() - began
    handler.close()
    statements = sum(registered.values()) + sum(chunks.values())
    server_after = server_cpu_seconds()
    beside = None if server_before is None or server_after is None else server_after - server_before - statements
    with store.engine.connect() as conn:
        stats = {row[0]: dict(row._mapping) for row in conn.execute(STATS, {"tables": list(TABLES)})}
        jobs_mb = conn.execute(sa.text("SELECT pg_total_relation_size('triage.jobs') / 1048576.0")).scalar_one()
    return {
        "day": d + 1,
        "statements_server": _per_doc(statements, n),
        "beside_server": None if beside is None else _per_doc(beside, n),
        "client": _per_doc(register_client + chunk_client, n),
        "by_statement": {k: _per_doc(v, n) for k, v in (registered + chunks).most_common(6)},
        "jobs_total_mb": round(float(jobs_mb)),
        "tables": {name: {k: v for k, v in row.items() if k != "relname"} for name, row in stats.items()},
        "load_average": os.getloadavg()[0],
    }


def ledger_days(days: int, n: int) -> list[dict[str, Any]]:
    """``days`` days of ``n`` documents on one scratch ledger; one row of figures each (see the module)."""
    out = []
    with scratch_database() as url, tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(url, pool_size=2)
        freeze_long_lived()  # as retrieve and classify tasks do before their work
        store, payloads = JobStore(engine), PayloadStore(f"{tmp}/payloads")
        for d in range(days):
            out.append(_day(store, payloads, d, n))
        engine.dispose()
    return out


def run() -> list[Figure]:
    days = int(os.environ.get("BENCH_DAYS", "6"))
    n = int(os.environ.get("BENCH_DAY_DOCUMENTS", "100000"))
    rows = ledger_days(days, n)
    return [
        Figure(
            f"server CPU a document of the day's statements, day {days} of {n // 1000}k docs a day",
            "CPU µs",
            rows[-1]["statements_server"],
            "the first day's",
            rows[0]["statements_server"],
            target_ratio=1.2,
            higher_is_better=False,
            details={"days": rows, "command": "python -m bench ledger-days", "documents_a_day": n},
        )
    ]
