"""Run a replay by filter: its preview (reads only) and its apply, in bounded batches.

The apply is one short transaction per batch (at most :data:`BATCH_SIZE` jobs), never one
statement over the whole selection: each batch locks the replay's request row (so two
submissions of the same replay take turns and its limit holds), moves the next jobs with
:func:`~triage.jobs.sql.moves.replays.replay_batch` and counts them on the request. The request
is stamped applied when a batch finds nothing left or the limit is reached; from then on the
same submission changes nothing and reports ``already_applied``. A replay cut short (the
database went away) is resumed by submitting it again: the jobs it moved before never match
again (their events carry its key).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa

from triage.contracts.replay import PREVIEW_ROWS, ReplayFilter
from triage.jobs.sql.moves import replays as R
from triage.jobs.vocabulary.states import JobStatus, parse_status

BATCH_SIZE = 500
"""Jobs per transaction of an apply: short locks, and a bounded UPDATE whatever the limit."""

Transaction = Callable[[str], AbstractContextManager[sa.Connection]]


@dataclass(frozen=True, slots=True)
class PreviewedJob:
    job_id: uuid.UUID
    status: JobStatus
    reason: str | None
    error_class: str | None
    source: str
    batch_key: str
    failed_at: datetime
    replays: int


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """A replay on record: who asked, why, how many jobs it moved, and when it finished."""

    replay_key: str
    requested_by: str
    note: str
    requested_at: datetime
    applied_at: datetime | None
    replayed: int


@dataclass(frozen=True, slots=True)
class ReplayPreview:
    """What a replay would do now; nothing was changed to find out."""

    replay_key: str
    matching: int
    at_replay_limit: int
    would_replay: int
    jobs: tuple[PreviewedJob, ...]
    request: ReplayRequest | None
    """The same replay (same filter and note) when it was submitted before."""


@dataclass(frozen=True, slots=True)
class ReplayApplied:
    replay_key: str
    outcome: Literal["applied", "already_applied"]
    replayed_now: int
    request: ReplayRequest
    job_ids: tuple[uuid.UUID, ...]
    """The jobs this call moved, in order."""


def _request(row: Any) -> ReplayRequest | None:
    if row is None:
        return None
    return ReplayRequest(row.replay_key, row.requested_by, row.note, row.requested_at, row.applied_at, row.replayed)


def preview(
    conn: sa.Connection, selection: ReplayFilter, *, max_replays: int, rows: int = PREVIEW_ROWS
) -> ReplayPreview:
    key = selection.replay_key()
    matching, spent = conn.execute(R.preview_counts(selection), {"max_replays": max_replays}).one()
    listed = conn.execute(R.preview_rows(selection), {"max_replays": max_replays, "preview_rows": rows}).all()
    jobs = tuple(
        PreviewedJob(
            r.id, parse_status(r.status), r.reason, r.error_class, r.source, r.batch_key, r.updated_at, r.replays
        )
        for r in listed
    )
    request = _request(conn.execute(R.read_request(), {"p_key": key}).first())
    return ReplayPreview(key, matching, spent, min(matching, selection.limit), jobs, request)


def apply(
    transaction: Transaction, selection: ReplayFilter, *, actor: str, max_replays: int, batch_size: int = BATCH_SIZE
) -> ReplayApplied:
    """Replay the selection as ``actor``, one transaction per batch (see the module doc)."""
    if selection.note is None:  # ReplayFilter refuses an apply without one; this is for direct callers
        raise ValueError("applying a replay needs a note saying why")
    key = selection.replay_key()
    params = {
        "p_key": key,
        "p_replay_reason": R.replay_reason(key),
        "p_actor": actor,
        "p_note": selection.note,
        "max_replays": max_replays,
    }
    with transaction(actor) as conn:
        conn.execute(
            R.open_request(),
            {"p_key": key, "p_filter": selection.selection(), "p_actor": actor, "p_note": selection.note},
        )
    moved: list[uuid.UUID] = []
    while True:
        with transaction(actor) as conn:
            request = _request(conn.execute(R.lock_request(), {"p_key": key}).one())
            assert request is not None
            if request.applied_at is not None:  # finished by an earlier submission (or a concurrent one)
                outcome: Literal["applied", "already_applied"] = "applied" if moved else "already_applied"
                return ReplayApplied(key, outcome, len(moved), request, tuple(moved))
            room = min(batch_size, selection.limit - request.replayed)
            ids = list(conn.execute(R.replay_batch(selection), {**params, "batch": room}).scalars()) if room else []
            moved += ids
            finished = not ids or request.replayed + len(ids) >= selection.limit
            done = _request(
                conn.execute(R.count_replayed(), {"p_key": key, "moved": len(ids), "finished": finished}).one()
            )
        if finished:
            assert done is not None
            return ReplayApplied(key, "applied", len(moved), done, tuple(moved))
