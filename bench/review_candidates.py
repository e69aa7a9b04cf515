"""What the candidate labels cost (issue #27, item 6): the classify step's write, and the queue
least sure first.

``python -m bench candidates``:

- **insert cost**: ``BENCH_CANDIDATE_JOBS`` jobs (default 10,000) completed in claims of 1,000 by
  :meth:`~triage.jobs.store.JobStore.record`, each with its classification (the classify step's
  one transaction per claim: the jobs moved, their events, classifications and labels), once with
  three candidates per classification and once with none (the write as it was before
  ``classifications.candidates``, and as an LLM's answers still are), alternating rounds, the
  fastest round of each compared;
- **the queue least sure first**: ``BENCH_REVIEWS`` open reviews (default 100,000), each with a
  model answer of three candidates, paged by :func:`triage.jobs.sql.reads.review_uncertainty.uncertain_page`
  (50 rows) at the head, deep (a cursor half-way) and for one reason, beside the default order's
  head page; each with its ``EXPLAIN (ANALYZE, BUFFERS)`` plan in the details.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from typing import Any

import sqlalchemy as sa

from bench.common import Figure, scratch_database
from bench.review_queue import median_ms
from tests.ledger.helpers import new_jobs
from triage.database import create_engine
from triage.jobs.sql.reads.review_queue import QueueFilter, queue_page
from triage.jobs.sql.reads.review_uncertainty import uncertain_page, uncertainty_statement
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClassificationRecord, Complete, LabelWrite, SendToReview

CLAIM = 1_000
PAGE = 50
LABELS = ("billing", "shipping", "refund_request", "account_access", "general_inquiry")


def jobs() -> int:
    return int(os.environ.get("BENCH_CANDIDATE_JOBS", "10000"))


def reviews() -> int:
    return int(os.environ.get("BENCH_REVIEWS", "100000"))


def _candidates(rng: random.Random) -> tuple[tuple[str, float], ...]:
    first, second, third = rng.sample(LABELS, 3)
    a = round(rng.uniform(0.34, 0.95), 4)
    b = round(rng.uniform(0.0, 1.0 - a), 4)
    return ((first, a), (second, min(a, b)), (third, round(max(0.0, 1.0 - a - b) / 2, 4)))


def _record_ms(store: JobStore, batch: str, n: int, with_candidates: bool, rng: random.Random) -> float:
    """Register ``n`` jobs of ``batch`` (untimed), then complete them claim by claim: the
    milliseconds spent in ``record``."""
    store.register(new_jobs(n, prefix=batch), batch_key=batch, step="classify", max_attempts=3)
    spent = 0.0
    while True:
        claim = store.claim(batch_key=batch, step="classify", limit=CLAIM, lease_seconds=300, owner="bench")
        if not claim.jobs:
            return spent
        outcomes = []
        for job in claim.jobs:
            candidates = _candidates(rng) if with_candidates else None
            label, confidence = candidates[0] if candidates else ("billing", 0.9)
            record = ClassificationRecord(
                label, confidence, "accepted", "bench-v1", latency_ms=0.1, candidates=candidates
            )
            outcomes.append(Complete(job.id, job.attempt, LabelWrite(label, confidence, "bench-v1"), record))
        started = time.perf_counter()
        store.record(claim, outcomes)
        spent += (time.perf_counter() - started) * 1000.0


def bench_insert_cost(rounds: int = 5) -> Figure:
    n = jobs()
    rng = random.Random(27)
    with scratch_database() as url:
        engine = create_engine(url, pool_size=2)
        store = JobStore(engine)
        _record_ms(store, "warm", CLAIM, True, rng)  # plans, caches, the first partitions
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):
            for with_candidates in (r % 2 == 0, r % 2 != 0):  # alternate which goes first
                batch = f"b{r}-{'c' if with_candidates else 'n'}"
                times[with_candidates].append(_record_ms(store, batch, n, with_candidates, rng))
        engine.dispose()
    # The fastest round of each: on a shared machine the slower rounds measure the neighbours.
    with_c, without = min(times[True]), min(times[False])
    return Figure(
        f"classify write of {n:,} jobs with 3 candidates",
        "ms",
        with_c,
        "the same write without candidates",
        without,
        target_ratio=1.1,
        higher_is_better=False,
        details={
            "jobs": n,
            "claim": CLAIM,
            "rounds_ms_with": [round(t, 1) for t in times[True]],
            "rounds_ms_without": [round(t, 1) for t in times[False]],
            "median_ms_with": round(statistics.median(times[True]), 1),
            "median_ms_without": round(statistics.median(times[False]), 1),
            "us_per_job_with": round(with_c * 1000 / n, 2),
            "us_per_job_without": round(without * 1000 / n, 2),
        },
    )


def _fill_reviews(store: JobStore, n: int, rng: random.Random) -> None:
    """``n`` open reviews in claims of 5,000, every other claim of reason ``retries_exhausted``."""
    for b in range(0, n, 5_000):
        batch = f"review-{b // 5_000:04d}"
        size = min(5_000, n - b)
        store.register(new_jobs(size, prefix=batch), batch_key=batch, step="classify", max_attempts=3)
        claim = store.claim(batch_key=batch, step="classify", limit=size, lease_seconds=600, owner="bench")
        reason = "retries_exhausted" if b // 5_000 % 2 else "inconclusive"
        outcomes = []
        for job in claim.jobs:
            candidates = _candidates(rng)
            record = ClassificationRecord(
                candidates[0][0], candidates[0][1], "inconclusive", "bench-v1", candidates=candidates
            )
            outcomes.append(SendToReview(job.id, job.attempt, reason, classification=record))
        store.record(claim, outcomes)


def _explain(engine: sa.Engine, where: QueueFilter, after: Any) -> list[str]:
    params: dict[str, Any] = {k: getattr(where, k) for k in where.given()}
    params["limit"] = PAGE + 1
    if after is not None:
        params["after_uncertainty"], params["after_at"], params["after_id"] = after
    compiled = uncertainty_statement(where.given(), after is not None).compile(dialect=engine.dialect)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS) " + str(compiled), compiled.construct_params(params)
        ).all()
    return [r[0] for r in rows]


def bench_uncertainty_page() -> Figure:
    n = reviews()
    rng = random.Random(6)
    with scratch_database() as url:
        engine = create_engine(url, pool_size=2)
        store = JobStore(engine)
        started = time.perf_counter()
        _fill_reviews(store, n, rng)
        fill_s = time.perf_counter() - started
        with engine.begin() as conn:
            conn.execute(sa.text("ANALYZE"))
        with engine.connect() as conn:  # a cursor half-way down the queue: where a deep page starts
            deep_after = None
            for _ in range(n // 2 // 500):
                deep_after = uncertain_page(conn, QueueFilter(), limit=500, after=deep_after).next_after
        variants = {
            "head": (QueueFilter(), None),
            "deep": (QueueFilter(), deep_after),
            "reason": (QueueFilter(reason="retries_exhausted"), None),
        }
        details: dict[str, Any] = {"open_reviews": n, "page": PAGE, "fill_seconds": round(fill_s, 1)}
        ours = []
        for name, (where, after) in variants.items():

            def one(w: QueueFilter = where, a: Any = after) -> None:
                with engine.connect() as conn:
                    assert len(uncertain_page(conn, w, limit=PAGE, after=a).rows) == PAGE

            ms = median_ms(one)
            ours.append(ms)
            details[name] = {"page_ms": round(ms, 1), "explain_analyze": _explain(engine, where, after)}

        def default_head() -> None:
            with engine.connect() as conn:
                assert len(queue_page(conn, QueueFilter(), limit=PAGE).rows) == PAGE

        baseline = median_ms(default_head)
        engine.dispose()
    return Figure(
        f"queue least sure first ({PAGE} of {n:,} open reviews)",
        "ms",
        statistics.median(ours),
        "the default order's head page",
        baseline,
        higher_is_better=False,
        details=details,
    )


def run() -> list[Figure]:
    return [bench_insert_cost(), bench_uncertainty_page()]
