"""The learned model without a database: features equal to scikit-learn's, the artifact's
round trip and its refusals, thresholds and metrics."""

from __future__ import annotations

import dataclasses
import io
import math
import warnings
import zipfile
from collections.abc import Callable

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import FeatureUnion

from triage.classifiers.base import ModelOutput, decide_outcome
from triage.learning.metrics import Prediction, choose_thresholds, score, wilson_lower_bound
from triage.learning.model import ArtifactRefused, ArtifactTampered, FeatureSpec, LinearTextModel, sha256_hex
from triage.learning.training import (
    Example,
    TrainSettings,
    fit,
    fit_temperature,
    in_holdout,
    train,
    training_set_sha256,
)

TEXTS = [
    "My invoice shows a double charge!!  Please fix   it",
    "Parcel lost in transit — where is my order?",
    "I want my money back: refund the order",
    "Can't log in; password reset e-mail never arrives",
    "invoice invoice invoice",
    "Ünïcödé ship ment tracking número 42",
    "a b c",
    "",
]
LABELS = ["billing", "shipping", "refund_request", "account_access", "billing", "shipping", "billing", "shipping"]


def examples(n: int = 200) -> list[Example]:
    topics = {
        "billing": ["invoice", "charged twice", "receipt", "payment card", "vat"],
        "shipping": ["parcel", "delivery", "tracking number", "courier", "in transit"],
        "refund_request": ["refund", "money back", "return the item", "reimburse", "chargeback"],
    }
    out = []
    for i in range(n):
        label = list(topics)[i % 3]
        words = topics[label]
        text = f"hello, about {words[i % 5]} and {words[(i // 3) % 5]} number {i}"
        out.append(Example("test", f"ex-{i}", label, f"{i:064x}", text))
    return out


def test_features_equal_scikit_learn_s() -> None:
    word = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    char = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True)
    union = FeatureUnion([("word", word), ("char", char)])
    expected = union.fit_transform(TEXTS).toarray()
    model = LinearTextModel(
        labels=["a", "b", "c"],
        word_terms=sorted(word.vocabulary_, key=word.vocabulary_.__getitem__),
        char_terms=sorted(char.vocabulary_, key=char.vocabulary_.__getitem__),
        idf=np.concatenate([word.idf_, char.idf_]),
        coef=np.zeros((3, expected.shape[1])),
        intercept=np.zeros(3),
    )
    for text, row in zip(TEXTS, expected, strict=True):
        columns, values = model.features(text)
        mine = np.zeros(expected.shape[1])
        mine[columns] = values
        np.testing.assert_allclose(mine, row, atol=1e-5)


CHUNK_TEXTS = [
    *TEXTS,
    "   ",
    "l'été — e-mail\tfoo_bar 123 x9 don't  stop\u2003NOW now now",
    "refund refund the refund, refund it: refund",
    "\x1cunit\x1fseparators split words too",
]


@pytest.mark.parametrize("ngrams", [pytest.param((1, 2), id="words-1-2"), pytest.param((1, 1), id="words-1")])
def test_a_chunk_s_features_equal_scikit_learn_s(ngrams: tuple[int, int]) -> None:
    """The chunk path (a claim's documents in one pass, what the classify step takes) computes
    scikit-learn's features too, bigrams found by their two tokens' ids included."""
    word = TfidfVectorizer(ngram_range=ngrams, sublinear_tf=True)
    char = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True)
    union = FeatureUnion([("word", word), ("char", char)])
    expected = union.fit_transform(CHUNK_TEXTS).toarray()
    model = LinearTextModel(
        labels=["a", "b", "c"],
        word_terms=sorted(word.vocabulary_, key=word.vocabulary_.__getitem__),
        char_terms=sorted(char.vocabulary_, key=char.vocabulary_.__getitem__),
        idf=np.concatenate([word.idf_, char.idf_]),
        coef=np.zeros((3, expected.shape[1])),
        intercept=np.zeros(3),
        spec=FeatureSpec(word_ngrams=ngrams),
    )
    assert model._chunkable()
    unseen = "qqq zzzz"  # no known word: an empty word block (no NaN), char n-grams only
    words, chars = model._chunk_features([*CHUNK_TEXTS, unseen])
    mine = np.hstack([words.toarray(), chars.toarray()])
    np.testing.assert_allclose(mine[: len(CHUNK_TEXTS)], expected, atol=1e-5)
    np.testing.assert_allclose(mine[-1], union.transform([unseen]).toarray()[0], atol=1e-5)
    assert not mine[-1, : model.n_word].any()


