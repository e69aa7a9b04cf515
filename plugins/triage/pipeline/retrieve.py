"""Retrieve: read a data interval from a source, store payloads once, register one job each.

The idempotency key is the logical operation: source, external id, content hash and classifier
version. The same date read again registers nothing new; an edited document (new hash) or a new
classifier version is new work. A malformed record is registered too, straight into
``manual_review`` with reason ``malformed_input``: nothing read is ever dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import NewJob
from triage.jobs.vocabulary.states import JobStatus, Step
from triage.payloads import PayloadStore
from triage.pipeline.heap import freeze_long_lived
from triage.sources.base import Source, SourceDocument

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 << 20
"""Payload bytes one chunk may hold before it is stored and registered (with the next chunk
read meanwhile, at most about twice this is in memory)."""


def idempotency_key(source: str, external_id: str, content_sha256: str, classifier_version: str) -> str:
    """``source/len:external_id/sha256/version``: the length prefix keeps it unambiguous
    whatever characters the external id carries."""
    return f"{source}/{len(external_id)}:{external_id}/{content_sha256}/{classifier_version}"


@dataclass(frozen=True, slots=True)
class RetrieveResult:
    read: int
    registered: int
    existing: int
    malformed: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.read / self.seconds if self.seconds else 0.0


def to_new_jobs(docs: Sequence[SourceDocument], payloads: PayloadStore, classifier_version: str) -> list[NewJob]:
    """Store the documents' payloads (one pack per chunk, see :mod:`triage.payloads`) and make
    their jobs; the jobs may be registered once this returns."""
    stored = payloads.put_many([doc.content for doc in docs])
    return [new_job(doc, digest, ref, classifier_version) for doc, (digest, ref) in zip(docs, stored, strict=True)]


def new_job(doc: SourceDocument, digest: str, ref: str, classifier_version: str) -> NewJob:
    key = idempotency_key(doc.source, doc.external_id, digest, classifier_version)
    if doc.malformed_reason is None:
        return NewJob(key, doc.source, doc.external_id, digest, ref, classifier_version)
    return NewJob(
        key,
        doc.source,
        doc.external_id,
        digest,
        ref,
        classifier_version,
        status=JobStatus.MANUAL_REVIEW,
        reason="malformed_input",
        error=doc.malformed_reason,
        review_context={"external_id": doc.external_id, "malformed_reason": doc.malformed_reason, **dict(doc.detail)},
    )


def retrieve(
    store: JobStore,
    source: Source,
    payloads: PayloadStore,
    *,
    start: datetime,
    end: datetime,
    batch_key: str,
    classifier_version: str,
    max_attempts: int,
    chunk: int = 5000,
    chunk_bytes: int = CHUNK_BYTES,
    actor: str = "retrieve",
) -> RetrieveResult:
    """Register the documents of ``[start, end)``: each chunk (``chunk`` documents, or fewer
    holding ``chunk_bytes``) is stored as packs of payloads, then registered in one transaction."""
    freeze_long_lived()  # the task's imports and set-up: out of the collector's walks (triage.pipeline.heap)
    began = time.perf_counter()
    read = malformed = 0
    totals = {"registered": 0, "existing": 0}
    writer = ThreadPoolExecutor(1, "triage-register")
    pending: Future[None] | None = None

    def register(chunk: list[NewJob], seen: int) -> None:
        result = store.register(chunk, batch_key=batch_key, step=Step.CLASSIFY, max_attempts=max_attempts, actor=actor)
        totals["registered"] += result.new
        totals["existing"] += result.existing
        log.info(
            "retrieve batch=%s read=%d registered=%d existing=%d",
            batch_key,
            seen,
            totals["registered"],
            totals["existing"],
        )

    def flush(chunk: list[NewJob]) -> None:
        # Registering chunk N (database) overlaps with reading and storing chunk N+1 (Python, disk).
        nonlocal pending
        if pending is not None:
            pending.result()
        pending = writer.submit(register, chunk, read) if chunk else None

    try:
        docs: list[SourceDocument] = []
        held = 0
        for doc in source.read(start, end):
            read += 1
            malformed += doc.malformed_reason is not None
            docs.append(doc)
            held += len(doc.content)
            # A chunk is cut by count and by bytes: 5,000 lines near the line limit would
            # otherwise be gigabytes in memory at once.
            if len(docs) >= chunk or held >= chunk_bytes:
                flush(to_new_jobs(docs, payloads, classifier_version))
                docs, held = [], 0
        flush(to_new_jobs(docs, payloads, classifier_version))
        flush([])
    finally:
        writer.shutdown(wait=True)
    return RetrieveResult(read, totals["registered"], totals["existing"], malformed, time.perf_counter() - began)
