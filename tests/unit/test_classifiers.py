"""The taxonomy, the keyword classifier, outcomes and the failure drill (no network)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from triage.classifiers import (
    ClassifierError,
    ClassifyRequest,
    DrillClassifier,
    KeywordClassifier,
    ModelOutput,
    OpenAICompatibleClassifier,
    PermanentClassifierError,
    Taxonomy,
    TaxonomyError,
    TransientClassifierError,
    build_classifier,
    decide_outcome,
    default_taxonomy_path,
)
from triage.classifiers import taxonomy as taxonomy_module
from triage.classifiers.base import Classifier
from triage.classifiers.keyword import keyword_confidence
from triage.contracts.documents import DocumentPayload
from triage.contracts.drill import DrillSettings, drill_fraction
from triage.sources import SyntheticSource

DAY = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def taxonomy() -> Taxonomy:
    return Taxonomy.load()


def request(text: str = "", key: str = "key-1", attempt: int = 1) -> ClassifyRequest:
    return ClassifyRequest(
        job_id="job-1", external_id="T-1", idempotency_key=key, correlation_id="corr-1", attempt=attempt, text=text
    )


def output(label: str | None = "billing", confidence: float = 0.9, rejected: str | None = None) -> ModelOutput:
    return ModelOutput(label=label, confidence=confidence, rejected_reason=rejected, latency_ms=1.0)


# -- taxonomy ----------------------------------------------------------------------------------


def test_default_taxonomy_is_realistic(taxonomy: Taxonomy) -> None:
    assert {"billing", "refund_request", "account_access", "bug_report", "shipping", "cancellation"} <= taxonomy.names
    assert 6 <= len(taxonomy.labels) <= 12
    assert all(10 <= len(label.keywords) <= 25 for label in taxonomy.labels)
    assert all(label.description for label in taxonomy.labels)


def test_default_path_points_at_include(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIAGE_TAXONOMY", raising=False)

    assert default_taxonomy_path() == Path(__file__).resolve().parents[2] / "include" / "taxonomy.yaml"


def test_env_overrides_the_default_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    custom = tmp_path / "t.yaml"
    custom.write_text("labels:\n  - name: only\n    description: d\n    keywords: [x]\n")
    monkeypatch.setenv("TRIAGE_TAXONOMY", str(custom))

    assert default_taxonomy_path() == custom
    assert Taxonomy.load().names == frozenset({"only"})


def test_content_hash_ignores_formatting_but_not_content(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    c = tmp_path / "c.yaml"
    a.write_text("labels:\n  - name: x\n    description: d\n    keywords: [Foo  Bar, baz]\n")
    b.write_text("# comment\nlabels: [{name: x, description: d, keywords: ['foo bar', 'BAZ']}]\n")
    c.write_text("labels: [{name: x, description: d, keywords: ['foo bar', 'qux']}]\n")

    assert Taxonomy.load(a).content_hash == Taxonomy.load(b).content_hash
    assert Taxonomy.load(a).content_hash != Taxonomy.load(c).content_hash


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("labels: [", id="not-yaml"),
        pytest.param("- a\n- b\n", id="not-a-mapping"),
        pytest.param("labels: []\n", id="no-labels"),
        pytest.param("labels:\n  - name: Billing\n    description: d\n    keywords: [x]\n", id="name-not-snake-case"),
        pytest.param("labels:\n  - name: x\n    description: ''\n    keywords: [a]\n", id="empty-description"),
        pytest.param("labels:\n  - name: x\n    description: d\n    keywords: [a, ' A ']\n", id="duplicate-keyword"),
        pytest.param("labels:\n  - name: x\n    description: d\n    keywords: [a, 3]\n", id="keyword-not-string"),
        pytest.param(
            "labels:\n  - {name: x, description: d, keywords: [a]}\n  - {name: x, description: e, keywords: [b]}\n",
            id="duplicate-name",
        ),
        pytest.param("labels:\n  - {name: x, description: d, keywords: [a], colour: red}\n", id="extra-field"),
        pytest.param("schema_version: 2\nlabels:\n  - {name: x, description: d, keywords: [a]}\n", id="version"),
    ],
)
def test_malformed_taxonomy_raises_typed_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "taxonomy.yaml"
    path.write_text(text)

    with pytest.raises(TaxonomyError):
        Taxonomy.load(path)


@pytest.mark.parametrize("keywords", [pytest.param("    keywords: []\n", id="empty"), pytest.param("", id="absent")])
def test_labels_without_keywords_load_and_the_keyword_classifier_refuses_them(tmp_path: Path, keywords: str) -> None:
    """The learned and llm classifiers need no keywords; keyword rules without any could never match."""
    path = tmp_path / "taxonomy.yaml"
    path.write_text(
        "labels:\n  - name: x\n    description: d\n"
        + keywords
        + "  - name: y\n    description: e\n    keywords: [why]\n"
    )
    taxonomy = Taxonomy.load(path)
    assert taxonomy.names == {"x", "y"}
    with pytest.raises(TaxonomyError, match="keywords for every label; x has none"):
        KeywordClassifier(taxonomy)


def test_missing_taxonomy_file_raises_typed_error(tmp_path: Path) -> None:
    with pytest.raises(TaxonomyError, match="cannot read"):
        Taxonomy.load(tmp_path / "missing.yaml")


def test_a_taxonomy_is_read_as_plain_data_only(tmp_path: Path) -> None:
    """libyaml's parser (when PyYAML has it) under the safe constructor: a tag that would run code is refused."""
    path = tmp_path / "taxonomy.yaml"
    path.write_text("labels: !!python/object/apply:os.getpid []\n")
    with pytest.raises(TaxonomyError, match="not valid YAML"):
        Taxonomy.load(path)