def test_a_chunk_ranks_as_one_document_at_a_time_does() -> None:
    model = fit(examples(150), TrainSettings())
    texts = [*CHUNK_TEXTS, "refund my parcel please", "vat receipt", *(e.text for e in examples(40))]
    chunk = model.ranked_many(texts, 3)
    assert model.ranked_many([], 3) == []
    for text, answer in zip(texts, chunk, strict=True):
        alone = model.ranked(text, 3)
        assert [name for name, _ in answer] == [name for name, _ in alone]
        assert [p for _, p in answer] == pytest.approx([p for _, p in alone], abs=1e-5)
    assert model.predict_many(texts) == [(a[0][0], a[0][1]) for a in chunk]


def test_a_full_word_cache_is_replaced_and_the_chunk_still_ranks_every_document(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import triage.learning.model as model_module

    model = fit(examples(150), TrainSettings())
    texts = [e.text for e in examples(60)]
    expected = model.ranked_many(texts, 3)
    fresh = fit(examples(150), TrainSettings())
    monkeypatch.setattr(model_module, "_WORD_CACHE_SIZE", 5)
    assert fresh.ranked_many(texts, 3) == expected
    assert len(fresh._char_bytes) < len({w for t in texts for w in t.lower().split()})  # it was replaced


def test_a_vocabulary_whose_bigrams_are_not_its_unigrams_is_ranked_one_at_a_time() -> None:
    """A hand-made artifact may list a bigram without its words: the chunk path cannot find it
    by the words' ids, so such a model takes the per-document path (same answers)."""
    model = LinearTextModel(
        labels=["a", "b"],
        word_terms=["refund please", "refund"],
        char_terms=["re"],
        idf=np.ones(3),
        coef=np.array([[1.0, -1.0, 0.5]]),
        intercept=np.zeros(1),
    )
    assert not model._chunkable()
    assert model.ranked_many(["refund please"], 2) == [model.ranked("refund please", 2)]


def test_probabilities_equal_the_estimator_s() -> None:
    from sklearn.linear_model import LogisticRegression

    data = examples(120)
    model = fit(data, TrainSettings())
    word = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    char = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True)
    union = FeatureUnion([("word", word), ("char", char)])
    matrix = union.fit_transform([e.text for e in data])
    estimator = LogisticRegression(C=TrainSettings().c, max_iter=1000).fit(matrix, [e.label for e in data])
    probe = ["refund my parcel please", "vat receipt", "nothing known here"]
    expected = estimator.predict_proba(union.transform(probe))
    for text, row in zip(probe, expected, strict=True):
        np.testing.assert_allclose(model.probabilities(text), row, atol=1e-4)


def test_the_artifact_round_trips_byte_for_byte() -> None:
    model = fit(examples(90), TrainSettings())
    data = model.to_bytes()
    again = LinearTextModel.from_bytes(data, sha256_hex(data))
    assert again.to_bytes() == data  # deterministic: the same model, the same bytes and hash
    assert again.labels == model.labels
    assert again.predict("a refund please") == model.predict("a refund please")


def test_a_tampered_artifact_is_refused_before_it_is_read() -> None:
    data = fit(examples(90), TrainSettings()).to_bytes()
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    with pytest.raises(ArtifactTampered, match="does not match its SHA-256"):
        LinearTextModel.from_bytes(bytes(flipped), sha256_hex(data))


def _archive(arrays: dict[str, np.ndarray], *, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, array in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, array, allow_pickle=allow_pickle)
            archive.writestr(f"{name}.npy", member.getvalue())
    return buffer.getvalue()


