"""The ledger's cost: registration and claim/complete against bare SQL on a table without
triggers (``LIKE triage.jobs INCLUDING ALL``: same columns, constraints and indexes)."""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import sqlalchemy as sa
from uuid6 import uuid7

from bench.common import Figure, scratch_database, server_cpu_seconds, timed
from tests.ledger.helpers import new_jobs
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Complete, NewJob

REGISTER_N = 100_000
CLAIM_N = 30_000
CHUNK = 5_000
CLAIM_BATCH = 1_000
VERSION = new_jobs(1)[0].classifier_version
"""The version the jobs are registered for: the ledger's claims are fenced on it, as classify's are."""

PLAIN_INSERT = sa.text("""
INSERT INTO plain.jobs (id, idempotency_key, source, external_id, content_sha256, payload_ref, classifier_version,
                        correlation_id, batch_key, step, status, status_reason, max_attempts)
SELECT id, key, src, ext, sha, ref, ver, corr, :batch, 'classify', 'queued', 'registered', 3
FROM unnest(CAST(:ids AS uuid[]), CAST(:keys AS text[]), CAST(:srcs AS text[]), CAST(:exts AS text[]),
            CAST(:shas AS text[]), CAST(:refs AS text[]), CAST(:vers AS text[]), CAST(:corrs AS text[]))
     AS t(id, key, src, ext, sha, ref, ver, corr)
ON CONFLICT (idempotency_key) DO NOTHING
""")
PLAIN_CLAIM = sa.text("""
WITH picked AS (SELECT id FROM plain.jobs WHERE batch_key = :batch AND step = 'classify' AND status = 'queued'
                ORDER BY next_attempt_at LIMIT :n FOR UPDATE SKIP LOCKED)
UPDATE plain.jobs j SET status = 'running', attempt = attempt + 1, lease_owner = 'bench', lease_token = :token,
       lease_expires_at = now() + interval '60 seconds', updated_at = now()
FROM picked WHERE j.id = picked.id RETURNING j.id, j.attempt
""")
PLAIN_COMPLETE = sa.text("""
UPDATE plain.jobs SET status = 'completed', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       updated_at = now()
WHERE id = ANY(CAST(:ids AS uuid[])) AND lease_token = :token AND status = 'running'
""")


def _plain_params(jobs: list[NewJob], batch: str) -> dict[str, object]:
    return {
        "batch": batch,
        "ids": [uuid7() for _ in jobs],
        "keys": [j.idempotency_key for j in jobs],
        "srcs": [j.source for j in jobs],
        "exts": [j.external_id for j in jobs],
        "shas": [j.content_sha256 for j in jobs],
        "refs": [j.payload_ref for j in jobs],
        "vers": [j.classifier_version for j in jobs],
        "corrs": [j.idempotency_key for j in jobs],
    }