def test_the_default_taxonomy_reads_the_same_with_and_without_libyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(taxonomy_module, "_YAML_LOADER", yaml.SafeLoader)  # PyYAML's pure-Python parser
    pure = Taxonomy.load()
    monkeypatch.undo()
    assert Taxonomy.load() == pure


# -- keyword classifier ------------------------------------------------------------------------


def test_keyword_version_carries_the_taxonomy_hash(taxonomy: Taxonomy) -> None:
    classifier = KeywordClassifier(taxonomy)

    assert classifier.version == f"keyword-v1+tax-{taxonomy.content_hash[:8]}"
    assert isinstance(classifier, Classifier)


@pytest.mark.parametrize(
    ("text", "label"),
    [
        pytest.param("I was charged twice, please check the invoice.", "billing", id="billing"),
        pytest.param("I still have not received my REFUND. I want my money back!", "refund_request", id="refund"),
        pytest.param("I can't log in: the password reset link has expired.", "account_access", id="apostrophe"),
        pytest.param("Two-factor codes never arrive, I'm locked out.", "account_access", id="hyphen"),
        pytest.param("The app crashes, steps to reproduce below.", "bug_report", id="bug"),
        pytest.param("Where is my package? The tracking numbers don't work.", "shipping", id="plural-phrase"),
        pytest.param("Please cancel my subscription before the auto-renew.", "cancellation", id="cancel"),
        pytest.param("It would be great to have dark mode.", "feature_request", id="feature"),
    ],
)
def test_keyword_classifier_labels_clear_tickets(taxonomy: Taxonomy, text: str, label: str) -> None:
    result = KeywordClassifier(taxonomy).classify(request(text))

    assert result.label == label
    assert result.rejected_reason is None
    assert result.confidence >= 0.6


def test_keyword_classifier_without_hits_is_inconclusive_not_rejected(taxonomy: Taxonomy) -> None:
    result = KeywordClassifier(taxonomy).classify(request("Hello, could you get back to me? Thanks."))

    assert (result.label, result.confidence, result.rejected_reason) == (None, 0.0, None)
    assert decide_outcome(result, 0.5) == "inconclusive"