def test_an_object_array_is_refused_even_with_a_matching_hash() -> None:
    """A row rewritten whole (artifact and hash) still cannot make the loader unpickle."""

    class Boom:
        def __reduce__(self) -> tuple[object, ...]:
            return (print, ("pickle ran",))

    model = fit(examples(90), TrainSettings())
    with zipfile.ZipFile(io.BytesIO(model.to_bytes())) as archive:
        arrays = {n.removesuffix(".npy"): np.load(io.BytesIO(archive.read(n))) for n in archive.namelist()}
    arrays["labels"] = np.array([Boom()], dtype=object)
    data = _archive(arrays, allow_pickle=True)
    with pytest.raises(ArtifactRefused, match="refuses"):
        LinearTextModel.from_bytes(data, sha256_hex(data))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        pytest.param(lambda a: a.pop("idf"), "exactly the model's arrays", id="member-missing"),
        pytest.param(lambda a: a.update(coef=a["coef"][:, :3]), "do not fit", id="shape"),
        pytest.param(lambda a: a.update(idf=a["idf"].astype(np.float64)), "float32", id="dtype"),
        pytest.param(lambda a: a.update(intercept=np.full_like(a["intercept"], np.nan)), "not finite", id="nan"),
        pytest.param(lambda a: a.update(meta=np.frombuffer(b'{"format": "x"}', np.uint8)), "format", id="format"),
    ],
)
def test_a_malformed_artifact_is_refused(change: Callable[[dict[str, np.ndarray]], object], says: str) -> None:
    model = fit(examples(90), TrainSettings())
    with zipfile.ZipFile(io.BytesIO(model.to_bytes())) as archive:
        arrays = {n.removesuffix(".npy"): np.load(io.BytesIO(archive.read(n))) for n in archive.namelist()}
    change(arrays)
    data = _archive(arrays)
    with pytest.raises(ArtifactRefused, match=says):
        LinearTextModel.from_bytes(data, sha256_hex(data))


def _members(model: LinearTextModel) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(model.to_bytes())) as archive:
        return {n.removesuffix(".npy"): archive.read(n) for n in archive.namelist()}


def _raw_archive(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of a name written twice, which is the point
        for name, data in members:
            archive.writestr(f"{name}.npy", data)
    return buffer.getvalue()


def _npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


@pytest.mark.parametrize("shape", [(10**12,), (10**6, 10**6), (2**62,), (1000,)], ids=str)
def test_a_declared_shape_that_its_bytes_do_not_fill_allocates_nothing(shape: tuple[int, ...]) -> None:
    """A row rewritten whole (artifact and hash) may declare any shape in an array's header:
    the loader compares it with the bytes that follow before it allocates (numpy.load tried
    to allocate 3.6 TiB and raised MemoryError for the first two)."""
    members = _members(fit(examples(90), TrainSettings()))
    members["idf"] = _npy_header(shape) + b"\0" * 16
    data = _raw_archive(sorted(members.items()))
    with pytest.raises(ArtifactRefused, match="shape does not fit its bytes"):
        LinearTextModel.from_bytes(data, sha256_hex(data))


def test_a_member_given_twice_is_refused() -> None:
    members = _members(fit(examples(90), TrainSettings()))
    data = _raw_archive([*sorted(members.items()), ("idf", members["idf"])])
    with pytest.raises(ArtifactRefused, match="exactly the model's arrays"):
        LinearTextModel.from_bytes(data, sha256_hex(data))


_FORMAT = '"format": "triage-linear-text-v1"'


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        pytest.param(
            f'{{{_FORMAT}, "features": {{"word_ngrams": [1, 2, 3], "char_ngrams": [2, 5]}}}}', "pairs", id="3"
        ),
        pytest.param(
            f'{{{_FORMAT}, "features": {{"word_ngrams": [1, Infinity], "char_ngrams": [2, 5]}}}}', "pairs", id="inf"
        ),
        pytest.param(
            f'{{{_FORMAT}, "features": {{"word_ngrams": [1, 2.5], "char_ngrams": [2, 5]}}}}', "pairs", id="float"
        ),
        pytest.param(
            f'{{{_FORMAT}, "features": {{"word_ngrams": [1, 9], "char_ngrams": [2, 5]}}}}', "1..8", id="range"
        ),
        pytest.param(f'{{{_FORMAT}, "features": ' + "[" * 100_000 + "]" * 100_000 + "}", "not JSON", id="deep"),
    ],
)
def test_the_artifact_s_settings_are_checked_as_its_arrays_are(meta: str, says: str) -> None:
    """Bad settings were a bare ValueError, OverflowError or RecursionError: now ArtifactRefused."""
    model = fit(examples(90), TrainSettings())
    with zipfile.ZipFile(io.BytesIO(model.to_bytes())) as archive:
        arrays = {n.removesuffix(".npy"): np.load(io.BytesIO(archive.read(n))) for n in archive.namelist()}
    arrays["meta"] = np.frombuffer(meta.encode(), np.uint8)
    data = _archive(arrays)
    with pytest.raises(ArtifactRefused, match=says):
        LinearTextModel.from_bytes(data, sha256_hex(data))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        pytest.param(lambda a: a.update(idf=a["idf"].astype(">f4")), "float32 or uint8 only", id="big-endian"),
        pytest.param(lambda a: a.update(labels=a["labels"].astype(np.int8)), "float32 or uint8 only", id="int8-text"),
        pytest.param(
            lambda a: a.update(coef=a["coef"].astype(np.uint8)), "coef is not float32", id="bytes-for-numbers"
        ),
        pytest.param(lambda a: a.update(idf=a["idf"][None, None, :]), "shape", id="3-d"),
        pytest.param(lambda a: a.update(coef=np.full_like(a["coef"], np.inf)), "not finite", id="inf"),
        pytest.param(lambda a: a.update(word_terms=np.frombuffer(b"a\nb", np.uint8)), "do not fit", id="vocabulary"),
        pytest.param(lambda a: a.update(labels=np.frombuffer(b"x\ny\nz\nw", np.uint8)), "do not fit", id="labels"),
        pytest.param(lambda a: a.update(labels=np.frombuffer(b"x\nx\nz", np.uint8)), "distinct", id="label-twice"),
    ],
)
def test_what_a_rewritten_row_may_hold_is_checked(change: Callable[[dict[str, np.ndarray]], object], says: str) -> None:
    model = fit(examples(90), TrainSettings())
    with zipfile.ZipFile(io.BytesIO(model.to_bytes())) as archive:
        arrays = {n.removesuffix(".npy"): np.load(io.BytesIO(archive.read(n))) for n in archive.namelist()}
    change(arrays)
    data = _archive(arrays)
    with pytest.raises(ArtifactRefused, match=says):
        LinearTextModel.from_bytes(data, sha256_hex(data))


