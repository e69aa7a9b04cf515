"""The review queue page with many open reviews (issue #14): one bounded query per page.

``python -m bench review`` (``BENCH_REVIEWS`` open reviews, default 100,000): the page the
Triage plugin renders (:meth:`triage.web.service.TriageService.queue`, 50 rows) at the head of
the queue, deep in it (after a cursor half-way), filtered by reason, by a rare source and by
batch; beside it the same query without the page (every matching row, no LIMIT, no cursor), which
is what an OFFSET/COUNT page would pay. It also counts the statements one page sends (1) and
keeps each variant's plan, which must read an index range, not sort the queue.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from bench.common import Figure, scratch_database, timed
from tests.ledger.helpers import new_jobs
from triage.database import create_engine
from triage.jobs.schema import manual_review
from triage.jobs.sql.reads.review_queue import QueueFilter, queue_statement
from triage.jobs.store import JobStore
from triage.web.service import TriageService

PAGE = 50
BATCH_SIZE = 5_000
RARE_SOURCE = "email"  # one document in a hundred
REPEATS = 7


def reviews() -> int:
    return int(os.environ.get("BENCH_REVIEWS", "100000"))


def _fill(store: JobStore, n: int) -> list[str]:
    """``n`` open reviews in batches of :data:`BATCH_SIZE`, the odd batches with another reason."""
    batches = []
    for b in range(0, n, BATCH_SIZE):
        batch = f"bench-{b // BATCH_SIZE:04d}"
        size = min(BATCH_SIZE, n - b)
        common = new_jobs(size - size // 100, prefix=f"{batch}-c")
        rare = new_jobs(size // 100, prefix=f"{batch}-r", source=RARE_SOURCE)
        store.register([*common, *rare], batch_key=batch, step="classify", max_attempts=3)
        reason = "retries_exhausted" if b // BATCH_SIZE % 2 else "inconclusive"
        store.send_batch_to_review(batch, reason=reason, error=None, owner_prefix="bench/")
        batches.append(batch)
    return batches


@contextmanager
def _counting(engine: sa.Engine) -> Iterator[list[str]]:
    """The statements ``engine`` sends inside the block."""
    sent: list[str] = []

    def listener(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        sent.append(statement)

    sa.event.listen(engine, "before_cursor_execute", listener)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", listener)


def _plan(engine: sa.Engine, query: Any, params: dict[str, Any]) -> list[str]:
    """The plan's node lines (EXPLAIN, no ANALYZE), to show which index a page reads."""
    compiled = query.compile(dialect=engine.dialect)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.construct_params(params)).all()
    return [r[0].strip() for r in rows if "->" in r[0] or not r[0].startswith(" ")][:12]


def median_ms(fn: Any, repeats: int | None = None) -> float:
    """``fn``'s median time over ``repeats`` calls, in ms, after one call to warm plans and
    caches (as on a server that has been up). The growth bench times its pages with it too."""
    fn()
    return statistics.median(timed(fn)[0] for _ in range(repeats or REPEATS)) * 1000


def middle_cursor(conn: sa.Connection, open_reviews: int) -> tuple[Any, ...]:
    """The cursor (``created_at``, ``id``) of the open review half-way down the queue's
    ``open_reviews``: where a deep page starts."""
    return tuple(
        conn.execute(
            sa.select(manual_review.c.created_at, manual_review.c.id)
            .where(manual_review.c.resolved_at.is_(None))
            .order_by(manual_review.c.created_at, manual_review.c.id)
            .offset(open_reviews // 2)
            .limit(1)
        ).one()
    )


def bench_queue_page() -> Figure:
    n = reviews()
    with scratch_database() as url:
        engine = create_engine(url, pool_size=2)
        store = JobStore(engine)
        fill_s, batches = timed(lambda: _fill(store, n))
        with engine.begin() as conn:  # statistics as autovacuum would have them by now
            conn.execute(sa.text("ANALYZE"))
        service = TriageService(store, payload_base="/nonexistent", taxonomy_names=[])
        with engine.connect() as conn:
            middle = middle_cursor(conn, n)
        variants: dict[str, tuple[QueueFilter, Any]] = {
            "head": (QueueFilter(), None),
            "deep": (QueueFilter(), middle),
            "reason": (QueueFilter(reason="retries_exhausted"), None),
            "rare source": (QueueFilter(source=RARE_SOURCE), None),
            "batch": (QueueFilter(batch=batches[len(batches) // 2]), None),
        }
        details: dict[str, Any] = {"open_reviews": n, "page": PAGE, "fill_seconds": round(fill_s, 1)}
        page_ms, whole_ms = [], []
        for name, (where, after) in variants.items():
            with _counting(engine) as sent:
                page = service.queue(where, limit=PAGE, after=after)
            queries = len(sent)
            assert len(page.rows) == PAGE, (name, len(page.rows))
            params: dict[str, Any] = {k: getattr(where, k) for k in where.given()}
            paged = {**params, "limit": PAGE + 1}
            if after is not None:
                paged["after_at"], paged["after_id"] = after
            ours = median_ms(lambda w=where, a=after: service.queue(w, limit=PAGE, after=a))
            # The same statement with a limit past the end of the queue: every matching row.
            # (Its LIMIT sits inside, before the model's answer is joined, so `.limit(None)`
            # on the outer select would leave the inner one unbound.)
            unpaged = {**params, "limit": n + 1}
            query = queue_statement(where.given(), False)
            whole = median_ms(lambda q=query, p=unpaged: _all_rows(engine, q, p))
            page_ms.append(ours)
            whole_ms.append(whole)
            details[name] = {
                "page_ms": round(ours, 2),
                "whole_query_ms": round(whole, 1),
                "queries": queries,
                "plan": _plan(engine, queue_statement(where.given(), after is not None), paged),
            }
        engine.dispose()
    return Figure(
        f"review queue page ({PAGE} of {n:,} open reviews)",
        "ms",
        statistics.median(page_ms),
        "the same query without the page",
        statistics.median(whole_ms),
        target_ratio=0.1,
        higher_is_better=False,
        details=details,
    )


def _all_rows(engine: sa.Engine, query: Any, params: dict[str, Any]) -> int:
    with engine.connect() as conn:
        return len(conn.execute(query, params).all())


def run() -> list[Figure]:
    return [bench_queue_page()]