@pytest.mark.parametrize(
    ("text", "scores"),
    [
        pytest.param("refund", {"refund_request": 1.0}, id="one-word"),
        pytest.param("refund refund REFUND refunds", {"refund_request": 1.0}, id="repeats-count-once"),
        pytest.param("the parcel is in transit", {"shipping": 2.5}, id="phrase-and-word"),
        pytest.param("debugging lessons", {}, id="whole-words-only"),
        pytest.param("transit in, in... transit!", {"shipping": 1.5}, id="punctuation-is-ignored"),
        pytest.param("transit comes in", {}, id="phrase-needs-its-word-order"),
        pytest.param("Please cancel my subscription", {"cancellation": 2.0 + 1.0}, id="phrase-and-its-head"),
    ],
)
def test_keyword_scores(taxonomy: Taxonomy, text: str, scores: dict[str, float]) -> None:
    got = KeywordClassifier(taxonomy).scores(text)

    names = [label.name for label in taxonomy.labels]
    assert {name: score for name, score in zip(names, got, strict=True) if score} == scores


def test_keyword_words_match_whole_words_only(taxonomy: Taxonomy) -> None:
    # "bug" must not match inside "debugging"; "sso" not inside "lessons"
    assert KeywordClassifier(taxonomy).classify(request("debugging lessons")).label is None


@pytest.mark.parametrize(
    ("scores", "best", "confidence"),
    [
        pytest.param([0.0, 0.0], None, 0.0, id="nothing"),
        pytest.param([1.0, 0.0], 0, 0.65, id="one-hit"),
        pytest.param([0.0, 2.0], 1, 1 - 0.35**2, id="two-hits"),
        pytest.param([2.0, 2.0], 0, 0.5 * (1 - 0.35**2), id="tie-goes-to-first"),
        pytest.param([1.0, 3.0], 1, 0.75 * (1 - 0.35**3), id="ambiguous"),
    ],
)
def test_keyword_confidence(scores: list[float], best: int | None, confidence: float) -> None:
    got_best, got_confidence = keyword_confidence(scores)

    assert got_best == best
    assert got_confidence == pytest.approx(confidence)


def test_keyword_accuracy_on_synthetic_tickets(taxonomy: Taxonomy) -> None:
    classifier = KeywordClassifier(taxonomy)
    labelled = list(SyntheticSource(3000, seed=11, taxonomy=taxonomy).read_labelled(DAY, DAY + timedelta(days=1)))
    results = [
        (classifier.classify(request(DocumentPayload.from_bytes(d.content).text)), label) for d, label in labelled
    ]

    correct = sum(result.label == label for result, label in results) / len(results)
    confident_correct = sum(
        result.label == label and decide_outcome(result, 0.7) == "accepted" for result, label in results
    ) / len(results)
    confident_wrong = sum(
        result.label != label and decide_outcome(result, 0.7) == "accepted" for result, label in results
    ) / len(results)
    confidences = Counter(round(result.confidence, 1) for result, _label in results)

    assert correct > 0.80
    assert 0.85 <= confident_correct <= 0.95
    assert confident_wrong < 0.01
    assert len(confidences) >= 5  # confidence varies; not a constant


# -- outcomes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "threshold", "outcome"),
    [
        pytest.param(output("billing", 0.9), 0.7, "accepted", id="confident"),
        pytest.param(output("billing", 0.7), 0.7, "accepted", id="at-threshold"),
        pytest.param(output("billing", 0.69), 0.7, "inconclusive", id="below-threshold"),
        pytest.param(output(None, 0.0), 0.0, "inconclusive", id="no-label-zero-threshold"),
        pytest.param(output(None, 0.95), 0.5, "inconclusive", id="no-label"),
        pytest.param(output(None, 0.0, "invalid_json"), 0.5, "rejected", id="rejected"),
        pytest.param(output("billing", 0.99, "label_outside_taxonomy"), 0.5, "rejected", id="rejected-wins"),
        pytest.param(output("billing", 0.0), 0.0, "accepted", id="zero-threshold"),
        pytest.param(output("billing", 1.0), 1.0, "accepted", id="full-threshold"),
    ],
)
def test_decide_outcome(result: ModelOutput, threshold: float, outcome: str) -> None:
    assert decide_outcome(result, threshold) == outcome