def _cpu_timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall seconds, CPU seconds (this process's and the server's: what a loaded machine disturbs
    less than the wall clock; the figure stays the wall clock's), and the result of ``fn``."""
    own, server = time.process_time(), server_cpu_seconds() or 0.0
    wall, result = timed(fn)
    return wall, time.process_time() - own + (server_cpu_seconds() or 0.0) - server, result


def _prepare(url: DatabaseUrl) -> tuple[sa.Engine, JobStore]:
    engine = create_engine(url, pool_size=2)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA plain"))
        conn.execute(sa.text("CREATE TABLE plain.jobs (LIKE triage.jobs INCLUDING ALL)"))
    return engine, JobStore(engine)


def bench_register() -> Figure:
    with scratch_database() as url:
        engine, store = _prepare(url)
        docs = new_jobs(REGISTER_N, prefix="reg")
        chunks = [docs[i : i + CHUNK] for i in range(0, REGISTER_N, CHUNK)]

        def plain_register() -> None:
            for chunk in chunks:
                with engine.begin() as conn:
                    conn.execute(PLAIN_INSERT, _plain_params(chunk, "reg"))

        def ledger_register() -> None:
            for chunk in chunks:
                store.register(chunk, batch_key="reg", step="classify", max_attempts=3)

        base_s, base_cpu, _ = _cpu_timed(plain_register)
        ours_s, ours_cpu, _ = _cpu_timed(ledger_register)
        engine.dispose()
    return Figure(
        "register documents (job + outbox + event log)",
        "rows/s",
        REGISTER_N / ours_s,
        "bare INSERT…unnest ON CONFLICT",
        REGISTER_N / base_s,
        target_ratio=0.5,
        details={"rows": REGISTER_N, "chunk": CHUNK, "cpu_seconds": {"ours": ours_cpu, "bare": base_cpu}},
    )


def bench_claim_complete(rounds: int = 2) -> list[Figure]:
    """Both tables hold the same jobs; the loops alternate ``rounds`` times on fresh batches and
    the median rate of each is kept, so a noisy moment hits all of them: the bare loop, the
    ledger's lease (claim, then record: the llm path, and every retry), and the ledger's chunk
    claimed and completed in one transaction (keyword and learned on a first try,
    :mod:`triage.pipeline.one_transaction`)."""
    with scratch_database() as url:
        engine, store = _prepare(url)
        for r in range(rounds):
            docs = new_jobs(CLAIM_N, prefix=f"claim{r}")
            for i in range(0, CLAIM_N, CHUNK):
                store.register(docs[i : i + CHUNK], batch_key=f"claim{r}", step="classify", max_attempts=3)
                chunk_docs = new_jobs(CHUNK, prefix=f"chunk{r}-{i}")
                store.register(chunk_docs, batch_key=f"chunk{r}", step="classify", max_attempts=3)
                with engine.begin() as conn:
                    conn.execute(PLAIN_INSERT, _plain_params(docs[i : i + CHUNK], f"claim{r}"))
        with engine.begin() as conn:
            conn.execute(sa.text("ANALYZE"))

        def plain_claim_complete(batch: str) -> int:
            done = 0
            while True:
                token = uuid.uuid4()
                with engine.begin() as conn:
                    rows = conn.execute(PLAIN_CLAIM, {"batch": batch, "n": CLAIM_BATCH, "token": token}).all()
                if not rows:
                    return done
                with engine.begin() as conn:
                    conn.execute(PLAIN_COMPLETE, {"ids": [r.id for r in rows], "token": token})
                done += len(rows)

        def ledger_claim_complete(batch: str) -> int:
            done = 0
            while True:
                claim = store.claim(
                    batch_key=batch,
                    step="classify",
                    limit=CLAIM_BATCH,
                    lease_seconds=60,
                    owner="bench",
                    classifier_version=VERSION,
                )
                if not claim.jobs:
                    return done
                store.record(claim, [Complete(j.id, j.attempt) for j in claim.jobs])
                done += len(claim.jobs)

        def ledger_in_chunks(batch: str) -> int:
            done = 0
            while True:
                chunk = store.chunks.settle(
                    batch_key=batch,
                    step="classify",
                    classifier_version=VERSION,
                    limit=CLAIM_BATCH,
                    actor="bench",
                    decide=lambda jobs: [Complete(j.id, j.attempt) for j in jobs],
                    lease_seconds=60,
                )
                if not chunk.jobs:
                    return done
                done += len(chunk.jobs)

        base, ours, base_cpu, ours_cpu, chunks, chunks_cpu = [], [], [], [], [], []
        for r in range(rounds):
            seconds, cpu, n = _cpu_timed(partial(plain_claim_complete, f"claim{r}"))
            assert n == CLAIM_N
            base.append(n / seconds)
            base_cpu.append(round(cpu, 3))
            seconds, cpu, n = _cpu_timed(partial(ledger_claim_complete, f"claim{r}"))
            assert n == CLAIM_N
            ours.append(n / seconds)
            ours_cpu.append(round(cpu, 3))
            seconds, cpu, n = _cpu_timed(partial(ledger_in_chunks, f"chunk{r}"))
            assert n == CLAIM_N
            chunks.append(n / seconds)
            chunks_cpu.append(round(cpu, 3))
        engine.dispose()
    leased = Figure(
        "claim + complete (fenced, logged, outbox)",
        "jobs/s",
        statistics.median(ours),
        "bare SKIP LOCKED claim + complete",
        statistics.median(base),
        target_ratio=0.5,
        details={
            "jobs": CLAIM_N,
            "claim_batch": CLAIM_BATCH,
            "rounds": rounds,
            "ours": [round(x) for x in ours],
            "bare": [round(x) for x in base],
            "cpu_seconds": {"ours": ours_cpu, "bare": base_cpu},
        },
    )
    in_chunks = Figure(
        "claim + classify + complete in one transaction (keyword, learned)",
        "jobs/s",
        statistics.median(chunks),
        "bare SKIP LOCKED claim + complete",
        statistics.median(base),
        target_ratio=0.6,
        details={
            "jobs": CLAIM_N,
            "chunk": CLAIM_BATCH,
            "rounds": rounds,
            "ours": [round(x) for x in chunks],
            "bare": [round(x) for x in base],
            "cpu_seconds": {"ours": chunks_cpu, "bare": base_cpu},
        },
    )
    return [leased, in_chunks]


def run() -> list[Figure]:
    return [bench_register(), *bench_claim_complete()]
