"""The classify step: read each payload, call the classifier, turn the result into an outcome.

Failures are classified, never just "exception":

=============================  ==========================================================
what happened                  outcome
=============================  ==========================================================
accepted (≥ threshold)         ``completed``: label, classification and event in one
                               transaction (or ``persist`` first, with an external action)
inconclusive (< threshold)     ``manual_review``, reason ``inconclusive``
rejected (invalid output, or   ``manual_review``, reason ``rejected_output``
a label holding NUL)
transient (timeout, 429, 5xx)  ``retryable_failed`` with backoff, or ``manual_review``
                               (``retries_exhausted``) once attempts run out
no room in the shared budget   ``waiting`` (``outage:rate_limit``, the attempt given back)
(``budget_exhausted``)         until it has room; never counted by the circuit breaker
permanent for the document     ``manual_review``, reason ``permanent_error`` (a person can
(400, other 4xx, drill)        still label it)
malformed payload              ``manual_review``, reason ``malformed_input``
corrupt payload (hash)         ``manual_review``, reason ``payload_corrupt``
payload_ref not of the store's ``manual_review``, reason ``payload_ref_invalid``; nothing is
form under its base            read (:func:`triage.payloads.parse_ref`)
unsupported schema version     ``terminal_failed``, reason ``unsupported_schema_version``
payload gone (the store is     ``manual_review``, reason ``missing_payload``
there, the pack is not)
payload store unreadable       ``retryable_failed``, reason ``payload_unavailable``; counts
(permissions, I/O, network,    towards the circuit breaker
a pack's folder absent)
payload base absent or empty   the store is down, not the job: the batch is parked
(volume not mounted)           (``waiting``, ``outage:payload_store``, no attempt spent) and the
                               step stops with :class:`CircuitOpen`
401, 403, 404, 3xx from the    the call is not the document's fault: the job is released
model, or a refused            and the step stops with :class:`DependencyMisconfigured`
``json_schema`` (not ``auto``)
anything else the classifier   treated as transient (``unexpected_error``): bounded by
raises                         ``max_attempts``, then manual review; never a stuck batch
=============================  ==========================================================

A circuit breaker (:mod:`triage.pipeline.breaker`) watches the calls: when transient failures
dominate, or every call of a smaller try failed with 5xx/timeouts/refused connections across a
few distinct jobs, the model is down (an outage), not the jobs. Every job of the batch that did not finish, the failed calls
included, is parked (:class:`~triage.jobs.vocabulary.models.Park`: ``waiting``, reason ``outage:model``, the
attempt given back) until the model's ``Retry-After`` (bounded) or :data:`OUTAGE_SECONDS`,
doubled for each time the job was parked on an outage before (at most an hour), and
the step stops with :class:`CircuitOpen`, so Airflow retries it later instead of burning every
job's attempts against a dependency that is down; a claim of the batch queues them again once due.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from triage.classifiers.base import (
    Classifier,
    ClassifierError,
    ClassifyRequest,
    ManyClassifier,
    ModelOutput,
    decide_outcome,
)
from triage.classifiers.rate_limits import BUDGET_EXHAUSTED
from triage.contracts.documents import DocumentPayload
from triage.jobs.sql.audit_samples import is_audit_sample
from triage.jobs.vocabulary.models import (
    Advance,
    ClaimedJob,
    ClassificationRecord,
    Complete,
    LabelWrite,
    Outcome,
    Park,
    Release,
    RetryLater,
    SendToReview,
)
from triage.jobs.vocabulary.states import Step
from triage.observability import log_job
from triage.payloads import PayloadBaseMissing, PayloadError, PayloadStore
from triage.pipeline.breaker import DEPENDENCY_DOWN, CircuitBreaker, OutageGuard
from triage.pipeline.ownership import Ownership
from triage.pipeline.reading import read_document
from triage.pipeline.reuse import ContentCache, input_key
from triage.pipeline.steps import CircuitOpen, DependencyMisconfigured, StepError

log = logging.getLogger(__name__)

MISCONFIGURED = frozenset({"unauthorized", "forbidden", "not_found", "redirected", "structured_output_unsupported"})

OUTAGE_SECONDS = 30.0
"""Parked on an outage without a ``Retry-After``: about the classify task's first retry delay."""
MAX_RETRY_AFTER_SECONDS = 900.0
"""The longest ``Retry-After`` honoured (the task's longest retry delay): a hint, not a licence."""


