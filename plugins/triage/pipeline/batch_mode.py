"""Batch mode for backfills: a run's classify jobs go to the provider's batch interface (half the
price, answers within 24 h) instead of one interactive call each, with the ledger's guarantees.

1. :func:`submit` claims the run's jobs a claim at a time, parks again those of a submission still
   open, reads the others' payloads (a payload that
   fails to read fails its job as the classify step would), writes the submission's row, submits
   the claim's requests as one provider batch named by the row's key (a resubmission adopts the
   provider's batch), and parks the submitted jobs (``waiting``, ``outage:batch``, the attempt
   given back) until the end of the completion window.
2. :func:`collect` asks the provider about each open submission of the run: still running is
   left alone; done (completed, or expired with what finished) records each answer per job
   (partial results), lost (failed, cancelled, unknown) records none; either way the batch's jobs
   are made due now.
3. The classify step (run as usual) queues the due jobs, claims them and takes each one's batch
   answer (:func:`given_answers`) instead of calling the model; a job whose request failed inside
   the batch, or that the batch never reached or lost, is asked interactively like any other.

A job's answer is taken within the attempt budget it was submitted in (:func:`answers_within_budget`:
a reviewer's requeue asks afresh); it is recorded as the model's own answer (its tokens, no cost
figure: the batch's price is the provider's).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triage.classifiers.base import ModelOutput
from triage.classifiers.batch_api import BatchClient
from triage.contracts.documents import DocumentPayload
from triage.jobs.store import JobStore
from triage.jobs.store.batches import BatchLedger, Submission
from triage.jobs.vocabulary.models import ClaimedJob, Outcome, Park, Release
from triage.jobs.vocabulary.states import Step
from triage.payloads import PayloadStore
from triage.pipeline.reading import read_document

__all__ = ["BATCH_WINDOW_SECONDS", "Collected", "collect", "given_answers", "submission_key", "submit"]

log = logging.getLogger(__name__)

BATCH_WINDOW_SECONDS = 25 * 3600.0
"""How long a submitted job waits before it comes back to the queue by itself: the provider's
24-hour completion window and an hour."""


def submission_key(batch_key: str, job_ids: Sequence[uuid.UUID]) -> str:
    """The name of a submission: the run and its jobs (not their attempts, so that a resubmission
    of the same jobs after their lease expired adopts the batch already paid for)."""
    digest = hashlib.sha256("\n".join([batch_key, *sorted(str(j) for j in job_ids)]).encode()).hexdigest()
    return f"triage-{digest[:40]}"


def submit(
    store: JobStore,
    ledger: BatchLedger,
    client: BatchClient,
    payloads: PayloadStore,
    *,
    batch_key: str,
    owner: str,
    limit: int = 10_000,
    lease_seconds: float = 600.0,
) -> list[str]:
    """Submit the run's claimable classify jobs, ``limit`` to a batch; the submissions' keys."""
    version = client.classifier.version
    keys: list[str] = []
    _settle_unaccepted(ledger, client, batch_key, owner)
    while True:
        claim = store.claim(
            batch_key=batch_key,
            step=Step.CLASSIFY,
            limit=limit,
            lease_seconds=lease_seconds,
            owner=owner,
            classifier_version=version,
        )
        if not claim.jobs:
            return keys
        contents = payloads.get_many([(job.payload_ref, job.content_sha256) for job in claim.jobs])
        # Jobs of a submission still open (a try that died after the provider took them, whose
        # lease then ran out) wait for it again: never in a second batch, never paid twice.
        pending = {job_id for open_batch in ledger.open_batches(batch_key) for job_id, _ in open_batch.jobs}
        outcomes: list[Outcome] = [
            Park(job.id, job.attempt, "batch", BATCH_WINDOW_SECONDS) for job in claim.jobs if job.id in pending
        ]
        submitted: list[tuple[ClaimedJob, str]] = []
        for job, content in zip(claim.jobs, contents, strict=True):
            if job.id in pending:
                continue
            document = read_document(job, content)
            if isinstance(document, DocumentPayload):
                submitted.append((job, document.text))
            else:
                outcomes.append(document)
        if submitted:
            key, row = _open(ledger, batch_key, version, [(job.id, job.attempt) for job, _ in submitted])
            try:
                provider_id = row.provider_batch_id or client.submit(
                    ((f"{job.id}:{job.attempt}", text) for job, text in submitted), key
                )
            except BaseException:
                # The provider did not take them (down, refused): the claim is given back, no
                # attempt spent, and what was already decided (unreadable payloads) recorded.
                store.record(claim, [*outcomes, *(Release(job.id, job.attempt) for job, _ in submitted)])
                raise
            ledger.mark_running(key, provider_id)
            outcomes += [Park(job.id, job.attempt, "batch", BATCH_WINDOW_SECONDS) for job, _ in submitted]
            keys.append(key)
            log.info(
                "batch=%s submitted %d jobs as provider batch %s (%s)", batch_key, len(submitted), provider_id, key
            )
        store.record(claim, outcomes)


def _settle_unaccepted(ledger: BatchLedger, client: BatchClient, batch_key: str, actor: str) -> int:
    """The run's submissions whose provider id was never recorded (a try that failed or died
    around the provider's answer): adopted if the provider has a batch of that name, else
    ``lost`` (the provider never took it: its jobs may be submitted again); how many were lost.
    One that a live try is still submitting (its jobs leased) is left to it."""
    lost = 0
    for submission in ledger.unaccepted(batch_key):
        found = client.find(submission.key)
        if found is not None:
            ledger.mark_running(submission.key, found)
        else:
            ledger.finish(submission.key, "lost", [], actor)
            lost += 1
    return lost


def _open(
    ledger: BatchLedger, batch_key: str, version: str, submitted: list[tuple[uuid.UUID, int]]
) -> tuple[str, Submission]:
    """The open submission of these jobs: adopted while it is open; once it is finished (the same
    jobs submitted again, e.g. after the window's backstop), a new one named ``<key>.<n>``."""
    base = submission_key(batch_key, [job_id for job_id, _ in submitted])
    for n in range(1000):
        key = base if n == 0 else f"{base}.{n}"
        row = ledger.open_submission(key, batch_key, version, submitted)
        if row.status in ("submitting", "running"):
            return key, row
    raise RuntimeError(f"{base} was submitted 1000 times")


@dataclass(frozen=True, slots=True)
class Collected:
    running: int = 0
    collected: int = 0
    lost: int = 0
    answers: int = 0
    due: int = 0


def collect(ledger: BatchLedger, client: BatchClient, *, batch_key: str, actor: str) -> Collected:
    """Ask the provider about the run's open submissions; record what is done or lost."""
    running = collected = answers = due = 0
    lost = _settle_unaccepted(ledger, client, batch_key, actor)  # the provider never accepted it (or we never heard)
    for submission in ledger.open_batches(batch_key):
        if submission.provider_batch_id is None:  # a live try is submitting it (left unsettled above)
            running += 1
            continue
        state = client.state(submission.provider_batch_id)
        if state.phase == "running":
            running += 1
            continue
        rows = []
        if state.phase == "done":
            custom_ids = [f"{job_id}:{attempt}" for job_id, attempt in submission.jobs]
            for (job_id, attempt), result in zip(submission.jobs, client.results(state, custom_ids), strict=True):
                if result.output is None and result.error is None:
                    continue  # lost inside an expired batch: asked again
                error_class = result.error.error_class if result.error is not None else None
                rows.append(_answer_row(job_id, attempt, result.output, error_class))
        due += ledger.finish(submission.key, "collected" if state.phase == "done" else "lost", rows, actor)
        answers += sum(1 for r in rows if r["error_class"] is None)
        collected, lost = collected + (state.phase == "done"), lost + (state.phase == "lost")
        log.info("batch=%s provider batch %s %s: %d answers", batch_key, state.batch_id, state.status, len(rows))
    return Collected(running, collected, lost, answers, due)


def _answer_row(
    job_id: uuid.UUID, attempt: int, output: ModelOutput | None, error_class: str | None
) -> dict[str, object]:
    return {
        "job_id": job_id,
        "attempt": attempt,
        "label": output.label if output else None,
        "confidence": output.confidence if output else None,
        "rejected_reason": output.rejected_reason if output else None,
        "output_mode": output.output_mode if output else None,
        "prompt_tokens": output.prompt_tokens if output else None,
        "completion_tokens": output.completion_tokens if output else None,
        "error_class": error_class,
    }


def answers_within_budget(jobs: Sequence[ClaimedJob], rows: Sequence[Any]) -> dict[uuid.UUID, Any]:
    """The batch answer (row) each claimed job takes: the latest one asked within its current
    attempt budget, ``attempt_base < asked <= attempt`` (a failed request: none; ``rows`` by
    attempt). Not only at the claim's own attempt: a submission adopted after the jobs' first
    lease ran out (that attempt counted, the next one claimed) is answered at the attempt it was
    submitted at, and is not paid for again; a reviewer's requeue starts a new budget, so the
    model is asked afresh."""
    budgets = {job.id: (job.attempt, job.attempt_base) for job in jobs}
    found: dict[uuid.UUID, Any] = {}
    for row in rows:  # by attempt: the latest within the budget wins
        attempt, base = budgets[row.job_id]
        if base < row.attempt <= attempt:
            found[row.job_id] = row
    return found


def given_answers(ledger: BatchLedger) -> Callable[[Sequence[ClaimedJob]], Mapping[uuid.UUID, ModelOutput]]:
    """The classify handler's ``given``: a claim's batch answers at the jobs' attempts."""

    def given(jobs: Sequence[ClaimedJob]) -> Mapping[uuid.UUID, ModelOutput]:
        rows = answers_within_budget(jobs, ledger.answers(job.id for job in jobs))
        return {
            job_id: ModelOutput(
                r.label,
                r.confidence or 0.0,
                r.rejected_reason,
                0.0,
                r.prompt_tokens,
                r.completion_tokens,
                output_mode=r.output_mode,
            )
            for job_id, r in rows.items()
        }

    return given
