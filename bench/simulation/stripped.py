"""The ledger with a guarantee taken away, for :mod:`bench.guarantees`' A/B only (a scratch
database; never the product): what each guarantee costs is measured by running without it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import jobs
from triage.jobs.sql.expressions import NO_LEASE, NOW, UUID, recordset, status_literal
from triage.jobs.sql.moves import worker as T
from triage.jobs.vocabulary.states import JobStatus as S


def complete_without_event() -> Any:
    """:func:`triage.jobs.sql.moves.worker.complete` without its outbox insert: the fenced update alone."""
    held = recordset("held", **T.HELD, event_id=UUID, label=sa.Text, confidence=sa.Float, classifier_version=sa.Text)
    return (
        sa.update(jobs)
        .where(*T._held(held))
        .values(status=status_literal(S.COMPLETED), status_reason="completed", updated_at=NOW, **NO_LEASE)
        .returning(jobs.c.id)
    )


@contextmanager
def without(engine: sa.Engine, *, log: bool, event: bool) -> Iterator[None]:
    """The ledger in the block: without its transition log (``log=False``: the jobs update
    trigger disabled, so no ``job_events`` row and no check against ``job_transitions``) and
    without the completion's event (``event=False``: :func:`complete_without_event` in place of
    ``transitions.complete``, which the store's record calls); both restored on the way out."""
    if not log:
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE triage.jobs DISABLE TRIGGER jobs_check_update"))
    real = T.complete
    if not event:
        statement = complete_without_event()
        T.complete = lambda: statement  # type: ignore[assignment]  # the bench's stand-in: the same move, no outbox event
    try:
        yield
    finally:
        T.complete = real
        if not log:
            with engine.begin() as conn:
                conn.execute(sa.text("ALTER TABLE triage.jobs ENABLE TRIGGER jobs_check_update"))