def bounded_retry_after(seconds: float | None) -> float | None:
    """A model's ``Retry-After`` within [0, :data:`MAX_RETRY_AFTER_SECONDS`]; None if it gave none."""
    return None if seconds is None else min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


@dataclass(frozen=True, slots=True)
class ClassifySettings:
    """:param separate_persist: accepted jobs advance to the ``persist`` step (which runs the
    external action) instead of being completed here, label and event in the same
    transaction as the classification.
    :param audit_rate: share of accepted jobs completed as audit samples (the run's
        ``audit_rate``; :func:`triage.jobs.sql.audit_samples.is_audit_sample`). Completed here or by
        the persist step, whichever completes them."""

    confidence_threshold: float = 0.7
    concurrency: int = 1
    separate_persist: bool = False
    audit_rate: float = 0.0


def _record(
    output: ModelOutput, outcome: str, version: str, key: str, reused_from: tuple[uuid.UUID, int] | None
) -> ClassificationRecord:
    return ClassificationRecord(
        label=output.label,
        confidence=output.confidence,
        outcome=outcome,  # type: ignore[arg-type]
        classifier_version=version,
        rejected_reason=output.rejected_reason,
        latency_ms=output.latency_ms,
        prompt_tokens=output.prompt_tokens,
        completion_tokens=output.completion_tokens,
        cost_usd=output.cost_usd,
        usage_discarded=",".join(output.usage_discarded) or None,
        output_mode=output.output_mode,
        input_sha256=key,
        reused_from=reused_from,
        candidates=output.candidates or None,
    )