def test_a_model_s_label_the_taxonomy_lacks_is_a_rejected_answer_never_a_label() -> None:
    """A rewritten row may name labels of its own: the classifier answers none of them."""
    from triage.classifiers.base import ClassifyRequest
    from triage.classifiers.learned import LearnedClassifier
    from triage.classifiers.taxonomy import Label, Taxonomy
    from triage.learning.registry import LoadedModel

    model = fit(examples(90), TrainSettings())
    taxonomy = Taxonomy(labels=(Label(name="billing", description="bills"),))
    loaded = LoadedModel("learned-x", "champion", model, {label: 0.0 for label in model.labels}, 0.97)
    classifier = LearnedClassifier(loaded, taxonomy)
    output = classifier.classify(ClassifyRequest("", "", "", "", 1, "a refund of my money back please"))
    assert output.label is None
    assert output.rejected_reason == "label_outside_taxonomy"


def test_not_a_zip_is_refused() -> None:
    with pytest.raises(ArtifactRefused, match="not a readable archive"):
        LinearTextModel.from_bytes(b"not a zip", sha256_hex(b"not a zip"))


def test_thresholds_reach_the_target_or_never_accept() -> None:
    right = [Prediction("a", "a", 0.9 - i / 100) for i in range(20)]
    wrong = [Prediction("b", "a", 0.55), Prediction("b", "a", 0.5)]
    few = [Prediction("c", "c", 0.99) for _ in range(3)]
    counts = {"a": 50, "b": 50, "c": 50, "d": 2}
    thresholds = choose_thresholds(
        right + wrong + few, ["a", "b", "c", "d"], target_precision=0.95, train_counts=counts, min_examples=20, z=0.0
    )
    # a: 20 right down to 0.71; at 0.55 20/21 = 0.952 (target reached), at 0.5 20/22 = 0.909
    assert thresholds["a"] == pytest.approx(0.55)
    assert thresholds["b"] is None  # never predicted
    assert thresholds["c"] is None  # three held-out predictions say too little
    assert thresholds["d"] is None  # two training examples
    # With a margin, 20/21 right is no longer sure to be 95%: the threshold stays above the wrong ones.
    sure = choose_thresholds(right + wrong, ["a"], target_precision=0.95, train_counts=counts, min_examples=1, z=0.5)
    assert sure["a"] == pytest.approx(0.71)
    assert wilson_lower_bound(20, 21, 0.5) < 0.95 <= wilson_lower_bound(20, 20, 0.5)
    strict = choose_thresholds(right + wrong, ["a"], target_precision=0.99, train_counts=counts, min_examples=1)
    assert strict["a"] == pytest.approx(0.71)  # 20/20 right; any lower takes a wrong one
    scored = score(right + wrong, strict)
    assert scored["coverage"] == pytest.approx(20 / 22, abs=1e-4)
    assert scored["accepted_precision"] == 1.0


