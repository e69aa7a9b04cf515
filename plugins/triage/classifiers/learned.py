"""The learned classifier: the registry's champion (or a chosen version), offline, on CPU.

A linear model over word and character n-grams (:mod:`triage.learning.model`), trained from
labelled examples (:mod:`triage.learning.training`). Each answer carries its label's own
threshold (:attr:`~triage.classifiers.base.ModelOutput.threshold`), chosen on held-out data for
the deployment's target precision, which stands instead of the run's ``confidence_threshold``;
a label the model has too few examples of never auto-accepts. The version is the registry's,
so every classification names the model that made it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from triage.classifiers.base import MAX_CANDIDATES, ClassifyRequest, ModelOutput
from triage.classifiers.taxonomy import Taxonomy

if TYPE_CHECKING:
    from triage.learning.registry import LoadedModel

__all__ = ["LearnedClassifier"]


class LearnedClassifier:
    """Classifies with ``loaded`` (a registry version). Thread-safe (the model only reads, and
    its word cache is only added to)."""

    def __init__(self, loaded: LoadedModel, taxonomy: Taxonomy) -> None:
        self.loaded = loaded
        self.version = loaded.version
        self._names = taxonomy.names

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        """The most probable label, its probability and its threshold, and the top
        :data:`~triage.classifiers.base.MAX_CANDIDATES` labels with their probabilities (to four
        places); a label the taxonomy no longer has is a rejected output
        (``label_outside_taxonomy``), as a model's would be."""
        started = time.perf_counter()
        ranked = self.loaded.model.ranked(request.text, MAX_CANDIDATES)
        return self._output(ranked, (time.perf_counter() - started) * 1000.0)

    def classify_many(self, requests: Sequence[ClassifyRequest]) -> list[ModelOutput]:
        """:meth:`classify` of each request, the model's features computed for all of them in one
        pass (:meth:`~triage.learning.model.LinearTextModel.ranked_many`); each answer's latency
        is its share of the pass."""
        started = time.perf_counter()
        ranked = self.loaded.model.ranked_many([request.text for request in requests], MAX_CANDIDATES)
        latency = (time.perf_counter() - started) * 1000.0 / max(len(requests), 1)
        return [self._output(answer, latency) for answer in ranked]

    def _output(self, ranked: list[tuple[str, float]], latency: float) -> ModelOutput:
        label, confidence = ranked[0]
        candidates = tuple((name, round(score, 4)) for name, score in ranked)
        if label not in self._names:
            return ModelOutput(None, confidence, "label_outside_taxonomy", latency, candidates=candidates)
        threshold = self.loaded.threshold(label)
        return ModelOutput(label, confidence, None, latency, threshold=threshold, candidates=candidates)

    def close(self) -> None:
        """Nothing to release."""