class ClassifyHandler:
    """:class:`~triage.pipeline.steps.StepHandler` of the ``classify`` step."""

    step = Step.CLASSIFY

    def __init__(
        self,
        classifier: Classifier,
        payloads: PayloadStore,
        settings: ClassifySettings,
        breaker: CircuitBreaker | None = None,
        cache: ContentCache | None = None,
        given: Callable[[Sequence[ClaimedJob]], Mapping[uuid.UUID, ModelOutput]] | None = None,
    ) -> None:
        """:param cache: the content cache (:mod:`triage.pipeline.reuse`); None: every job is asked.
        :param given: the answers a claim's jobs already have (a provider batch's, :mod:`.batch_mode`)."""
        self.classifier, self.payloads, self.settings, self.cache = classifier, payloads, settings, cache
        self.given = given
        self.breaker = breaker or CircuitBreaker()
        self._misconfigured: str | None = None
        self._store_down: str | None = None
        self._last_transient: tuple[str, str] | None = None  # (error_class, error) of the latest
        self._retry_after: float | None = None  # the longest bounded Retry-After the model sent
        self._outages = OutageGuard()
        self._pool = ThreadPoolExecutor(settings.concurrency, "triage-classify") if settings.concurrency > 1 else None

    @property
    def window(self) -> int:
        """Jobs left to start in a claim when the step takes the next (one round of calls): its
        calls queue behind these on the one pool (:mod:`triage.pipeline.claim_ahead`); 0 without
        a pool (one call at a time: a second claim handled meanwhile would call beside it)."""
        return self.settings.concurrency if self._pool is not None else 0

    @property
    def classifier_version(self) -> str:
        """Claims take only the jobs registered for this classifier's version."""
        return self.classifier.version

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.classifier.close()

    def handle(self, jobs: Sequence[ClaimedJob], ownership: Ownership | None = None) -> list[Outcome]:
        if self._misconfigured:
            return [Release(job.id, job.attempt) for job in jobs]
        if self.outage() is not None:
            return [self.park(job.id, job.attempt) for job in jobs]
        # The batch's payloads in one pass: a claimed batch is mostly a run of one pack.
        contents = self.payloads.get_many([(job.payload_ref, job.content_sha256) for job in jobs])
        down = next((c for c in contents if isinstance(c, PayloadBaseMissing)), None)
        if down is not None:
            # No payload of the store can be read (its volume is not mounted): not one job's
            # failure, so no job spends an attempt on it. The batch is parked and the step
            # stops as for an open circuit: Airflow retries it later.
            self._store_down = str(down)
            self._last_transient = (down.error_class, str(down))
            return [self.park(job.id, job.attempt) for job in jobs]

        self.breaker.claimed(job.id for job in jobs)
        given = dict(self.given(jobs)) if self.given is not None else {}
        # Each payload is parsed once: the content cache's keys, a one-pass classifier and the
        # calls read the same documents.
        documents = [read_document(job, content) for job, content in zip(jobs, contents, strict=True)]
        answered = self._answer_claim(jobs, documents)

        def one(index: int) -> Outcome:  # no model call once the job is not ours
            job, document = jobs[index], documents[index]
            if ownership is None:
                return self._answer(job, document, given, answered)
            return ownership.attempt(job, lambda: self._answer(job, document, given, answered))

        # The content cache asks one job of each content first; the others then take its answer.
        waves = self.cache.split(jobs, documents) if self.cache is not None else (range(len(jobs)),)
        by_index: dict[int, Outcome] = {}
        try:
            for n, wave in enumerate(waves):
                if n and self.cache is not None:  # repeats: of this claim's calls, or another's
                    self.cache.wait(jobs[i] for i in wave)
                done = list(map(one, wave)) if self._pool is None else self._in_pool(one, wave)
                by_index.update(zip(wave, done, strict=True))
                if self.cache is not None:
                    self.cache.learn([jobs[i] for i in wave], done)
        finally:
            if self.cache is not None:
                self.cache.forget(jobs)
        outcomes = [by_index[i] for i in range(len(jobs))]
        return self._outages.settle(outcomes, self.outage() is not None, self.park)

    def _answer_claim(
        self, jobs: Sequence[ClaimedJob], documents: Sequence[DocumentPayload | Outcome]
    ) -> dict[uuid.UUID, ModelOutput]:
        """The answers of a :class:`~triage.classifiers.base.ManyClassifier` (the learned model)
        for the claim's readable documents, in one pass: the jobs then take them where they would
        call it (after the content cache, which still wins). Answers cost nothing outside this
        process, so one computed for a job that is then not ours, or reused, is only dropped.
        Empty for any other classifier, or with a pool of calls."""
        if self._pool is not None or not isinstance(self.classifier, ManyClassifier):
            return {}
        readable = [
            (job.id, document)
            for job, document in zip(jobs, documents, strict=True)
            if isinstance(document, DocumentPayload)
        ]
        if not readable:
            return {}
        requests = [ClassifyRequest("", "", "", "", 1, document.text) for _, document in readable]
        try:
            outputs = self.classifier.classify_many(requests)
        except Exception:  # noqa: BLE001 - degraded, not failed: each job is then asked alone (_answer)
            return {}
        return {job_id: output for (job_id, _), output in zip(readable, outputs, strict=True)}

    def _in_pool(self, one: Callable[[int], Outcome], wave: Sequence[int]) -> list[Outcome]:
        """``one`` over ``wave`` on the pool, each call in a copy of this thread's context: the
        current span (the batch's: its model calls are its children) and any bound log fields."""
        assert self._pool is not None
        calls = [self._pool.submit(contextvars.copy_context().run, one, i) for i in wave]
        return [call.result() for call in calls]

    def outage(self) -> str | None:
        """The dependency that is down (``model``, ``payload_store``), or None."""
        if self._store_down:
            return "payload_store"
        return "model" if self.breaker.is_open else None

    def outage_delay(self) -> float:
        """How long to park on the outage: the model's ``Retry-After`` if it sent one, else
        :data:`OUTAGE_SECONDS`."""
        return self._retry_after if self._retry_after is not None else OUTAGE_SECONDS

    def park(self, job_id: uuid.UUID, attempt: int) -> Park:
        error_class, error = self._last_transient or (None, None)
        return Park(
            job_id,
            attempt,
            self.outage() or "model",
            self.outage_delay(),
            error_class,
            error,
            backoff=self._retry_after is None,  # the model's Retry-After is its word, not grown
        )

    def stop_reason(self) -> StepError | None:
        if self._misconfigured:
            return DependencyMisconfigured(f"the classifier refuses every call ({self._misconfigured})")
        error_class, error = self._last_transient or (None, None)
        if self._store_down:
            stop = CircuitOpen(
                f"the payload store is unavailable: {self._store_down}",
                dependency="payload_store",
                delay_seconds=self.outage_delay(),
                error_class=error_class,
                error=error,
            )
        elif self.breaker.is_open:
            stop = CircuitOpen(
                "transient classifier failures dominate the recent calls",
                dependency="model",
                delay_seconds=self.outage_delay(),
                error_class=error_class,
                error=error,
                retry_after=self._retry_after,
            )
        else:
            return None
        stop.give_back = self._outages.give_back()
        return stop

    def _failed(self, job: ClaimedJob, exc: ClassifierError, started: float) -> Outcome:
        if exc.error_class == BUDGET_EXHAUSTED:  # rate limiting is neither the job's failure nor an outage
            return Park(job.id, job.attempt, "rate_limit", exc.retry_after or 1.0, exc.error_class, str(exc))
        if exc.transient:
            self._last_transient = (exc.error_class, str(exc))
            retry_after = bounded_retry_after(exc.retry_after)
            if retry_after is not None:
                self._retry_after = max(self._retry_after or 0.0, retry_after)
            down = exc.error_class in DEPENDENCY_DOWN  # a job that failed before proves nothing
            self.breaker.record(True, dependency_down=down, job=job.id if job.attempt_in_budget == 1 else None)
            return RetryLater(job.id, job.attempt, exc.error_class, str(exc), delay_seconds=retry_after)
        self.breaker.record(False)
        if exc.error_class in MISCONFIGURED:
            self._misconfigured = exc.error_class
            return Release(job.id, job.attempt)
        return SendToReview(
            job.id,
            job.attempt,
            "permanent_error",
            exc.error_class,
            str(exc),
            context={"latency_ms": round((time.perf_counter() - started) * 1000, 1)},
        )

    def _unexpected(self, job: ClaimedJob, exc: Exception) -> Outcome:
        """A classifier raised something it should have classified. The job's attempt fails
        as transient (bounded by ``max_attempts``, then manual review): the batch goes on and
        nothing is stuck under a lease. Logged with its class, never its message (it may echo
        document text)."""
        log_job(log, logging.ERROR, job, "classifier raised unexpectedly error_class=%s", type(exc).__name__)
        self.breaker.record(True)
        return RetryLater(job.id, job.attempt, "unexpected_error", type(exc).__name__)

    def one(
        self,
        job: ClaimedJob,
        content: bytes | PayloadError,
        given: Mapping[uuid.UUID, ModelOutput] | None = None,
        answered: Mapping[uuid.UUID, ModelOutput] | None = None,
    ) -> Outcome:
        """The outcome of one job's attempt, given its payload (or the error reading it), the
        answers its claim already has (``given``: a provider batch's, taken before the content
        cache) and the classifier's answers computed for the claim in one pass (``answered``:
        taken where the classifier would be called); never raises for the job's own failures."""
        return self._answer(job, read_document(job, content), given, answered)

    def _answer(
        self,
        job: ClaimedJob,
        document: DocumentPayload | Outcome,
        given: Mapping[uuid.UUID, ModelOutput] | None,
        answered: Mapping[uuid.UUID, ModelOutput] | None = None,
    ) -> Outcome:
        """:meth:`one` for a payload already read (:func:`~triage.pipeline.reading.read_document`):
        the document, or the outcome that reading it failed with."""
        if self._misconfigured:
            return Release(job.id, job.attempt)
        if self.outage() is not None:
            return self.park(job.id, job.attempt)
        if not isinstance(document, DocumentPayload):
            if isinstance(document, RetryLater):  # the store failed: a transient call like any other
                self._last_transient = (document.error_class, document.error or document.error_class)
                self.breaker.record(True)
            return document
        key = input_key(document)
        if given and (output := given.get(job.id)) is not None:  # answered by a provider batch: no call
            return self._decided(job, output, key)
        if self.cache is not None and (answer := self.cache.answer(job)) is not None:
            reused = ModelOutput(answer.label, answer.confidence, None, 0.0, 0, 0, 0.0, output_mode=answer.output_mode)
            return self._decided(job, reused, key, (answer.job_id, answer.attempt))
        started = time.perf_counter()
        try:
            output = answered.get(job.id) if answered else None
            if output is None:  # the request only when the classifier is called (~1.5 µs a job)
                output = self.classifier.classify(
                    ClassifyRequest(
                        job_id=str(job.id),
                        external_id=job.external_id,
                        idempotency_key=job.idempotency_key,
                        correlation_id=job.correlation_id,
                        attempt=job.attempt,
                        text=document.text,
                    )
                )
        except ClassifierError as exc:
            return self._failed(job, exc, started)
        except Exception as exc:  # noqa: BLE001 - the named degraded path: see _unexpected
            return self._unexpected(job, exc)
        self.breaker.record(False)
        if output.usage_discarded:  # recorded with the classification; the outcome stands
            discarded = ",".join(output.usage_discarded)
            log_job(log, logging.WARNING, job, "model reported usage out of bounds discarded=%s", discarded)
        if output.label is not None and "\x00" in output.label:
            # PostgreSQL text cannot hold NUL: the label could never be stored, so the output
            # is unusable, like any other malformed model output (manual review, not a crash).
            output = dataclasses.replace(output, label=None, rejected_reason="label_not_storable")
        return self._decided(job, output, key)

    def _decided(
        self, job: ClaimedJob, output: ModelOutput, key: str, reused_from: tuple[uuid.UUID, int] | None = None
    ) -> Outcome:
        """The outcome of an answer, the classifier's own or one the content cache reused."""
        version = self.classifier.version
        outcome = decide_outcome(output, self.settings.confidence_threshold)
        record = _record(output, outcome, version, key, reused_from)
        if outcome == "accepted":
            if self.settings.separate_persist:
                return Advance(job.id, job.attempt, Step.PERSIST, classification=record)
            label = LabelWrite(output.label or "", output.confidence, version)
            audit = is_audit_sample(job.id, self.settings.audit_rate)
            return Complete(job.id, job.attempt, label, classification=record, audit=audit)
        if outcome == "inconclusive":
            # A reused doubtful answer says whose it was: the reviewer sees the same text's answer.
            reused = (
                {} if reused_from is None else {"reused_job_id": str(reused_from[0]), "reused_attempt": reused_from[1]}
            )
            return SendToReview(
                job.id,
                job.attempt,
                "inconclusive",
                "inconclusive",
                None if reused_from is None else f"the answer of job {reused_from[0]} attempt {reused_from[1]} reused",
                classification=record,
                context={
                    "label": output.label,
                    "confidence": output.confidence,
                    # the label's own threshold when the classifier set one; above 1: never accepted
                    "threshold": self.settings.confidence_threshold if output.threshold is None else output.threshold,
                    **reused,
                },
            )
        return SendToReview(
            job.id,
            job.attempt,
            "rejected_output",
            output.rejected_reason,
            None,
            classification=record,
            context={"rejected_reason": output.rejected_reason},
        )
