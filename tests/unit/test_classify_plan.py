"""The classify step's plan (triage.pipeline.classify_plan): a pure function of the run's config,
the taxonomy and what the connections say; the classifier version without a classifier built."""

from __future__ import annotations

from typing import Any

import pytest

from triage.classifiers import OpenAICompatibleClassifier, Taxonomy, TaxonomyError, build_classifier
from triage.contracts.run_config import ClassifyRunConfig
from triage.pipeline.classify_plan import ModelAccess, model_needs, plan_classify, run_classifier_version

TAXONOMY = Taxonomy.load()
LLM = {"base_url": "http://127.0.0.1:9/v1", "api_key": None, "model": "m-1", "prompt_version": "p7", "temperature": 0}


def test_the_llm_version_is_computed_without_an_llm_client(monkeypatch: pytest.MonkeyPatch) -> None:
    built = build_classifier("llm", taxonomy=TAXONOMY, llm_settings=LLM)
    expected = built.version
    built.close()

    def no_client(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the version must not build an llm client")

    monkeypatch.setattr(OpenAICompatibleClassifier, "__init__", no_client)
    config = ClassifyRunConfig(classifier="llm")
    assert run_classifier_version(config, TAXONOMY, ModelAccess(llm_settings=LLM)) == expected
    assert plan_classify(config, TAXONOMY, ModelAccess(llm_settings=LLM)).version == expected


def test_the_keyword_and_learned_versions_are_pure_too() -> None:
    keyword = build_classifier("keyword", taxonomy=TAXONOMY).version
    assert run_classifier_version(ClassifyRunConfig(classifier="keyword"), TAXONOMY, ModelAccess()) == keyword
    champion = ModelAccess(champion="learned:abc")
    assert run_classifier_version(ClassifyRunConfig(classifier="learned"), TAXONOMY, champion) == "learned:abc"
    with pytest.raises(ValueError, match="champion"):
        run_classifier_version(ClassifyRunConfig(classifier="learned"), TAXONOMY, ModelAccess())


def test_keyword_rules_over_a_taxonomy_without_keywords_have_no_version() -> None:
    bare = Taxonomy.from_mapping({"labels": [{"name": "billing", "description": "money"}]})
    with pytest.raises(TaxonomyError, match="keywords"):
        run_classifier_version(ClassifyRunConfig(classifier="keyword"), bare, ModelAccess())


@pytest.mark.parametrize(
    ("classifier", "slots", "cache_on", "expected"),
    [
        pytest.param("llm", 8, True, (8, True, True, True, True), id="llm-capped-by-the-pool-slots"),
        pytest.param("llm", 32, False, (16, False, True, False, True), id="llm-within-the-slots-cache-off"),
        pytest.param("keyword", 8, True, (1, False, False, False, False), id="keyword-one-at-a-time"),
        pytest.param("learned", 8, True, (1, False, False, False, False), id="learned-one-at-a-time"),
    ],
)
def test_the_plan_decides_what_the_operator_used_to(
    classifier: str, slots: int, cache_on: bool, expected: tuple[int, bool, bool, bool, bool]
) -> None:
    config = ClassifyRunConfig(classifier=classifier, concurrency=16)  # type: ignore[arg-type]
    access = ModelAccess(llm_settings=LLM, content_cache=cache_on, champion="learned:abc")
    plan = plan_classify(config, TAXONOMY, access, pool_slots=slots)
    assert (plan.concurrency, plan.capped, plan.claim_ahead, plan.content_cache, plan.batch_answers) == expected
    settings = plan.classifier_settings
    assert (settings is not None) == (classifier == "llm")
    if settings is not None:
        assert settings["max_connections"] == 16  # the run's concurrency, as before the plan


@pytest.mark.parametrize(
    ("classifier", "try_number", "separate", "off", "expected"),
    [
        pytest.param("keyword", 1, False, False, True, id="keyword-first-try-in-chunks"),
        pytest.param("learned", 1, False, False, True, id="learned-first-try-in-chunks"),
        pytest.param("keyword", 2, False, False, False, id="a-retry-is-leased"),
        pytest.param("keyword", 1, True, False, False, id="a-separate-persist-is-leased"),
        pytest.param("keyword", 1, False, True, False, id="switched-off"),
        pytest.param("llm", 1, False, False, False, id="model-calls-are-leased"),
    ],
)
def test_the_plan_says_whether_a_try_runs_in_chunks_of_one_transaction(
    classifier: str, try_number: int, separate: bool, off: bool, expected: bool
) -> None:
    config = ClassifyRunConfig(classifier=classifier)  # type: ignore[arg-type]
    access = ModelAccess(llm_settings=LLM, champion="learned:abc")
    plan = plan_classify(config, TAXONOMY, access, separate_persist=separate, try_number=try_number, chunks_off=off)
    assert plan.in_chunks is expected


def test_only_what_a_classifier_needs_is_read() -> None:
    assert model_needs("llm") == {"model_connection"}
    assert model_needs("learned") == {"champion"}
    assert model_needs("keyword") == frozenset()


def test_an_output_mode_the_llm_classifier_refuses_has_no_version() -> None:
    """Retrieval built the llm classifier to read its version, so a connection naming an unknown
    ``response_format`` failed it before any job was registered. The pure version refuses it in
    the same words: else the day's jobs would be registered, classify fail on each try, and its
    failure callback send every one to review."""
    bad = {**LLM, "response_format": "xml"}
    with pytest.raises(ValueError, match="response_format must be one of") as built:
        build_classifier("llm", taxonomy=TAXONOMY, llm_settings=bad)
    with pytest.raises(ValueError, match="response_format") as versioned:
        run_classifier_version(ClassifyRunConfig(classifier="llm"), TAXONOMY, ModelAccess(llm_settings=bad))
    assert str(versioned.value) == str(built.value)
