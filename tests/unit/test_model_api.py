"""The model connection as the classify operators read it (triage.adapters.model_api): the shared
budget's keys, and only what a run's classifier needs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from triage.adapters import model_api
from triage.classifiers.budgets import BudgetSettings


@pytest.fixture
def extra(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    values: dict[str, Any] = {}
    hook = SimpleNamespace(get_connection=lambda _conn_id: SimpleNamespace(extra_dejson=values))
    monkeypatch.setattr(model_api, "BaseHook", hook)
    return values


ENGINE = sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:9/none")  # never connected here


@pytest.mark.parametrize(
    ("given", "settings", "wait"),
    [
        pytest.param({}, None, None, id="none"),
        pytest.param({"requests_per_minute": "", "tokens_per_minute": ""}, None, None, id="empty-from-yaml"),
        pytest.param({"requests_per_minute": "3000"}, BudgetSettings(3000.0, None, 1.0), None, id="requests"),
        pytest.param(
            {"tokens_per_minute": 250000, "budget_burst_seconds": "0.5", "budget_max_wait_seconds": 30},
            BudgetSettings(None, 250000.0, 0.5),
            30.0,
            id="tokens-burst-wait",
        ),
    ],
)
def test_connection_budget(
    extra: dict[str, Any], given: dict[str, Any], settings: BudgetSettings | None, wait: float | None
) -> None:
    extra.update(given)
    found = model_api.connection_budget(ENGINE, "triage_llm")
    if settings is None:
        assert found == {}
        return
    assert found["budget"].settings == settings
    assert found["budget"].name == "triage_llm"
    assert found.get("budget_max_wait_seconds") == wait


def test_a_negative_rate_is_refused(extra: dict[str, Any]) -> None:
    extra["requests_per_minute"] = -5
    with pytest.raises(ValueError, match="requests_per_minute"):
        model_api.connection_budget(ENGINE, "triage_llm")


def test_a_keyword_run_reads_no_model_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """model_access reads only what the run's classifier needs: a keyword run works without a
    triage_llm connection (and reads none)."""
    from triage.contracts.run_config import ClassifyRunConfig
    from triage.pipeline.classify_plan import ModelAccess

    def refuse(_conn_id: str) -> None:
        raise AssertionError("a keyword run must not read the model connection")

    monkeypatch.setattr(model_api, "BaseHook", SimpleNamespace(get_connection=refuse))
    assert model_api.model_access(ClassifyRunConfig(classifier="keyword"), "triage_llm") == ModelAccess()


def test_an_llm_run_reads_the_connection_s_settings_and_cache_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from triage.contracts.run_config import ClassifyRunConfig

    conn = SimpleNamespace(
        conn_type="http",
        host="http://127.0.0.1:9/v1",
        port=None,
        schema=None,
        password="k",
        extra_dejson={"model": "m-2", "content_cache": "false", "requests_per_minute": 60},
    )
    monkeypatch.setattr(model_api, "BaseHook", SimpleNamespace(get_connection=lambda _conn_id: conn))
    access = model_api.model_access(ClassifyRunConfig(classifier="llm"), "triage_llm")
    assert access.llm_settings == {"base_url": "http://127.0.0.1:9/v1", "api_key": "k", "model": "m-2"}
    assert access.content_cache is False  # and no budget: retrieval builds no classifier, so needs none
