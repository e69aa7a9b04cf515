"""The model connection (``triage_llm``) as the classify operators read it: the classifier's
settings, the content cache switch, the shared requests/tokens budget, the versions a deployment
could run. Every key is described in docs/model-calls.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from triage.operators.base import http_url

if TYPE_CHECKING:
    import sqlalchemy as sa

    from triage.classifiers.base import Classifier
    from triage.contracts.run_config import ClassifyRunConfig

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
    claimed by no run."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from triage.classifiers import CLASSIFIERS, Taxonomy, TaxonomyError, build_classifier

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
            classifier = build_classifier(name, taxonomy=taxonomy, llm_settings=settings)
        except TaxonomyError:  # keyword rules over a taxonomy without keywords: no such run
            continue
        versions.add(classifier.version)
        classifier.close()
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


def build_run_classifier(config: ClassifyRunConfig, llm_conn_id: str, engine: sa.Engine | None = None) -> Classifier:
    """The run's classifier; with ``engine`` (the job database), the llm one within the
    connection's shared budget, if it has one. The learned one is the registry's champion,
    read from ``engine``.

    :raises AirflowFailException: ``learned`` with no champion (the message names ``triage train``),
        or a champion whose artifact is refused.
    """
    from triage.classifiers import Taxonomy, build_classifier

    settings = None
    if config.classifier == "learned":
        from triage.learning.registry import load_champion

        if engine is None:
            raise ValueError("the learned classifier is read from the job database: pass its engine")
        from airflow.sdk.exceptions import AirflowFailException

        from triage.learning.model import ArtifactRefused
        from triage.learning.registry import NoChampion

        try:
            champion = load_champion(engine)
        except (NoChampion, ArtifactRefused) as exc:  # no retry can help: fail the run at once, saying why
            raise AirflowFailException(str(exc)) from None
        return build_classifier("learned", taxonomy=Taxonomy.load(), learned=champion, drill=config.drill)
    if config.classifier == "llm":
        settings = {**llm_settings(llm_conn_id), "max_connections": max(config.concurrency, 1)}
        if engine is not None:
            settings.update(connection_budget(engine, llm_conn_id))
    return build_classifier(config.classifier, taxonomy=Taxonomy.load(), llm_settings=settings, drill=config.drill)