def test_metrics_count_confusions_and_macro_f1() -> None:
    predictions = [Prediction("a", "a", 1), Prediction("a", "b", 1), Prediction("b", "b", 1), Prediction("c", None, 0)]
    result = score(predictions, {"a": 0.5, "b": None})
    assert result["n"] == 4
    assert result["accuracy"] == 0.5
    assert result["per_label"]["a"] == {
        "precision": 1.0,
        "recall": 0.5,
        "f1": 0.6667,
        "support": 2,
        "accepted": 1,
        "accepted_precision": 1.0,
    }
    assert result["per_label"]["b"]["accepted"] == 0  # b never auto-accepts
    assert result["per_label"]["b"]["accepted_precision"] is None
    assert "accepted" not in score(predictions)["per_label"]["a"]  # no thresholds, no outcome
    assert result["macro_f1"] == pytest.approx((2 / 3 + 2 / 3 + 0) / 3, abs=1e-4)
    assert result["confused"][0] == {"truth": "a", "predicted": "b", "count": 1}
    assert result["coverage"] == 0.25  # only the first: b never auto-accepts
    assert result["accepted_precision"] == 1.0


def test_the_holdout_is_fixed_by_the_example_id() -> None:
    ids = [f"ex-{i}" for i in range(2000)]
    held = [i for i in ids if in_holdout("src", i, 20)]
    assert held == [i for i in ids if in_holdout("src", i, 20)]  # the same every time
    assert 300 < len(held) < 500
    assert in_holdout("src", "ex-1", 20) == in_holdout("src", "ex-1", 20)


def test_training_is_deterministic_and_names_its_data() -> None:
    data = examples(300)
    first = train(data, taxonomy_sha256="t" * 64)
    again = train(list(reversed(data)), taxonomy_sha256="t" * 64)
    assert first.version == again.version
    assert first.artifact_sha256 == again.artifact_sha256
    assert first.training_set_sha256 == training_set_sha256(data)
    assert train(data, taxonomy_sha256="u" * 64).version != first.version  # a new taxonomy is a new model
    # The same texts stored again (an import without received_at stores the import's time, so
    # other payload bytes and content hashes): the same arrays, but the version names other data.
    restored = [dataclasses.replace(e, content_sha256=f"{i + 1:064x}") for i, e in enumerate(data)]
    reimported = train(restored, taxonomy_sha256="t" * 64)
    assert reimported.artifact_sha256 == first.artifact_sha256
    assert reimported.version != first.version
    assert sum(first.label_counts.values()) + first.metrics["n"] == 300
    assert first.metrics["accuracy"] > 0.9


def test_the_label_s_own_threshold_decides_the_outcome() -> None:
    output = ModelOutput("billing", 0.6, None, 1.0, threshold=0.55)
    assert decide_outcome(output, 0.7) == "accepted"  # the label's 0.55, not the run's 0.7
    never = ModelOutput("billing", 1.0, None, 1.0, threshold=2.0)
    assert decide_outcome(never, 0.0) == "inconclusive"
    assert decide_outcome(ModelOutput("billing", 0.6, None, 1.0), 0.7) == "inconclusive"


def test_the_temperature_fits_the_held_out_examples_and_changes_no_label() -> None:
    data = examples(300)
    held = [e for e in data if in_holdout(e.source, e.external_id, 20)]
    model = fit([e for e in data if e not in held], TrainSettings())
    temperature = fit_temperature(model, held)
    assert 0.05 <= temperature < 1.0  # regularised logistic regression is under-confident

    def log_loss(m: LinearTextModel) -> float:
        return -sum(math.log(m.probabilities(e.text)[m.labels.index(e.label)]) for e in held) / len(held)

    tempered = model.tempered(temperature)
    assert log_loss(tempered) < log_loss(model)
    for e in data:
        assert tempered.predict(e.text)[0] == model.predict(e.text)[0]
    assert fit_temperature(model, held[:10]) == 1.0  # too few to fit anything
    trained = train(data, taxonomy_sha256="t" * 64)
    assert trained.params["temperature"] == temperature  # what train() folded into the artifact
    uncalibrated = train(data, taxonomy_sha256="t" * 64, settings=TrainSettings(calibrate=False))
    assert uncalibrated.params["temperature"] == 1.0
    assert uncalibrated.version != trained.version
