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
"""

from __future__ import annotations

import dataclasses
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
        draw = drill_fraction(settings.seed, request.idempotency_key, request.attempt)
        threshold = settings.transient_error_rate
        if draw < threshold:
            raise TransientClassifierError("drill_transient", "injected transient failure",
                                           retry_after=settings.retry_after_seconds)  # fmt: skip
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
