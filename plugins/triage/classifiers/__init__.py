"""Classifiers behind one :class:`~triage.classifiers.base.Classifier` protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from triage.classifiers.learned import LearnedClassifier
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
    "LearnedClassifier",
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

CLASSIFIERS: frozenset[str] = frozenset({"keyword", "llm", "learned"})
"""Names accepted by the ``classifier`` param of ``classify_documents``."""

if TYPE_CHECKING:
    from triage.learning.registry import LoadedModel


def build_classifier(
    name: str,
    *,
    taxonomy: Taxonomy,
    llm_settings: dict[str, Any] | None = None,
    drill: DrillSettings | None = None,
    learned: LoadedModel | None = None,
) -> Classifier:
    """Build the classifier called ``name``, wrapped in the drill if it injects faults.

    ``llm_settings`` are the keyword arguments of :class:`OpenAICompatibleClassifier` other
    than the taxonomy (``base_url``, ``api_key``, ``model``, …), typically read from the
    ``triage_llm`` connection by the operator. ``learned`` is the registry version the
    ``learned`` classifier runs (:func:`triage.learning.registry.load_champion`).

    :raises ValueError: for an unknown name, ``llm`` without ``llm_settings``, ``learned``
        without ``learned``.
    """
    classifier: Classifier
    if name == "keyword":
        classifier = KeywordClassifier(taxonomy)
    elif name == "llm":
        if not llm_settings:
            raise ValueError("the llm classifier needs llm_settings (base_url, api_key, model)")
        settings = {"api_key": None, **llm_settings}
        classifier = OpenAICompatibleClassifier(taxonomy=taxonomy, **settings)
    elif name == "learned":
        if learned is None:
            raise ValueError("the learned classifier needs a model: load the champion (triage train makes one)")
        classifier = LearnedClassifier(learned, taxonomy)
    else:
        raise ValueError(f"unknown classifier {name!r}; expected one of {sorted(CLASSIFIERS)}")
    if drill is not None and drill.injects_faults:
        classifier = DrillClassifier(classifier, drill)
    return classifier
