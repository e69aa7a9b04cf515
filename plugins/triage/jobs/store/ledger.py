"""The ledger over one engine: its transaction and its read-only connection, which the store
(:class:`~triage.jobs.store.JobStore`) and every part of it (:class:`Part`: ``store.review``,
``store.intake``, ...) run their named statements in. No Airflow imports.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import sqlalchemy as sa

from triage.jobs.sql import session
from triage.jobs.vocabulary.errors import translate

DEFAULT_ACTOR = "triage"


class Ledger:
    """The job database's transactions, with their actor set and ledger errors translated.

    :param engine: a SQLAlchemy engine on the job database (psycopg 3).
    """

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    @contextmanager
    def transaction(self, actor: str | None = DEFAULT_ACTOR) -> Iterator[sa.Connection]:
        """One transaction with ``triage.actor`` set; ledger errors come out translated.

        ``actor=None`` sets nothing: the trigger then names the lease owner of each row, which
        is right for a lease holder's own writes and saves a round trip per batch.
        """
        try:
            with self.engine.begin() as conn:
                if actor is not None:
                    conn.execute(session.set_actor(), {"actor": actor})
                yield conn
        except sa.exc.DBAPIError as exc:
            ledger_error = translate(exc)
            if ledger_error is not None:
                raise ledger_error from exc
            raise

    @contextmanager
    def reading(self) -> Iterator[sa.Connection]:
        """A read-only connection for the ledger's named reads (:mod:`triage.jobs.sql.reads.checks`, a report's): its
        transactions begin ``READ ONLY``, so the database refuses any write (no extra round trip)."""
        with self.engine.connect().execution_options(postgresql_readonly=True) as conn:
            yield conn


class Part(Ledger):
    """A named part of the store (``store.review``, ``store.batches``, ...): its transactions and
    reads are the store's own, so a store that wraps :meth:`~Ledger.transaction` (a test's seam)
    wraps its parts' too.

    :param store: the store this is a part of.
    """

    def __init__(self, store: Ledger) -> None:
        super().__init__(store.engine)
        self.store = store

    def transaction(self, actor: str | None = DEFAULT_ACTOR) -> AbstractContextManager[sa.Connection]:  # type: ignore[override]
        return self.store.transaction(actor)

    def reading(self) -> AbstractContextManager[sa.Connection]:  # type: ignore[override]
        return self.store.reading()
