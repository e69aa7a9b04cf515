"""A reviewer's ``label`` decision on an audit sample: confirm or correct (:mod:`.audit_samples`).

Runs inside the decision's transaction (:meth:`~triage.jobs.decisions.ReviewDecisions.resolve_with_label`,
after its move out of ``manual_review`` matched nothing): it never commits, and returns None when
the job has no open audit sample, so that the caller explains the miss as for any decision.
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa

from triage.jobs import audit_samples, learning, outputs, review_results
from triage.jobs.expressions import rowset
from triage.jobs.models import ReviewResult


def decide_audit_sample(conn: sa.Connection, job_id: uuid.UUID, params: dict[str, Any]) -> ReviewResult | None:
    """Confirm (the model's label) or correct (another label) the open audit sample of ``job_id``.

    Either way the decision is a labelled example (source ``review``): a person read the
    document and chose its label. A correction also writes the document's label (classifier
    version ``human:<reviewer>``) under the usual order: a newer job's label stands, and the
    result says so (``label_written`` false).

    :param params: the decision's ``p_job_id``, ``p_label``, ``p_actor`` and ``p_note``.
    """
    label = params["p_label"]
    if conn.execute(audit_samples.confirm_audit_sample(), params).first() is not None:
        conn.execute(learning.example_from_review(), params)
        return review_results.applied(conn, job_id, "label", label=label)
    if conn.execute(audit_samples.correct_audit_sample(), params).first() is None:
        return None
    written = conn.execute(
        outputs.upsert_review_label(),
        rowset(
            "given",
            [{"id": job_id, "label": label, "confidence": None, "classifier_version": f"human:{params['p_actor']}"}],
        ),
    ).first()
    conn.execute(learning.example_from_review(), params)
    return review_results.applied(conn, job_id, "label", label=label, label_written=written is not None)
