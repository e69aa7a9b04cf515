"""How a classify run is set up, decided once: :func:`plan_classify`, a pure function of the run's
config, the taxonomy and what the deployment's connections say (:class:`ModelAccess`), and the
classifier version retrieval registers jobs under (:func:`run_classifier_version`, the same
function's version, with no classifier built).

The policy lives here, not in the operator: a classifier that calls a model over the network
(:data:`MODEL_CALLING`) runs as many calls at once as the run asks and the task's pool slots
allow, takes the next claim one round of calls ahead, reuses the ledger's answers for repeated
content (when the connection lets it) and takes the answers a provider batch gave; an in-process
classifier (keyword, learned) is CPU-bound and runs one job at a time, since threads would only
contend for the GIL. The adapter (:mod:`triage.adapters.model_api`) reads the connections a plan
needs (:func:`model_needs`); :func:`classify_handler` builds the step's handler from the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from triage.classifiers import Taxonomy, build_classifier, classifier_version
from triage.contracts.run_config import ClassifyRunConfig

if TYPE_CHECKING:
    from triage.classifiers.base import Classifier
    from triage.jobs.store import JobStore
    from triage.payloads import PayloadStore
    from triage.pipeline.classify import ClassifyHandler

MODEL_CALLING = frozenset({"llm"})
"""Classifiers that call a model API: bounded by the pool, cached, batchable."""

NEEDS: Mapping[str, frozenset[str]] = {"llm": frozenset({"model_connection"}), "learned": frozenset({"champion"})}
"""What each classifier needs read from the deployment (:func:`model_needs`)."""


def model_needs(classifier: str) -> frozenset[str]:
    """What the adapter must read for a run of ``classifier`` (a concrete name):
    ``model_connection`` (the ``triage_llm`` connection's settings), ``champion`` (the learned
    registry's champion). Nothing else is read: a keyword run needs no model connection."""
    return NEEDS.get(classifier, frozenset())


@dataclass(frozen=True, slots=True)
class ModelAccess:
    """What the deployment says about the run's classifier, as the adapter read it.

    :param llm_settings: the model connection's classifier settings (base URL, key, model, …, and
        its shared budget when it has one); None: not read, or no connection.
    :param content_cache: whether the connection lets the step reuse answers for repeated content.
    :param champion: the learned registry's champion version; None: not read, or none.
    :param learned: the champion itself, loaded (only where a classifier is built from it).
    """

    llm_settings: Mapping[str, Any] | None = None
    content_cache: bool = True
    champion: str | None = None
    learned: Any = field(default=None, compare=False)
    """A :class:`triage.learning.registry.LoadedModel` (typed loosely: learning/ is a sibling room)."""


@dataclass(frozen=True, slots=True)
class ClassifyPlan:
    """A classify run's set-up, decided by :func:`plan_classify`."""

    classifier: str
    version: str
    classifier_settings: Mapping[str, Any] | None
    """:func:`~triage.classifiers.build_classifier`'s ``llm_settings`` (with the pool's connections)."""
    concurrency: int
    capped: bool
    """The run asked for more calls at once than the task's pool slots allow."""
    claim_ahead: bool
    content_cache: bool
    batch_answers: bool
    separate_persist: bool
    in_chunks: bool
    """Each chunk claimed, classified and completed in one transaction
    (:func:`triage.pipeline.one_transaction.uses_chunks`), not under a lease."""


def _settings(config: ClassifyRunConfig, access: ModelAccess) -> dict[str, Any] | None:
    if config.classifier not in MODEL_CALLING or access.llm_settings is None:
        return None
    return {**access.llm_settings, "max_connections": max(config.concurrency, 1)}


def run_classifier_version(config: ClassifyRunConfig, taxonomy: Taxonomy, access: ModelAccess) -> str:
    """The version the run's classifier has (:func:`triage.classifiers.classifier_version`): no
    client made, no model loaded.

    :raises ValueError: the access lacks what the classifier needs (no model connection, no champion).
    :raises TaxonomyError: keyword rules over a taxonomy with a label without keywords.
    """
    return classifier_version(
        config.classifier, taxonomy=taxonomy, llm_settings=_settings(config, access), champion=access.champion
    )


def plan_classify(
    config: ClassifyRunConfig,
    taxonomy: Taxonomy,
    access: ModelAccess,
    *,
    pool_slots: int = 1,
    separate_persist: bool = False,
    try_number: int = 1,
    chunks_off: bool = False,
) -> ClassifyPlan:
    """The classify step of a run: a pure function of the run's config, the taxonomy, what the
    connections say and the task's pool slots (``separate_persist``: a label action exists, or
    the DAG asked for the persist step; ``try_number``: the task's try, a retry is leased;
    ``chunks_off``: Variable ``triage_classify_in_chunks`` is ``off``)."""
    from triage.pipeline.one_transaction import uses_chunks

    calls = config.classifier in MODEL_CALLING
    concurrency = min(config.concurrency, max(pool_slots, 1)) if calls else 1
    return ClassifyPlan(
        classifier=config.classifier,
        version=run_classifier_version(config, taxonomy, access),
        classifier_settings=_settings(config, access),
        concurrency=concurrency,
        capped=calls and concurrency < config.concurrency,
        claim_ahead=calls,
        content_cache=calls and access.content_cache,
        batch_answers=calls,
        separate_persist=separate_persist,
        in_chunks=uses_chunks(
            config.classifier,
            try_number=try_number,
            separate_persist=separate_persist,
            drill=config.drill,
            switched_off=chunks_off,
        ),
    )


def planned_classifier(
    plan: ClassifyPlan, config: ClassifyRunConfig, taxonomy: Taxonomy, access: ModelAccess
) -> Classifier:
    """The plan's classifier, wrapped in the run's drill when it injects faults."""
    settings = None if plan.classifier_settings is None else dict(plan.classifier_settings)
    return build_classifier(
        plan.classifier, taxonomy=taxonomy, llm_settings=settings, learned=access.learned, drill=config.drill
    )


def classify_handler(
    plan: ClassifyPlan,
    config: ClassifyRunConfig,
    taxonomy: Taxonomy,
    access: ModelAccess,
    store: JobStore,
    payloads: PayloadStore,
) -> ClassifyHandler:
    """The step's handler as ``plan`` says: its classifier (wrapped in the run's drill), the
    content cache and a provider batch's answers where the plan uses them."""
    from triage.pipeline.batch_mode import given_answers
    from triage.pipeline.classify import ClassifyHandler, ClassifySettings
    from triage.pipeline.reuse import ContentCache

    classifier = planned_classifier(plan, config, taxonomy, access)
    cache = ContentCache(store, classifier.version, config.confidence_threshold) if plan.content_cache else None
    return ClassifyHandler(
        classifier,
        payloads,
        ClassifySettings(config.confidence_threshold, plan.concurrency, plan.separate_persist, config.audit_rate),
        cache=cache,
        # Answers a provider batch gave (batch mode, triage.operators.model_batches): no call.
        given=given_answers(store.batches) if plan.batch_answers else None,
    )
