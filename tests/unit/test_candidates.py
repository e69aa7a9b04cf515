"""The candidate labels an answer carries (issue #27, item 6): what the reviewer sees beside the
document and what orders the queue by uncertainty. No database."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_learned_model import TEXTS, examples
from triage.classifiers.base import MAX_CANDIDATES, ClassifyRequest, ModelOutput
from triage.classifiers.keyword import KeywordClassifier, keyword_candidates, keyword_confidence
from triage.classifiers.learned import LearnedClassifier
from triage.classifiers.taxonomy import Label, Taxonomy
from triage.learning.registry import LoadedModel
from triage.learning.training import TrainSettings, fit

TAXONOMY = Taxonomy(
    labels=(
        Label(name="billing", description="bills", keywords=("invoice", "charged twice", "receipt")),
        Label(name="shipping", description="parcels", keywords=("parcel", "tracking number")),
        Label(name="refund_request", description="refunds", keywords=("refund", "money back")),
        Label(name="account_access", description="logins", keywords=("password", "log in")),
    )
)


def request(text: str) -> ClassifyRequest:
    return ClassifyRequest("job", "ext", "key", "corr", 1, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("nothing to see", [], id="no-hit-no-candidates"),
        pytest.param("my invoice", ["billing"], id="one-label"),
        pytest.param("invoice and receipt for my parcel", ["billing", "shipping"], id="best-first"),
        pytest.param("parcel invoice", ["billing", "shipping"], id="tie-in-taxonomy-order"),
        pytest.param("invoice parcel refund password", ["billing", "shipping", "refund_request"], id="at-most-three"),
    ],
)
def test_keyword_candidates_are_the_labels_it_hit_best_first(text: str, expected: list[str]) -> None:
    output = KeywordClassifier(TAXONOMY).classify(request(text))
    assert [name for name, _ in output.candidates] == expected
    scores = [score for _, score in output.candidates]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 < s <= 1.0 for s in scores)
    if expected:
        assert output.label == expected[0]
        assert output.candidates[0][1] == pytest.approx(output.confidence, abs=1e-4)  # the answer's own confidence


def test_keyword_candidates_score_each_label_as_the_confidence_scores_the_best() -> None:
    names = ("a", "b", "c", "d")
    scores = [2.0, 1.0, 0.0, 1.5]
    ranked = keyword_candidates(names, scores)
    assert [n for n, _ in ranked] == ["a", "d", "b"]
    _, confidence = keyword_confidence(scores)
    assert ranked[0][1] == pytest.approx(confidence, abs=1e-4)
    assert ranked[2][1] == pytest.approx((1.0 / 4.5) * (1 - 0.35), abs=1e-4)


def learned() -> LearnedClassifier:
    model = fit(examples(120), TrainSettings())
    loaded = LoadedModel("learned-x", "champion", model, {label: 0.5 for label in model.labels}, 0.97)
    taxonomy = Taxonomy(labels=tuple(Label(name=n, description=n) for n in model.labels))
    return LearnedClassifier(loaded, taxonomy)


def test_learned_candidates_are_its_top_probabilities_and_the_first_is_its_answer() -> None:
    classifier = learned()
    model = classifier.loaded.model
    for text in [*TEXTS, "refund my parcel please", "vat receipt"]:
        output = classifier.classify(request(text))
        probabilities = model.probabilities(text)
        assert len(output.candidates) == min(MAX_CANDIDATES, len(model.labels))
        assert (output.label, output.confidence) == model.predict(text)
        assert output.candidates[0][0] == output.label
        order = np.argsort(-probabilities, kind="stable")
        assert [n for n, _ in output.candidates] == [model.labels[i] for i in order[:MAX_CANDIDATES]]
        for name, score in output.candidates:
            assert score == pytest.approx(float(probabilities[model.labels.index(name)]), abs=2e-4)


def test_a_two_label_model_ranks_both_as_it_predicts() -> None:
    data = [e for e in examples(120) if e.label != "refund_request"]
    model = fit(data, TrainSettings())
    assert len(model.labels) == 2
    for text in ["an invoice please", "where is my parcel", "a b c", ""]:
        ranked = model.ranked(text, 3)
        assert [n for n, _ in ranked][:1] == [model.predict(text)[0]]
        assert ranked[0][1] == pytest.approx(model.predict(text)[1])
        assert sum(s for _, s in ranked) == pytest.approx(1.0)


def test_an_answer_holds_at_most_three_candidates() -> None:
    with pytest.raises(ValueError, match="at most 3"):
        ModelOutput("a", 0.5, None, 1.0, candidates=(("a", 0.5), ("b", 0.2), ("c", 0.2), ("d", 0.1)))
