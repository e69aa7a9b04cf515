"""Where a document's time goes, end to end: ``python -m bench pipeline-profile``.

One process, one thread, no overlap (so each microsecond has one owner): ``BENCH_PROFILE_N``
keyword documents (default 50,000) generated, their payloads stored and their jobs registered
(:func:`triage.pipeline.retrieve.to_new_jobs` and ``JobStore.register``, chunks of 5,000, as
retrieval does), then classified and completed in chunks of one transaction (``JobStore.chunks``,
1,000 a chunk, as a classify task's first try does). For each part: this process's CPU per
document (``getrusage``), and the CPU of the PostgreSQL backend per statement (its
``/proc/<pid>/stat`` before and after each statement, summed by statement: the embedded server
runs on this machine; left out with ``TRIAGE_DATABASE_URL``). Beside it the naive script of the
same documents (:func:`bench.pipeline.naive_seconds`), whose CPU is this process's and its
backend's too. CPU, not wall time: the machine is shared, and a document's CPU moves less with the
load than its seconds.

The figure is the machine's CPU per document of the ledger's day against the naive script's. The
naive script runs on one core, the day's stages on two: 0.5 of the naive script's rate (issue
#29) needs the ledger's CPU a document within four times the naive script's, with both cores
busy the whole run (2 × naive / ledger is the ratio's ceiling). A cost both pay (generating and
parsing a document, the keyword classifier) lowers that ceiling when cut; only the ledger's own
work raises it.
"""

from __future__ import annotations

import os
import re
import resource
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from bench.common import Figure, scratch_database
from bench.pipeline import DAY, NAIVE_SCHEMA, _naive
from triage.classifiers import Taxonomy, build_classifier
from triage.database import configured_url, create_engine
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.heap import freeze_long_lived
from triage.pipeline.retrieve import to_new_jobs
from triage.sources.base import SourceDocument
from triage.sources.synthetic import SyntheticSource

REGISTER_CHUNK, CLASSIFY_CHUNK = 5000, 1000
TICKS = os.sysconf("SC_CLK_TCK")


def documents() -> int:
    return int(os.environ.get("BENCH_PROFILE_N", "50000"))


def _client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _backend_cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115 - a read of /proc
    return (int(fields[11]) + int(fields[12])) / TICKS


def _statement_name(sql: str) -> str:
    """What a statement writes or reads first: ``INSERT INTO triage.classifications``, ``WITH done``."""
    flat = " ".join(sql.split())
    found = re.search(r"(INSERT INTO \S+|UPDATE \S+|DELETE FROM \S+|WITH \w+|SELECT \S+)", flat)
    return (found.group(1) if found else flat[:40]).rstrip(",")


@contextmanager
def _server_cpu_by_statement(engine: sa.Engine) -> Iterator[Counter[str]]:
    """CPU seconds of the backend per statement name while the block runs (ticks of 10 ms:
    right in the sum over many statements, not for one)."""
    spent: Counter[str] = Counter()

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        pid = conn.connection.dbapi_connection.info.backend_pid
        conn.info["bench_backend"] = (pid, _backend_cpu(pid))

    def after(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        pid, began = conn.info.pop("bench_backend")
        spent[_statement_name(statement)] += _backend_cpu(pid) - began

    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)
    try:
        yield spent
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)
        sa.event.remove(engine, "after_cursor_execute", after)


def _per_doc(seconds: float, n: int) -> float:
    return round(seconds * 1e6 / n, 1)


def register_day(
    store: JobStore, payloads: PayloadStore, docs: Sequence[SourceDocument], version: str, batch_key: str
) -> None:
    """Store and register ``docs`` as retrieve does, :data:`REGISTER_CHUNK` at a time."""
    for i in range(0, len(docs), REGISTER_CHUNK):
        new = to_new_jobs(docs[i : i + REGISTER_CHUNK], payloads, version)
        store.register(new, batch_key=batch_key, step="classify", max_attempts=3, actor="retrieve")


def settle_day(store: JobStore, handler: ClassifyHandler, version: str, batch_key: str, *, actor: str) -> None:
    """Classify and complete the batch's jobs in chunks of one transaction, as a keyword task's first try."""
    while store.chunks.settle(
        batch_key=batch_key,
        step="classify",
        classifier_version=version,
        limit=CLASSIFY_CHUNK,
        actor=actor,
        decide=handler.handle,
        lease_seconds=300,
    ).jobs:
        pass


def profile(n: int) -> dict[str, Any]:
    """The parts of a day of ``n`` documents, CPU µs a document each (see the module)."""
    local = configured_url() is None
    parts: dict[str, Any] = {}
    with scratch_database() as url, tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(url, pool_size=2)
        store = JobStore(engine)
        classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
        payloads = PayloadStore(f"{tmp}/payloads")

        freeze_long_lived()  # as retrieve and classify tasks do before their work
        began = _client_cpu()
        docs = list(SyntheticSource(n, seed=1).read(DAY, DAY + timedelta(days=1)))
        parts["generate"] = {"client": _per_doc(_client_cpu() - began, n)}

        with _server_cpu_by_statement(engine) if local else _no_server() as server:
            began = _client_cpu()
            register_day(store, payloads, docs, classifier.version, "profile")
            parts["store and register"] = _part(_client_cpu() - began, server, n)

        handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.7, 1))
        with _server_cpu_by_statement(engine) if local else _no_server() as server:
            began = _client_cpu()
            settle_day(store, handler, classifier.version, "profile", actor="bench/profile")
            parts["classify and complete in chunks"] = _part(_client_cpu() - began, server, n)
        handler.close()

        with engine.begin() as conn:
            for statement in NAIVE_SCHEMA:
                conn.execute(sa.text(statement))
        with _server_cpu_by_statement(engine) if local else _no_server() as server:
            began, wall = _client_cpu(), time.perf_counter()
            _naive(engine, classifier, n)
            parts["naive script"] = {**_part(_client_cpu() - began, server, n), "seconds": time.perf_counter() - wall}
        engine.dispose()
    return parts


@contextmanager
def _no_server() -> Iterator[Counter[str]]:
    yield Counter()


def _part(client: float, server: Counter[str], n: int) -> dict[str, Any]:
    return {
        "client": _per_doc(client, n),
        "server": _per_doc(sum(server.values()), n),
        "server_by_statement": {k: _per_doc(v, n) for k, v in server.most_common() if v > 0},
    }


def run() -> list[Figure]:
    n = documents()
    parts = profile(n)
    ledger = sum(p["client"] + p.get("server", 0.0) for name, p in parts.items() if name != "naive script")
    naive = parts["naive script"]["client"] + parts["naive script"]["server"]
    return [
        Figure(
            f"machine CPU a document, the day's stages, keyword, {n // 1000}k docs",
            "CPU µs",
            round(ledger, 1),
            "the naive script's",
            naive,
            target_ratio=None,
            higher_is_better=False,
            details={
                "parts_cpu_us_per_document": parts,
                "ceiling_of_end_to_end_vs_naive": round(2 * naive / ledger, 3),
                "documents": n,
                "command": "python -m bench pipeline-profile",
                "load_average": os.getloadavg(),
            },
        )
    ]
