"""The store's part ``JobStore.chunks``: claim, classify and complete a chunk of queued jobs in
one transaction, for a classifier that runs in process (the statements are
:mod:`triage.jobs.sql.moves.one_transaction`; the loop over chunks is
:mod:`triage.pipeline.one_transaction`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import starmap
from typing import Any

import sqlalchemy as sa

from triage.jobs.sql import session
from triage.jobs.sql.expressions import context_json, event_ids
from triage.jobs.sql.moves import one_transaction as M
from triage.jobs.store.ledger import Part
from triage.jobs.store.recording import (
    execute_compiled,
    label_row,
    plain_rowset,
    record_outputs_txn,
    review_context,
    without_nulls,
)
from triage.jobs.vocabulary.errors import LedgerError
from triage.jobs.vocabulary.models import ClaimedJob, Complete, Outcome, Recorded, SendToReview

SETTLED_IN_CHUNK: tuple[type, ...] = (Complete, SendToReview)
"""The outcomes a chunk records itself: ``queued -> completed`` and ``queued -> manual_review``.
Any other (a retry, a park, a release, an advance) needs the lease: the chunk is rolled back."""


class ChunkMissed(LedgerError):
    """A picked job was not where the chunk locked it (queued at the attempt before the chunk's):
    the chunk is rolled back."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """What one transaction did: the jobs it picked, their outcomes, and what it recorded
    (None: an outcome needed the lease, and the chunk was rolled back; nothing of it is written)."""

    jobs: tuple[ClaimedJob, ...]
    outcomes: tuple[Outcome, ...]
    recorded: Recorded | None

    @property
    def rolled_back(self) -> bool:
        return self.recorded is None


class _NeedsLease(Exception):
    """Raised inside the chunk's transaction to roll it back (never leaves this module)."""


class Chunks(Part):
    """Chunks claimed, classified and completed in one transaction: the store's part ``JobStore.chunks``."""

    def settle(
        self,
        *,
        batch_key: str,
        step: str,
        classifier_version: str,
        limit: int,
        actor: str,
        decide: Callable[[Sequence[ClaimedJob]], Sequence[Outcome]],
        lease_seconds: float,
    ) -> Chunk:
        """Pick up to ``limit`` queued jobs (``FOR UPDATE SKIP LOCKED``), ``decide`` their outcomes
        while the transaction holds them, and record them in that same transaction.

        ``decide`` runs with the rows locked and must be quick (an in-process classifier): every
        other claim skips these jobs meanwhile. If any outcome is not one a chunk records
        (:data:`SETTLED_IN_CHUNK`), or a write fails, the transaction is rolled back: the jobs stay
        queued at their attempt, as if never picked, for the leased claim to take. ``actor`` names
        the mover in ``job_events`` (no lease owner does). ``lease_seconds``: the transaction is
        the chunk's lease; PostgreSQL ends it once idle that long (a worker hung in ``decide``, or
        gone without closing its connection), and the jobs are claimable again.
        """
        if limit < 1:
            raise ValueError("a chunk needs limit >= 1")
        params = {"p_batch_key": batch_key, "p_step": step, "p_classifier_version": classifier_version, "limit": limit}
        picked: tuple[ClaimedJob, ...] = ()
        outcomes: tuple[Outcome, ...] = ()
        try:
            with self.transaction(None) as conn:
                conn.execute(session.open_chunk(), {"actor": actor, "idle": f"{math.ceil(lease_seconds * 1000)}ms"})
                picked = _pick(conn, params)
                if not picked:
                    return Chunk((), (), Recorded())
                outcomes = tuple(decide(picked))
                if not all(isinstance(o, SETTLED_IN_CHUNK) for o in outcomes):
                    raise _NeedsLease
                recorded = record_picked_txn(conn, picked, outcomes)
        except _NeedsLease:
            return Chunk(picked, outcomes, None)
        return Chunk(picked, outcomes, recorded)


def _pick(conn: sa.Connection, params: dict[str, Any]) -> tuple[ClaimedJob, ...]:
    """The chunk's jobs, from psycopg's own rows fetched in one call (iterating the result
    fetched a row a call: ~1 µs a job; SQLAlchemy's rows over them ~1 µs more). Every column of
    :func:`~triage.jobs.sql.moves.one_transaction.pick_chunk` comes from psycopg as the job holds
    it (a UUID, text, whole numbers, an aware datetime): no conversion of SQLAlchemy's is skipped
    (``tests/ledger/test_chunk_rows.py`` compares the two)."""
    result = conn.execute(M.pick_chunk(), params)
    try:
        return tuple(starmap(ClaimedJob, result.cursor.fetchall()))
    finally:
        result.close()


def _in_step(picked: Sequence[ClaimedJob], outcomes: Sequence[Outcome]) -> bool:
    """Each outcome is its picked job's, in the pick's order, at its attempt: what the handler
    returns (its outcomes name the jobs' own id objects). Checked by identity, without hashing
    two UUIDs a job (~1 µs; their hash is Python code); False sends the check the long way."""
    return len(picked) == len(outcomes) and all(
        o.job_id is j.id and o.attempt == j.attempt for j, o in zip(picked, outcomes, strict=True)
    )


def record_picked_txn(conn: sa.Connection, picked: Sequence[ClaimedJob], outcomes: Sequence[Outcome]) -> Recorded:
    """Record the outcomes of the picked jobs (each a :data:`SETTLED_IN_CHUNK`), set-based: one
    fenced move per kind, then the classifications, labels and audit rows. Raises
    :class:`ChunkMissed` if a move did not find its job queued at the attempt before its own."""
    if not _in_step(picked, outcomes):
        attempts = {j.id: j.attempt for j in picked}
        if len(outcomes) != len(attempts) or any(attempts.get(o.job_id) != o.attempt for o in outcomes):
            raise LedgerError("one outcome per picked job, at the attempt the chunk counts")
    completed = [o for o in outcomes if isinstance(o, Complete)]
    reviewed = [o for o in outcomes if isinstance(o, SendToReview)]

    def run(statement: Any, rows: list[dict[str, Any]]) -> int:
        if not rows:
            return 0
        moved = execute_compiled(conn, statement, plain_rowset("held", rows)).rowcount
        if moved != len(rows):
            raise ChunkMissed(
                f"{len(rows) - moved} of {len(rows)} picked jobs were not queued where the chunk locked them"
            )
        return moved

    events = iter(event_ids(len(completed)))
    done = run(
        M.complete_picked(),
        [{"id": o.job_id.hex, "attempt": o.attempt, "event_id": next(events), **label_row(o)} for o in completed],
    )
    to_review = run(
        M.review_picked(),
        [
            without_nulls(
                {
                    "id": o.job_id.hex,
                    "attempt": o.attempt,
                    "reason": o.reason,
                    "error_class": o.error_class,
                    "error": o.error,
                    "context": context_json(review_context(o)),
                }
            )
            for o in reviewed
        ],
    )
    record_outputs_txn(conn, outcomes)
    return Recorded(completed=done, to_review=to_review)
