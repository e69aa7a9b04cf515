"""Fault injection around any classifier, for the failure drill (``make chaos``).

Each attempt draws one number with :func:`~triage.contracts.drill.drill_fraction` from
``(seed, idempotency key, attempt)`` and the rates partition ``[0, 1)``::

    [0, t)            -> TransientClassifierError("drill_transient")
    [t, t + p)        -> PermanentClassifierError("drill_permanent")
    [t + p, t + p + i) -> the inner output with confidence 0.05 (inconclusive)
    otherwise         -> the inner output unchanged

Because the attempt is part of the draw, a job that failed transiently on attempt 1 usually
succeeds on attempt 2, as real transient faults do, and a test can predict exactly which jobs
fail. The version is the inner one: a drill must not turn existing work into new work.

``kill_on`` names a poison document (its external id, or the content hash its idempotency key
carries): classifying it SIGKILLs the process, as a segfault or the OOM killer would, before
any fault is drawn. Nothing is recorded and no ``finally`` runs: the claim's lease is all that
is left.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Final

from triage.classifiers.base import (
    Classifier,
    ClassifyRequest,
    ModelOutput,
    PermanentClassifierError,
    TransientClassifierError,
)
from triage.contracts.drill import DrillSettings, drill_fraction

__all__ = ["DRILL_INCONCLUSIVE_CONFIDENCE", "DrillClassifier"]

DRILL_INCONCLUSIVE_CONFIDENCE: Final = 0.05


class DrillClassifier:
    """Wraps ``inner``, injecting the faults of ``settings`` deterministically."""

    def __init__(self, inner: Classifier, settings: DrillSettings) -> None:
        self.inner = inner
        self.settings = settings
        self.version = inner.version

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        """Inject a fault or delegate; see the module docstring for the partition."""
        settings = self.settings
        if settings.kill_on is not None and is_document(request, settings.kill_on):
            os.kill(os.getpid(), signal.SIGKILL)
        draw = drill_fraction(settings.seed, request.idempotency_key, request.attempt)
        threshold = settings.transient_error_rate
        if draw < threshold:
            raise TransientClassifierError(
                "drill_transient", "injected transient failure", retry_after=settings.retry_after_seconds
            )
        threshold += settings.permanent_error_rate
        if draw < threshold:
            raise PermanentClassifierError("drill_permanent", "injected permanent failure")
        threshold += settings.inconclusive_rate
        output = self.inner.classify(request)
        if draw < threshold:
            return dataclasses.replace(output, confidence=DRILL_INCONCLUSIVE_CONFIDENCE)
        return output

    def close(self) -> None:
        """Close the inner classifier."""
        self.inner.close()


def is_document(request: ClassifyRequest, name: str) -> bool:
    """Whether ``name`` is the request's external id or its content hash (the idempotency key's
    ``/sha256/`` segment, see :func:`triage.pipeline.retrieve.idempotency_key`)."""
    return request.external_id == name or f"/{name}/" in request.idempotency_key
