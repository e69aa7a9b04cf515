"""Intake: documents a client posts become jobs, durably, before anyone is told so.

The same registration as retrieval (:mod:`triage.pipeline.retrieve`): the payload is stored
first, by content hash (the claim check), then the job and its outbox event are registered in
one transaction under the idempotency key ``source/len:external_id/sha256/version``. A client
that posts the same document again, because it never saw the answer, gets the job it already
has. Only what this returns, after the commit, may be acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from triage.contracts.intake import INTAKE_BATCH, IntakeDocument
from triage.jobs.store import JobStore
from triage.jobs.store.intake import Accepted
from triage.jobs.vocabulary.models import NewJob
from triage.jobs.vocabulary.states import Step
from triage.payloads import PayloadStore
from triage.pipeline.retrieve import idempotency_key

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IntakeSettings:
    """:param classifier_version: the version ``classify_intake`` runs (part of the key).
    :param max_attempts: each job's attempt budget (``classify_documents``' default)."""

    classifier_version: str
    max_attempts: int
    batch_key: str = INTAKE_BATCH


def accept_documents(
    store: JobStore,
    payloads: PayloadStore,
    documents: Sequence[tuple[IntakeDocument, bytes]],
    settings: IntakeSettings,
    *,
    actor: str,
) -> list[Accepted]:
    """Store the payloads (each document with its payload's canonical bytes), then register the
    jobs; one :class:`Accepted` per document, in order (a document repeated within the call
    answers with the same job, ``new`` only the first time)."""
    if not documents:
        return []
    stored = payloads.put_many([content for _doc, content in documents])
    new_jobs = [
        NewJob(
            idempotency_key(doc.source, doc.external_id, digest, settings.classifier_version),
            doc.source,
            doc.external_id,
            digest,
            ref,
            settings.classifier_version,
            correlation_id=doc.correlation_id,
        )
        for (doc, _payload), (digest, ref) in zip(documents, stored, strict=True)
    ]
    accepted = store.intake.accept(
        new_jobs, step=Step.CLASSIFY, max_attempts=settings.max_attempts, actor=actor, batch_key=settings.batch_key
    )
    by_key = {a.idempotency_key: a for a in accepted}
    answers, seen = [], set()
    for job in new_jobs:
        found = by_key[job.idempotency_key]
        answers.append(found if job.idempotency_key not in seen else _again(found))
        seen.add(job.idempotency_key)
    # Debug, not info: Airflow's API server logs every request already (its access log), and a
    # line per request at info cost 7% of intake's API-server CPU (measured, docs/performance.md).
    log.debug(
        "intake accepted=%d new=%d existing=%d",
        len(answers),
        sum(a.new for a in answers),
        sum(not a.new for a in answers),
    )
    return answers


def _again(first: Accepted) -> Accepted:
    return Accepted(first.idempotency_key, first.job_id, first.status, first.correlation_id, new=False)
