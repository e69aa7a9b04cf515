"""The content cache of the classify step: an answer of the model is reused for another job whose
classifier input (the text it reads: subject and body) is the same, under the same classifier
version, so repeated content costs no model call: a forwarded email, a re-opened ticket, a
duplicate upload under another external id. An accepted answer completes the repeat; a doubtful
one sends it to review at once, naming the answer it reused.

Per claim, one lookup (:meth:`~triage.jobs.store.JobStore.reusable_answers`) says which jobs may
take a reused answer and which entry the ledger holds for each; the entry is an answer of the model for
that input and version, accepted ones first (:mod:`triage.jobs.sql.reads.answers` says what an entry is,
which jobs may not take one, and what invalidates one). Within the claim, the first job of an
input not answered yet is asked (:meth:`ContentCache.split`), the others wait for it and take its
answer if it was accepted or doubtful, or are asked themselves if it was rejected or the call
failed. Answers of this try are
also remembered here (:attr:`ContentCache.remembered`, bounded), because the step records a claim
while it handles the next one and the lookup may not see the previous claim's answers yet; an
answer remembered from a claim whose recording failed is never used, since the step stops there.

A reused answer moves its job through the state machine like any other (its own events,
classification row, and label row or review row): the classification has the entry's label,
confidence and output mode, no tokens, no cost, and ``reused_job_id``/``reused_attempt`` naming
the answer it copied; its outcome is decided afresh at this run's threshold. The claim the step handles beside the current one's last round
(:mod:`triage.pipeline.claim_ahead`) waits for the answers that round is asking for, instead of
asking again (:meth:`ContentCache.wait`). Across workers handling claims at the same moment, an
input may still be asked once per worker.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Iterable, Sequence

from triage.contracts.documents import DocumentPayload
from triage.jobs.sql.reads.answers import Answer
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Advance, ClaimedJob, Complete, Outcome, SendToReview

__all__ = ["ContentCache", "input_key"]

REMEMBERED = 100_000
"""Answers of this try kept in memory at most (about 30 MB); then forgotten, oldest first."""
WAIT_SECONDS = 120.0
"""How long a claim's repeats wait for another claim's call for their input, at most; then they
are asked themselves."""


def input_key(document: DocumentPayload) -> str:
    """The cache's key of a document: the SHA-256 (hex) of the text a classifier reads."""
    return hashlib.sha256(document.text.encode("utf-8", "surrogatepass")).hexdigest()


class ContentCache:
    """The cache of one classify try, for one classifier version and confidence threshold.

    ``reused`` counts the answers it handed on (the accepted and the doubtful ones).
    """

    def __init__(self, store: JobStore, classifier_version: str, threshold: float) -> None:
        self.store, self.classifier_version, self.threshold = store, classifier_version, threshold
        self.remembered: dict[str, Answer] = {}
        self.reused = 0
        # Per job of the claims being handled (two at once in the step's window), until forgotten.
        self._keys: dict[uuid.UUID, str] = {}
        self._eligible: set[uuid.UUID] = set()
        self._found: dict[uuid.UUID, Answer] = {}
        # The inputs a claim is asking for now (the job asked, set once it is learned or given
        # up), and the repeats of another claim that wait for one: the claim handled beside the
        # current one (the step's window) takes the answer instead of asking again.
        self._lock = threading.Lock()
        self._asking: dict[str, tuple[uuid.UUID, threading.Event]] = {}
        self._waits: dict[uuid.UUID, threading.Event] = {}

    def split(self, jobs: Sequence[ClaimedJob], documents: Sequence[object]) -> tuple[list[int], list[int]]:
        """Look the claim up, given its documents as the step read them (a
        :class:`~triage.contracts.documents.DocumentPayload`, or the outcome reading one failed
        with); (indexes to handle now, indexes to handle once those are done): the second are the
        jobs of an input that a job of the first is asked for. A payload that did not read is
        handled now (its job fails as it would without the cache)."""
        keys = {
            job.id: input_key(document)
            for job, document in zip(jobs, documents, strict=True)
            if isinstance(document, DocumentPayload)
        }
        eligible, found = self.store.reusable_answers(
            keys, classifier_version=self.classifier_version, threshold=self.threshold
        )
        self._keys.update(keys)
        self._eligible.update(eligible)
        self._found.update(found)
        now: list[int] = []
        later: list[int] = []
        asked: set[str] = set()
        with self._lock:
            for index, job in enumerate(jobs):
                key = self._keys.get(job.id)
                if key is None or job.id not in self._eligible or self.answer(job) is not None:
                    now.append(index)
                elif key in asked:
                    later.append(index)
                elif key in self._asking:  # another claim of this try asks for it now
                    self._waits[job.id] = self._asking[key][1]
                    later.append(index)
                else:
                    asked.add(key)
                    self._asking[key] = (job.id, threading.Event())
                    now.append(index)
        return now, later

    def wait(self, jobs: Iterable[ClaimedJob]) -> None:
        """Before a claim's repeats are handled: wait, :data:`WAIT_SECONDS` at most in all, for
        the other claims' calls they repeat (their answers are then remembered)."""
        deadline = time.monotonic() + WAIT_SECONDS
        for job in jobs:
            with self._lock:
                event = self._waits.pop(job.id, None)
            if event is not None:
                event.wait(max(0.0, deadline - time.monotonic()))

    def _done_asking(self, jobs: Iterable[ClaimedJob]) -> None:
        """The inputs these jobs were asked for are answered (or never will be): wake their waiters."""
        with self._lock:
            for job in jobs:
                key = self._keys.get(job.id, "")
                entry = self._asking.get(key)
                if entry is not None and entry[0] == job.id:
                    del self._asking[key]
                    entry[1].set()

    def forget(self, jobs: Iterable[ClaimedJob]) -> None:
        """The claim of ``jobs`` is handled, or gave up: wake what waits on it, drop its lookup
        (its answers stay remembered)."""
        jobs = list(jobs)
        self._done_asking(jobs)
        with self._lock:
            for job in jobs:
                self._waits.pop(job.id, None)
                self._keys.pop(job.id, None)
                self._eligible.discard(job.id)
                self._found.pop(job.id, None)

    def answer(self, job: ClaimedJob) -> Answer | None:
        """The answer ``job`` takes instead of a model call, or None (it is asked)."""
        if job.id not in self._eligible:
            return None
        return self._found.get(job.id) or self.remembered.get(self._keys[job.id])

    def learn(self, jobs: Iterable[ClaimedJob], outcomes: Iterable[Outcome]) -> None:
        """Remember the model's answers among ``outcomes`` (an accepted one replaces a doubtful
        one, as in the ledger's choice of entry) and count the reused ones."""
        jobs = list(jobs)
        for job, outcome in zip(jobs, outcomes, strict=True):
            record = outcome.classification if isinstance(outcome, Complete | Advance | SendToReview) else None
            if record is None or record.outcome not in ("accepted", "inconclusive"):
                continue
            if record.reused_from is not None:
                self.reused += 1
                continue
            key = record.input_sha256
            if key is None:
                continue
            known = self.remembered.get(key)
            if known is not None and (record.outcome != "accepted" or known.confidence >= self.threshold):
                continue
            if known is None and len(self.remembered) >= REMEMBERED:
                del self.remembered[next(iter(self.remembered))]
            confidence = record.confidence if record.confidence is not None else 0.0
            self.remembered[key] = Answer(job.id, job.attempt, record.label, confidence, record.output_mode)
        self._done_asking(jobs)
