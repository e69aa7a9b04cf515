"""Classifiers behind one :class:`~triage.classifiers.base.Classifier` protocol."""

from __future__ import annotations

from typing import Any

from triage.classifiers.base import (
    Classifier,
    ClassifierError,
    ClassifyRequest,
    ModelOutput,
    Outcome,
    PermanentClassifierError,
    TransientClassifierError,
    decide_outcome,
)
from triage.classifiers.drill import DrillClassifier
from triage.classifiers.keyword import KeywordClassifier
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.classifiers.taxonomy import Label, Taxonomy, TaxonomyError, default_taxonomy_path
from triage.contracts.drill import DrillSettings

__all__ = [
    "CLASSIFIERS",
    "Classifier",
    "ClassifierError",
    "ClassifyRequest",
    "DrillClassifier",
    "KeywordClassifier",
    "Label",
    "ModelOutput",
    "OpenAICompatibleClassifier",
    "Outcome",
    "PermanentClassifierError",
    "Taxonomy",
    "TaxonomyError",
    "TransientClassifierError",
    "build_classifier",
    "decide_outcome",
    "default_taxonomy_path",
]

CLASSIFIERS: frozenset[str] = frozenset({"keyword", "llm"})
"""Names accepted by the ``classifier`` param of ``classify_documents``."""


def build_classifier(
    name: str,
    *,
    taxonomy: Taxonomy,
    llm_settings: dict[str, Any] | None = None,
    drill: DrillSettings | None = None,
) -> Classifier:
    """Build the classifier called ``name``, wrapped in the drill if it injects faults.

    ``llm_settings`` are the keyword arguments of :class:`OpenAICompatibleClassifier` other
    than the taxonomy (``base_url``, ``api_key``, ``model``, …), typically read from the
    ``triage_llm`` connection by the operator.

    :raises ValueError: for an unknown name, or ``llm`` without ``llm_settings``.
    """
    classifier: Classifier
    if name == "keyword":
        classifier = KeywordClassifier(taxonomy)
    elif name == "llm":
        if not llm_settings:
            raise ValueError("the llm classifier needs llm_settings (base_url, api_key, model)")
        settings = {"api_key": None, **llm_settings}
        classifier = OpenAICompatibleClassifier(taxonomy=taxonomy, **settings)
    else:
        raise ValueError(f"unknown classifier {name!r}; expected one of {sorted(CLASSIFIERS)}")
    if drill is not None and drill.injects_faults:
        classifier = DrillClassifier(classifier, drill)
    return classifier
