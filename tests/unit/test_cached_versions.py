"""The content cache's versions, as the ledger's answers index knows them (migration 0036)."""

from __future__ import annotations

from triage.classifiers import Taxonomy
from triage.classifiers.keyword import keyword_version
from triage.classifiers.llm import llm_version
from triage.jobs.schema import CACHED_VERSIONS
from triage.pipeline.classify_plan import MODEL_CALLING


def test_the_index_holds_the_answers_of_every_classifier_the_cache_runs_for() -> None:
    """``classifications_answers_idx`` holds answers whose version begins ``CACHED_VERSIONS``:
    a new model-calling classifier, or a new llm version format, needs the index changed too."""
    taxonomy = Taxonomy.load()
    assert frozenset({"llm"}) == MODEL_CALLING
    assert llm_version(taxonomy, model="m", prompt_version="p9", temperature=0.3).startswith(CACHED_VERSIONS)
    assert not keyword_version(taxonomy).startswith(CACHED_VERSIONS)
    assert not "learned-0123456789ab".startswith(CACHED_VERSIONS)  # triage.learning.training's versions
