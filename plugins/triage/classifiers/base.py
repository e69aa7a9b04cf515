"""What every classifier takes, returns and raises, and how an output becomes an outcome.

Three kinds of result, kept apart on purpose because the job ledger routes them differently:

* a :class:`ModelOutput` with a label and enough confidence: ``accepted`` (the job completes);
* a :class:`ModelOutput` that is unusable (``rejected_reason`` set) or not confident enough:
  ``rejected`` / ``inconclusive``, which go to manual review, never to the retry loop, since
  asking the same model the same question again is not expected to help;
* a :class:`ClassifierError`: the call itself failed; ``transient`` ones are retried with
  backoff, permanent ones go to manual review at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "MAX_CANDIDATES",
    "Classifier",
    "ClassifierError",
    "ClassifyRequest",
    "ManyClassifier",
    "ModelOutput",
    "Outcome",
    "PermanentClassifierError",
    "TransientClassifierError",
    "decide_outcome",
]

Outcome = Literal["accepted", "inconclusive", "rejected"]
"""The value of ``triage.classifications.outcome``."""

MAX_CANDIDATES = 3
"""The most candidate labels an answer keeps (``triage.classifications.candidates`` holds no more)."""


@dataclass(frozen=True, slots=True)
class ClassifyRequest:
    """One classification attempt of one job.

    The ids travel with the request so a classifier can label outbound calls (headers, logs)
    without ever needing the document text for that.
    """

    job_id: str
    external_id: str
    idempotency_key: str
    correlation_id: str
    attempt: int
    text: str


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """What a classifier concluded; never raised, always recorded in ``classifications``.

    ``label`` is ``None`` when the classifier found no label (inconclusive) or its output was
    unusable (``rejected_reason`` set, e.g. ``invalid_json``, ``schema_mismatch``,
    ``label_outside_taxonomy``).
    """

    label: str | None
    confidence: float
    rejected_reason: str | None
    latency_ms: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    usage_discarded: tuple[str, ...] = ()
    """Usage figures the model reported out of bounds (:mod:`triage.contracts.usage`), left out above."""
    output_mode: str | None = None
    """How the answer's shape was asked for (``json_schema``, ``json_object``); None: no model."""
    threshold: float | None = None
    """The confidence this answer's label needs to be accepted, when the classifier chose it for
    its label (the learned classifier's per-label thresholds, set for the deployment's target
    precision); it then stands instead of the run's ``confidence_threshold``. Above 1: the label
    never auto-accepts. None: the run's threshold decides."""
    candidates: tuple[tuple[str, float], ...] = ()
    """The labels the classifier weighed most, best first, each with its score in [0, 1] (at most
    :data:`MAX_CANDIDATES`): what a reviewer sees beside the document, and the margin between the
    first two orders the review queue by uncertainty. Empty: the classifier scores one label only
    (an LLM's answer), or found none."""

    def __post_init__(self) -> None:
        # A NaN or out-of-range confidence would compare false against every threshold and
        # slip through as "inconclusive"; refuse it where it is made instead.
        if not (0.0 <= self.confidence <= 1.0):
            raise ValueError("confidence must be within [0, 1]")
        if math.isnan(self.latency_ms) or self.latency_ms < 0.0:
            raise ValueError("latency_ms must be a non-negative number")
        if self.threshold is not None and (math.isnan(self.threshold) or self.threshold < 0.0):
            raise ValueError("threshold must be a non-negative number")
        if len(self.candidates) > MAX_CANDIDATES:
            raise ValueError(f"at most {MAX_CANDIDATES} candidates")
        if not all(0.0 <= score <= 1.0 for _, score in self.candidates):  # NaN fails too
            raise ValueError("candidate scores must be within [0, 1]")


class ClassifierError(Exception):
    """A classification call failed; ``error_class`` is a short code stored on the job.

    The message must not contain document text or credentials: it is stored in
    ``jobs.last_error`` and logged.
    """

    transient: bool = False

    def __init__(self, error_class: str, message: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message or error_class)
        self.error_class = error_class
        self.retry_after = retry_after
        """Seconds the dependency asked to be left alone (``Retry-After``), unbounded; None: not said."""


class TransientClassifierError(ClassifierError):
    """May succeed later (timeout, 429, 5xx, connection reset): retry with backoff."""

    transient = True


class PermanentClassifierError(ClassifierError):
    """Will not succeed by retrying (4xx, refused input): manual review at once."""

    transient = False


@runtime_checkable
class Classifier(Protocol):
    """A classifier behind Triage's one interface.

    ``version`` identifies everything that can change the answer (model, prompt, taxonomy);
    it is part of the idempotency key. ``classify`` is called from a thread pool and must be
    thread-safe. ``close`` releases connections and is idempotent.
    """

    version: str

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        """Classify one document; raise :class:`ClassifierError` only if the call failed."""
        ...

    def close(self) -> None:
        """Release resources (connection pools); safe to call more than once."""
        ...


@runtime_checkable
class ManyClassifier(Classifier, Protocol):
    """A classifier in this process whose answers cost nothing outside it (no call, no budget)
    and that answers many documents in one pass for less than one at a time: the classify step
    asks it for a claim's documents at once (:mod:`triage.pipeline.classify`)."""

    def classify_many(self, requests: Sequence[ClassifyRequest]) -> list[ModelOutput]:
        """:meth:`classify` of each request, in order; raises only as :meth:`classify` would."""
        ...


def decide_outcome(output: ModelOutput, confidence_threshold: float) -> Outcome:
    """Map a model output to the outcome recorded and acted on.

    ``rejected`` wins over everything (the output cannot be trusted at all); a missing label or
    a confidence below the threshold is ``inconclusive``; a confidence equal to the threshold
    is accepted. The threshold is the output's own when the classifier set one
    (:attr:`ModelOutput.threshold`), else ``confidence_threshold``.
    """
    if not (0.0 <= confidence_threshold <= 1.0):
        raise ValueError("confidence_threshold must be within [0, 1]")
    if output.rejected_reason is not None:
        return "rejected"
    threshold = confidence_threshold if output.threshold is None else output.threshold
    if output.label is None or output.confidence < threshold:
        return "inconclusive"
    return "accepted"