@pytest.mark.parametrize("threshold", [pytest.param(-0.1, id="negative"), pytest.param(1.1, id="above-one")])
def test_decide_outcome_refuses_bad_threshold(threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        decide_outcome(output(), threshold)


@pytest.mark.parametrize(
    "confidence", [pytest.param(float("nan"), id="nan"), pytest.param(1.5, id="above"), pytest.param(-0.1, id="below")]
)
def test_model_output_refuses_bad_confidence(confidence: float) -> None:
    with pytest.raises(ValueError, match="confidence"):
        output(confidence=confidence)


@pytest.mark.parametrize(
    ("error", "error_class", "transient", "message"),
    [
        pytest.param(TransientClassifierError("timeout"), "timeout", True, "timeout", id="transient"),
        pytest.param(PermanentClassifierError("bad_request", "HTTP 400"), "bad_request", False, "HTTP 400", id="perm"),
    ],
)
def test_classifier_errors_carry_class_and_kind(
    error: ClassifierError, error_class: str, transient: bool, message: str
) -> None:
    assert isinstance(error, ClassifierError)
    assert (error.error_class, error.transient, str(error)) == (error_class, transient, message)


# -- drill -------------------------------------------------------------------------------------


class Recording:
    """A fake inner classifier: always billing, counting calls."""

    version = "inner-v7"

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        self.calls += 1
        return ModelOutput("billing", 0.9, None, 2.0, prompt_tokens=10)

    def close(self) -> None:
        self.closed = True


def drill_kind(classifier: DrillClassifier, item: ClassifyRequest) -> str:
    """What the drill did: the error class it raised, or whether it changed the output."""
    try:
        result = classifier.classify(item)
    except ClassifierError as exc:
        return f"{'transient' if exc.transient else 'permanent'}:{exc.error_class}"
    return "inconclusive" if result.confidence == 0.05 else "delegated"


def test_drill_keeps_the_inner_version_and_closes_it() -> None:
    inner = Recording()
    drill = DrillClassifier(inner, DrillSettings(transient_error_rate=0.5))
    drill.close()

    assert drill.version == "inner-v7"
    assert inner.closed


def test_drill_rates_within_tolerance() -> None:
    settings = DrillSettings(transient_error_rate=0.2, permanent_error_rate=0.1, inconclusive_rate=0.15, seed=42)
    drill = DrillClassifier(Recording(), settings)

    kinds = Counter(drill_kind(drill, request(key=f"key-{i}")) for i in range(10_000))

    assert kinds["transient:drill_transient"] / 10_000 == pytest.approx(0.20, abs=0.015)
    assert kinds["permanent:drill_permanent"] / 10_000 == pytest.approx(0.10, abs=0.015)
    assert kinds["inconclusive"] / 10_000 == pytest.approx(0.15, abs=0.015)
    assert kinds["delegated"] / 10_000 == pytest.approx(0.55, abs=0.015)


def test_drill_is_deterministic_and_predictable() -> None:
    settings = DrillSettings(transient_error_rate=0.3, permanent_error_rate=0.1, seed=5)
    items = [request(key=f"key-{i}", attempt=1 + i % 3) for i in range(500)]

    first = [drill_kind(DrillClassifier(Recording(), settings), item) for item in items]
    second = [drill_kind(DrillClassifier(Recording(), settings), item) for item in items]
    predicted = [
        "transient:drill_transient" if f < 0.3 else "permanent:drill_permanent" if f < 0.4 else "delegated"
        for f in (drill_fraction(5, item.idempotency_key, item.attempt) for item in items)
    ]

    assert first == second == predicted


def test_drill_transient_failures_usually_clear_on_a_later_attempt() -> None:
    drill = DrillClassifier(Recording(), DrillSettings(transient_error_rate=0.3, seed=1))
    keys = [f"key-{i}" for i in range(2000)]

    failed_first = [
        key for key in keys if drill_kind(drill, request(key=key, attempt=1)) == "transient:drill_transient"
    ]
    failed_again = [
        key for key in failed_first if drill_kind(drill, request(key=key, attempt=2)) == "transient:drill_transient"
    ]

    assert len(failed_again) / len(failed_first) == pytest.approx(0.3, abs=0.06)


def test_drill_inconclusive_keeps_the_inner_label_and_usage() -> None:
    inner = Recording()
    drill = DrillClassifier(inner, DrillSettings(inconclusive_rate=1.0))

    result = drill.classify(request())

    assert result == replace(inner.classify(request()), confidence=0.05)
    assert decide_outcome(result, 0.5) == "inconclusive"


def test_drill_faults_do_not_call_the_inner_classifier() -> None:
    inner = Recording()
    drill = DrillClassifier(inner, DrillSettings(transient_error_rate=0.5, permanent_error_rate=0.5))

    kinds = {drill_kind(drill, request(key=f"k{i}")) for i in range(50)}

    assert kinds == {"transient:drill_transient", "permanent:drill_permanent"}
    assert inner.calls == 0


def test_drill_with_zero_rates_delegates_everything() -> None:
    inner = Recording()
    drill = DrillClassifier(inner, DrillSettings())

    assert {drill_kind(drill, request(key=f"k{i}")) for i in range(200)} == {"delegated"}
    assert inner.calls == 200


# -- factory -----------------------------------------------------------------------------------


def test_build_classifier(taxonomy: Taxonomy) -> None:
    keyword = build_classifier("keyword", taxonomy=taxonomy)
    drilled = build_classifier("keyword", taxonomy=taxonomy, drill=DrillSettings(permanent_error_rate=0.1))
    undrilled = build_classifier("keyword", taxonomy=taxonomy, drill=DrillSettings(duplicate_rate=0.5))
    llm = build_classifier("llm", taxonomy=taxonomy, llm_settings={"base_url": "http://127.0.0.1:9/v1", "model": "m"})

    assert isinstance(keyword, KeywordClassifier)
    assert isinstance(drilled, DrillClassifier)
    assert drilled.version == keyword.version
    assert isinstance(undrilled, KeywordClassifier)
    assert isinstance(llm, OpenAICompatibleClassifier)
    llm.close()


@pytest.mark.parametrize(
    ("name", "llm_settings"),
    [pytest.param("bert", None, id="unknown"), pytest.param("llm", None, id="llm-without-settings")],
)
def test_build_classifier_refuses(taxonomy: Taxonomy, name: str, llm_settings: dict[str, object] | None) -> None:
    with pytest.raises(ValueError, match=r"unknown classifier|llm_settings"):
        build_classifier(name, taxonomy=taxonomy, llm_settings=llm_settings)


def test_the_drill_names_its_poison_document_by_external_id_or_content_hash() -> None:
    from triage.classifiers.base import ClassifyRequest
    from triage.classifiers.drill import is_document

    request = ClassifyRequest(
        job_id="j",
        external_id="doc-7",
        idempotency_key="synthetic/5:doc-7/abc123/keyword-v1",
        correlation_id="c",
        attempt=1,
        text="t",
    )
    assert is_document(request, "doc-7")
    assert is_document(request, "abc123")
    assert not is_document(request, "doc-8")
    assert not is_document(request, "abc")  # a whole segment, not a prefix
    assert DrillSettings(kill_on="doc-7").injects_faults
    assert not DrillSettings().injects_faults
