"""The model API's connection (``triage_llm``) as the classify operators read it: the classifier's
settings, the content cache switch, the shared requests/tokens budget (:func:`model_access`: what
a run's plan needs, :mod:`triage.pipeline.classify_plan`), and the versions a deployment could
run. Every key is described in docs/model-calls.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from triage.adapters.connections import http_url

if TYPE_CHECKING:
    import sqlalchemy as sa

    from triage.classifiers.base import Classifier
    from triage.contracts.run_config import ClassifyRunConfig
    from triage.jobs.store import JobStore
    from triage.pipeline.classify_plan import ModelAccess

BUDGET_KEYS = ("requests_per_minute", "tokens_per_minute", "budget_burst_seconds", "budget_max_wait_seconds")
"""The connection extra's budget keys (docs/model-calls.md)."""


def llm_settings(conn_id: str = "triage_llm") -> dict[str, Any]:
    """The ``OpenAICompatibleClassifier`` settings in an Airflow connection: host is the base URL
    (``http://host:port/v1``), password the API key, extra the model call's settings."""
    conn = BaseHook.get_connection(conn_id)
    extra = conn.extra_dejson or {}
    settings: dict[str, Any] = {
        "base_url": http_url(conn, default_path="/v1").rstrip("/"),
        "api_key": conn.password or None,
        "model": extra.get("model", "gpt-4o-mini"),
    }
    for key, target in (
        ("temperature", "temperature"),
        ("timeout", "timeout_s"),
        ("prompt_version", "prompt_version"),
        ("price_per_1k_prompt", "price_per_1k_prompt"),
        ("price_per_1k_completion", "price_per_1k_completion"),
        ("response_format", "response_format"),
    ):
        if key in extra:
            settings[target] = extra[key]
    return settings


def content_cache_on(conn_id: str = "triage_llm") -> bool:
    """Whether the connection's extra ``content_cache`` (default true) lets the classify step reuse
    an accepted answer of the model for the same content and classifier version."""
    value = (BaseHook.get_connection(conn_id).extra_dejson or {}).get("content_cache", True)
    return value not in (False, "false", "False", "0", 0)


def configured_classifier_versions(llm_conn_id: str = "triage_llm", engine: sa.Engine | None = None) -> frozenset[str]:
    """The version of each classifier a run of this deployment could use now: ``keyword`` (when
    the taxonomy has keywords), ``llm`` when its connection exists, and with ``engine`` (the job
    database) the learned champion when there is one. A queued job of any other version is
    claimed by no run. Versions only (:func:`triage.classifiers.classifier_version`): no client
    is made, no model loaded."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from triage.classifiers import CLASSIFIERS, Taxonomy, TaxonomyError, classifier_version

    taxonomy, versions = Taxonomy.load(), set()
    if engine is not None:
        from triage.learning.registry import champion_version

        champion = champion_version(engine)
        if champion is not None:
            versions.add(champion)
    for name in sorted(CLASSIFIERS - {"learned"}):
        try:
            settings = llm_settings(llm_conn_id) if name == "llm" else None
        except AirflowNotFoundException:
            continue
        try:
            versions.add(classifier_version(name, taxonomy=taxonomy, llm_settings=settings))
        except TaxonomyError:  # keyword rules over a taxonomy without keywords: no such run
            continue
    return frozenset(versions)


def connection_budget(engine: sa.Engine, conn_id: str = "triage_llm") -> dict[str, Any]:
    """The classifier settings of the connection's shared budget (its extra's
    ``requests_per_minute``, ``tokens_per_minute``, ``budget_burst_seconds``,
    ``budget_max_wait_seconds``), kept in the job database ``engine``; {} when neither rate is set."""
    from triage.classifiers.budgets import BudgetSettings, ModelBudget
    from triage.jobs.store import JobStore

    extra = BaseHook.get_connection(conn_id).extra_dejson or {}

    def number(key: str) -> float | None:
        value = extra.get(key)
        return None if value in (None, "", 0, "0") else float(value)

    settings = BudgetSettings(
        requests_per_minute=number("requests_per_minute"),
        tokens_per_minute=number("tokens_per_minute"),
        burst_seconds=number("budget_burst_seconds") or 1.0,
    )
    if not settings.enabled:
        return {}
    budget = {"budget": ModelBudget(JobStore(engine).budgets, conn_id, settings)}
    wait = number("budget_max_wait_seconds")
    return budget if wait is None else {**budget, "budget_max_wait_seconds": wait}


def model_access(
    config: ClassifyRunConfig, llm_conn_id: str, store: JobStore | None = None, *, load_model: bool = False
) -> ModelAccess:
    """What the run's classifier needs read from this deployment
    (:func:`triage.pipeline.classify_plan.model_needs`), and nothing else: the model connection's
    settings and content cache switch; the learned registry's champion from ``store``. With
    ``load_model`` (a step that builds the classifier) the loaded champion is kept and the
    connection's shared budget (kept in ``store``) joins the settings; without (retrieval needs
    only the version) the champion is still loaded, so that an artifact that is refused fails the
    run before any job is registered under it.

    :raises AirflowFailException: ``learned`` with no champion (the message names ``triage train``),
        or a champion whose artifact is refused: no retry can help, so the run fails at once.
    """
    from airflow.sdk.exceptions import AirflowFailException

    from triage.learning.model import ArtifactRefused
    from triage.learning.registry import NoChampion, load_champion
    from triage.pipeline.classify_plan import ModelAccess, model_needs

    needs = model_needs(config.classifier)
    settings: dict[str, Any] | None = None
    cache = True
    if "model_connection" in needs:
        settings = llm_settings(llm_conn_id)
        if store is not None and load_model:  # the budget bounds calls: only a classifier that calls needs it
            settings.update(connection_budget(store.engine, llm_conn_id))
        cache = content_cache_on(llm_conn_id)
    champion, loaded = None, None
    if "champion" in needs:
        if store is None:
            raise ValueError("the learned classifier is read from the job database: pass its store")
        try:
            # Loaded even where only its version is needed: retrieval must refuse a champion whose
            # artifact is refused before it registers the day's jobs under it (classify would fail
            # on them, and its failure callback send each one to review).
            verified = load_champion(store.engine)
        except (NoChampion, ArtifactRefused) as exc:
            raise AirflowFailException(str(exc)) from None
        champion, loaded = verified.version, verified if load_model else None
    return ModelAccess(llm_settings=settings, content_cache=cache, champion=champion, learned=loaded)


def build_run_classifier(config: ClassifyRunConfig, llm_conn_id: str, engine: sa.Engine | None = None) -> Classifier:
    """The run's classifier as its plan says (:func:`triage.pipeline.classify_plan.plan_classify`);
    with ``engine`` (the job database), the llm one within the connection's shared budget, if it
    has one. The learned one is the registry's champion, read from ``engine``.

    :raises AirflowFailException: ``learned`` with no champion (the message names ``triage train``),
        or a champion whose artifact is refused.
    """
    from triage.classifiers import Taxonomy
    from triage.jobs.store import JobStore
    from triage.pipeline.classify_plan import plan_classify, planned_classifier

    taxonomy = Taxonomy.load()
    access = model_access(config, llm_conn_id, JobStore(engine) if engine is not None else None, load_model=True)
    return planned_classifier(plan_classify(config, taxonomy, access), config, taxonomy, access)
