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
from triage.classifiers.keyword import KeywordClassifier, keyword_version
from triage.classifiers.learned import LearnedClassifier
from triage.classifiers.llm import OpenAICompatibleClassifier, check_output_mode, llm_version
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
    "classifier_version",
    "decide_outcome",
    "default_taxonomy_path",
    "keyword_version",
    "llm_version",
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


def classifier_version(
    name: str,
    *,
    taxonomy: Taxonomy,
    llm_settings: dict[str, Any] | None = None,
    champion: str | None = None,
) -> str:
    """The version :func:`build_classifier` would give the classifier called ``name``, as a pure
    function of its settings: no client, no model loaded (retrieval registers jobs under it, and
    a claim takes only jobs of it). ``champion`` is the learned classifier's registry version;
    the drill wraps a classifier without changing its version.

    :raises ValueError: for an unknown name, ``llm`` without ``llm_settings`` or with an output
        mode it does not know, ``learned`` without ``champion``.
    :raises TaxonomyError: ``keyword`` over a taxonomy with a label without keywords.
    """
    if name == "keyword":
        return keyword_version(taxonomy)
    if name == "llm":
        if not llm_settings:
            raise ValueError("the llm classifier needs llm_settings (base_url, api_key, model)")
        check_output_mode(llm_settings.get("response_format", "json_schema"))  # as the classifier refuses it
        named = {k: llm_settings[k] for k in ("prompt_version", "temperature") if k in llm_settings}
        return llm_version(taxonomy, model=llm_settings["model"], **named)
    if name == "learned":
        if champion is None:
            raise ValueError("the learned classifier needs a model: load the champion (triage train makes one)")
        return champion
    raise ValueError(f"unknown classifier {name!r}; expected one of {sorted(CLASSIFIERS)}")
