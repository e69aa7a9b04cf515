"""A reviewer's decisions on the ledger: one job at a time (label, reject, requeue) or a replay
by filter, and the open reviews they are taken on. No Airflow imports.

Each decision is one transaction with the reviewer as its actor (a replay: one per bounded
batch, :mod:`.replays`). Applying the same decision again changes nothing and returns
``already_applied``; a different decision on a job that is no longer in review raises
:class:`~triage.jobs.errors.NotInReview`. Every refusal rolls back whole. The moves are
:mod:`.review_transitions` and :mod:`.replay_transitions`; what a decision returns,
:mod:`.review_results`. :class:`~triage.jobs.store.JobStore` inherits these methods: callers
ask the store.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence

from triage.contracts.replay import ReplayFilter
from triage.jobs import audit_reviews, learning, outputs, queries, replays, review_results, review_transitions
from triage.jobs.errors import LabelNotInTaxonomy
from triage.jobs.expressions import rowset
from triage.jobs.ledger import Ledger
from triage.jobs.models import ReviewCase, ReviewResult


class ReviewDecisions(Ledger):
    """The store's review and replay decisions (part of :class:`~triage.jobs.store.JobStore`)."""

    def resolve_with_label(
        self, job_id: uuid.UUID, label: str, *, actor: str, note: str | None = None, taxonomy_names: Collection[str]
    ) -> ReviewResult:
        """Review decision: the job is done with the reviewer's ``label``.

        ``manual_review -> completed``, the review row resolved ``labelled``, a ``job.completed``
        event, and the label upserted into ``document_labels`` (classifier version
        ``human:<actor>``, no confidence) under the usual rule: a newer job's label stands.
        No ``classifications`` row: those are the model's attempts, and a human label in them
        would skew its acceptance rate, latency and cost. The decision is also a labelled
        example (source ``review``, :func:`.learning.example_from_review`), in the same
        transaction: the learned classifier trains on what reviewers decide.

        On an audit sample (a completed job, :mod:`.audit_samples`) the same decision confirms the
        model's label (the same label) or corrects it (another): :mod:`.audit_reviews`.

        :raises LabelNotInTaxonomy: ``label`` is not in ``taxonomy_names`` (checked first).
        """
        if label not in taxonomy_names:
            raise LabelNotInTaxonomy(f"label {label!r} is not in the taxonomy ({', '.join(sorted(taxonomy_names))})")
        with self.transaction(actor) as conn:
            params = {"p_job_id": job_id, "p_actor": actor, "p_note": note, "p_label": label}
            if conn.execute(review_transitions.label_from_review(), params).first() is None:
                audited = audit_reviews.decide_audit_sample(conn, job_id, params)
                return audited or review_results.missed(conn, job_id, "label", label=label)
            written = conn.execute(
                outputs.upsert_review_label(),
                rowset(
                    "given",
                    [{"id": job_id, "label": label, "confidence": None, "classifier_version": f"human:{actor}"}],
                ),
            ).first()
            conn.execute(learning.example_from_review(), params)
            return review_results.applied(conn, job_id, "label", label=label, label_written=written is not None)

    def reject(self, job_id: uuid.UUID, *, actor: str, note: str | None = None) -> ReviewResult:
        """Review decision: no attempt will ever succeed. ``manual_review -> terminal_failed``,
        the review row resolved ``rejected`` and a ``job.reviewed`` event."""
        with self.transaction(actor) as conn:
            params = {"p_job_id": job_id, "p_actor": actor, "p_note": note}
            if conn.execute(review_transitions.reject_from_review(), params).first() is None:
                return review_results.missed(conn, job_id, "reject")
            return review_results.applied(conn, job_id, "reject")

    def resolve_with_requeue(
        self, job_id: uuid.UUID, *, actor: str, note: str | None = None, max_replays: int = 3
    ) -> ReviewResult:
        """Review decision: try again. ``manual_review -> queued`` as a fresh job: a new budget
        of as many attempts as it had (numbered on from its last one, so every attempt keeps
        its classification and events), no lease rescues or last error; a replay counted up to
        ``max_replays``, the review row resolved ``requeued`` and a ``job.requeued`` event (the
        reviewer is the actor).

        :raises ReplayLimitReached: the job is in review and was requeued ``max_replays`` times.
        """
        with self.transaction(actor) as conn:
            params = {"p_job_id": job_id, "max_replays": max_replays, "p_actor": actor, "p_note": note}
            if conn.execute(review_transitions.requeue_from_review(), params).first() is None:
                return review_results.missed(conn, job_id, "requeue", max_replays=max_replays)
            return review_results.applied(conn, job_id, "requeue")

    def preview_replay(self, selection: ReplayFilter, *, max_replays: int = 3) -> replays.ReplayPreview:
        """A replay by filter's dry run: how many jobs it would move and the first of them, and
        whether the same replay was submitted before. Reads only (a ``READ ONLY`` transaction)."""
        with self.reading() as conn:
            return replays.preview(conn, selection, max_replays=max_replays)

    def replay(self, selection: ReplayFilter, *, actor: str, max_replays: int = 3) -> replays.ReplayApplied:
        """Replay by filter: the selected ``manual_review`` and ``terminal_failed`` jobs ``-> queued``
        as fresh jobs, as ``actor`` with the filter's note, in transactions of a bounded batch
        each (:mod:`.replays`). Jobs replayed ``max_replays`` times are left alone. The same
        filter and note again changes nothing and returns ``already_applied``."""
        return replays.apply(self.transaction, selection, actor=actor, max_replays=max_replays)

    def open_reviews(self, job_ids: Sequence[uuid.UUID] | None = None, *, limit: int = 100) -> list[ReviewCase]:
        """Jobs waiting for a reviewer (of ``job_ids``, or all), oldest review first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                queries.open_review_cases(), {"ids": None if job_ids is None else list(job_ids), "limit": limit}
            ).all()
        return [ReviewCase(**{**r._asdict(), "context": dict(r.context or {})}) for r in rows]
