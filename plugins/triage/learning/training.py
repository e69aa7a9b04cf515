"""Training a candidate model from labelled examples (no database, no Airflow: the registry and
the operators feed it and store what it returns).

The held-out split is fixed by a hash of each example's id (source and external id): an
example is held out today, tomorrow and in every later training, so a newer model is always
compared with the champion on examples neither was trained on. Thresholds and metrics come
from the held-out examples only (:mod:`triage.learning.metrics`).

The estimator is scikit-learn's: ``TfidfVectorizer`` word 1-2 grams and ``char_wb`` 2-5 grams
(sublinear TF), side by side, and a multinomial ``LogisticRegression``; the choice and its
measurements are docs/adr/0007-learned-classifier.md. What is kept is its arrays
(:class:`~triage.learning.model.LinearTextModel`), never the estimator object.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np

from triage.learning.metrics import (
    Prediction,
    choose_pooled_thresholds,
    choose_thresholds,
    choose_verified_thresholds,
    score,
)
from triage.learning.model import FeatureSpec, LinearTextModel, sha256_hex

__all__ = [
    "MODEL_FAMILY",
    "THRESHOLD_RULES",
    "Example",
    "ThresholdRule",
    "TrainSettings",
    "TrainedModel",
    "TrainingRefused",
    "choose_for",
    "evaluate_model",
    "fit",
    "fit_temperature",
    "in_holdout",
    "train",
    "training_set_sha256",
    "verification_half",
]

MODEL_FAMILY: Final = "tfidf-word12-char25-logreg"
"""Names the estimator and its features in every version's ``params``."""


ThresholdRule = Literal["verified", "pooled", "per-label"]
THRESHOLD_RULES: Final[tuple[ThresholdRule, ...]] = ("verified", "pooled", "per-label")
"""How thresholds are chosen on the held-out predictions (:class:`TrainSettings`'s ``thresholds``)."""


class TrainingRefused(ValueError):
    """The examples cannot make a model (too few, one label only); the message says what to add."""


@dataclass(frozen=True, slots=True)
class TrainSettings:
    """:param target_precision: what auto-accepted labels must reach on held-out data.
    :param holdout_percent: the share of example ids held out (by hash), in percent.
    :param min_examples: training examples a label needs before it may auto-accept.
    :param margin_z: how sure the held-out precision at a threshold must be to reach the target
        (the Wilson lower bound at this many standard errors; 0: the observed share).
    :param thresholds: how thresholds are chosen on the held-out predictions. ``"verified"``:
        proposed by one half of them (by a hash of the example id, :func:`verification_half`)
        with the margin on the pool, certified on the other half, which did not choose them
        (:func:`~triage.learning.metrics.choose_verified_thresholds`); ``"pooled"``: the margin
        on the pool of all of them, chosen and judged on the same predictions
        (:func:`~triage.learning.metrics.choose_pooled_thresholds`); ``"per-label"``: the margin
        on each label's own (:func:`~triage.learning.metrics.choose_thresholds`).
    :param min_df: examples a term must appear in to be a feature.
    :param c: the logistic regression's inverse regularisation strength.
    :param calibrate: scale the fitted layer by the temperature that fits the held-out examples
        best (:func:`fit_temperature`) before the thresholds are chosen.
    """

    target_precision: float = 0.97
    holdout_percent: int = 20
    min_examples: int = 20
    margin_z: float = 0.5
    min_df: int = 1
    c: float = 20.0
    max_iter: int = 1000
    calibrate: bool = True
    thresholds: ThresholdRule = "verified"

    def __post_init__(self) -> None:
        if not (0.0 < self.target_precision <= 1.0):
            raise ValueError("target_precision must be within (0, 1]")
        if not (1 <= self.holdout_percent <= 50):
            raise ValueError("holdout_percent must be within 1..50")
        if self.min_examples < 1 or self.min_df < 1 or self.c <= 0.0 or self.max_iter < 1:
            raise ValueError("min_examples, c and max_iter must be positive")
        if not (0.0 <= self.margin_z <= 3.0):
            raise ValueError("margin_z must be within [0, 3]")
        if self.thresholds not in THRESHOLD_RULES:
            raise ValueError(f"thresholds must be one of {', '.join(THRESHOLD_RULES)}")


DEFAULT_SETTINGS: Final = TrainSettings()
DEFAULT_FEATURES: Final = FeatureSpec()


@dataclass(frozen=True, slots=True)
class Example:
    """A labelled example's id, label, content hash and text."""

    source: str
    external_id: str
    label: str
    content_sha256: str
    text: str


@dataclass(frozen=True, slots=True)
class TrainedModel:
    """A candidate, ready for the registry."""

    version: str
    artifact: bytes
    artifact_sha256: str
    taxonomy_sha256: str
    training_set_sha256: str
    label_counts: dict[str, int]
    metrics: dict[str, Any]
    thresholds: dict[str, float | None]
    target_precision: float
    params: dict[str, Any]
    model: LinearTextModel = field(repr=False)
    holdout: tuple[Example, ...] = field(repr=False)


def in_holdout(source: str, external_id: str, percent: int) -> bool:
    """Whether the example (source, external id) is held out: fixed by the hash of its id."""
    digest = hashlib.sha256(f"{source}\x1f{external_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < percent


def verification_half(source: str, external_id: str) -> int:
    """The half (0 or 1) of the held-out examples the example (source, external id) falls in when
    thresholds chosen on one half are certified on the other: fixed by a hash of its id, salted
    apart from :func:`in_holdout`'s."""
    digest = hashlib.sha256(f"verify\x1f{source}\x1f{external_id}".encode()).digest()
    return digest[0] & 1


def training_set_sha256(examples: Sequence[Example]) -> str:
    """SHA-256 of the set of (source, external id, label, content hash): order-independent."""
    lines = sorted(f"{e.source}\x1f{e.external_id}\x1f{e.label}\x1f{e.content_sha256}" for e in examples)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def fit(examples: Sequence[Example], settings: TrainSettings, spec: FeatureSpec = DEFAULT_FEATURES) -> LinearTextModel:
    """Fit the estimator on ``examples`` and keep its arrays.

    :raises TrainingRefused: fewer than two labels.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion

    labels = sorted({e.label for e in examples})
    if len(labels) < 2:
        raise TrainingRefused(f"the training examples hold {len(labels)} label(s); a classifier needs two or more")
    # A term seen in one example only is kept when min_df is 1; below 200 examples always (at 2 a
    # handful of examples would keep no term at all).
    min_df = settings.min_df if len(examples) >= 200 else 1
    word = TfidfVectorizer(ngram_range=spec.word_ngrams, min_df=min_df, sublinear_tf=True, dtype=np.float32)
    char = TfidfVectorizer(
        analyzer="char_wb", ngram_range=spec.char_ngrams, min_df=min_df, sublinear_tf=True, dtype=np.float32
    )
    features = FeatureUnion([("word", word), ("char", char)])
    matrix = features.fit_transform([e.text for e in examples])
    estimator = LogisticRegression(C=settings.c, max_iter=settings.max_iter)
    estimator.fit(matrix, [e.label for e in examples])
    word_terms = sorted(word.vocabulary_, key=word.vocabulary_.__getitem__)
    char_terms = sorted(char.vocabulary_, key=char.vocabulary_.__getitem__)
    return LinearTextModel(
        labels=[str(label) for label in estimator.classes_],
        word_terms=word_terms,
        char_terms=char_terms,
        idf=np.concatenate([word.idf_, char.idf_]),
        coef=estimator.coef_,
        intercept=estimator.intercept_,
        spec=spec,
    )


MIN_CALIBRATION: Final = 50
"""Held-out examples (of the model's labels) needed before a temperature is fitted; fewer: 1."""


def fit_temperature(model: LinearTextModel, examples: Sequence[Example]) -> float:
    """The temperature T that makes ``softmax(scores / T)`` fit ``examples`` best (least mean
    log-loss; Guo et al. 2017's temperature scaling), within [0.05, 20]. One number fitted to
    likelihood, not to coverage: the label of every document stays the same, only how sure the
    model says it is moves (a regularised logistic regression is under-confident: T < 1).

    ``examples`` are the held-out ones (never a test file); fewer than :data:`MIN_CALIBRATION`
    of the model's labels leave the model as it is (1.0).
    """
    from scipy.optimize import minimize_scalar

    index = {label: i for i, label in enumerate(model.labels)}
    usable = [e for e in examples if e.label in index]
    if len(usable) < MIN_CALIBRATION:
        return 1.0
    scores = np.stack([model.scores(e.text) for e in usable]).astype(np.float64)
    truth = np.array([index[e.label] for e in usable])
    rows = np.arange(len(usable))

    def log_loss(log_t: float) -> float:
        scaled = scores / math.exp(log_t)
        if scaled.shape[1] == 1:  # two labels: the sigmoid of one score
            positive = scaled[:, 0]
            log_p = np.where(truth == 1, -np.logaddexp(0.0, -positive), -np.logaddexp(0.0, positive))
        else:
            shifted = scaled - scaled.max(axis=1, keepdims=True)
            log_p = shifted[rows, truth] - np.log(np.exp(shifted).sum(axis=1))
        return float(-log_p.mean())

    found = minimize_scalar(log_loss, bounds=(math.log(0.05), math.log(20.0)), method="bounded")
    return round(math.exp(float(found.x)), 4)


def evaluate_model(
    model: LinearTextModel, examples: Sequence[Example], thresholds: dict[str, float | None] | None
) -> tuple[list[Prediction], dict[str, Any]]:
    """The model's predictions of ``examples`` and their metrics at ``thresholds``: computed as
    the classify step computes them (:meth:`~triage.learning.model.LinearTextModel.predict_many`,
    a claim's documents in one pass), so thresholds are chosen on the numbers runs compare."""
    predictions = [
        Prediction(e.label, label, confidence)
        for e, (label, confidence) in zip(examples, model.predict_many([e.text for e in examples]), strict=True)
    ]
    return predictions, score(predictions, thresholds)


def choose_for(
    settings: TrainSettings,
    predictions: Sequence[Prediction],
    held: Sequence[Example],
    labels: Sequence[str],
    counts: dict[str, int],
) -> dict[str, float | None]:
    """The thresholds ``settings.thresholds`` chooses on the held-out ``predictions`` of ``held``."""
    common: dict[str, Any] = {
        "target_precision": settings.target_precision,
        "train_counts": counts,
        "min_examples": settings.min_examples,
        "z": settings.margin_z,
    }
    if settings.thresholds == "per-label":
        return choose_thresholds(predictions, labels, **common)
    if settings.thresholds == "pooled":
        return choose_pooled_thresholds(predictions, labels, **common)
    halves = [verification_half(e.source, e.external_id) for e in held]
    return choose_verified_thresholds(predictions, halves, labels, **common)


def train(
    examples: Sequence[Example], *, taxonomy_sha256: str, settings: TrainSettings = DEFAULT_SETTINGS
) -> TrainedModel:
    """A candidate from ``examples`` (labels within the taxonomy: the caller's to filter).

    :raises TrainingRefused: no held-out or training examples, or fewer than two labels.
    """
    # One order whatever the caller's: the fit's floating-point sums, hence the artifact, depend on it.
    examples = sorted(examples, key=lambda e: (e.source, e.external_id))
    held = [e for e in examples if in_holdout(e.source, e.external_id, settings.holdout_percent)]
    trained_on = [e for e in examples if not in_holdout(e.source, e.external_id, settings.holdout_percent)]
    if not held or not trained_on:
        raise TrainingRefused(
            f"{len(examples)} examples make {len(trained_on)} to train on and {len(held)} held out; both must be "
            "non-empty: import or review more examples"
        )
    started = time.process_time()
    fitted = fit(trained_on, settings)
    temperature = fit_temperature(fitted, held) if settings.calibrate else 1.0
    if temperature != 1.0:
        fitted = fitted.tempered(temperature)
    artifact = fitted.to_bytes()
    artifact_sha = sha256_hex(artifact)
    model = LinearTextModel.from_bytes(artifact, artifact_sha)  # evaluated as it will be loaded
    fit_seconds = time.process_time() - started
    counts = dict(sorted(Counter(e.label for e in trained_on).items()))
    predictions, _ = evaluate_model(model, held, None)
    thresholds = choose_for(settings, predictions, held, model.labels, counts)
    metrics = score(predictions, thresholds)
    training_sha = training_set_sha256(examples)
    params = {
        "family": MODEL_FAMILY,
        "features": fitted.spec.to_dict(),
        "c": settings.c,
        "min_df": settings.min_df,
        "max_iter": settings.max_iter,
        "temperature": round(temperature, 6),
        "holdout_percent": settings.holdout_percent,
        "min_examples": settings.min_examples,
        "margin_z": settings.margin_z,
        "thresholds": settings.thresholds,
        "examples": len(examples),
        "trained_on": len(trained_on),
        "held_out": len(held),
        "vocabulary": len(fitted.word_terms) + len(fitted.char_terms),
        "fit_cpu_seconds": round(fit_seconds, 3),
    }
    identity = json.dumps(
        [
            training_sha,
            taxonomy_sha256,
            settings.target_precision,
            {k: v for k, v in params.items() if "seconds" not in k},
        ],
        sort_keys=True,
    )
    version = f"learned-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
    return TrainedModel(
        version=version,
        artifact=artifact,
        artifact_sha256=artifact_sha,
        taxonomy_sha256=taxonomy_sha256,
        training_set_sha256=training_sha,
        label_counts=counts,
        metrics=metrics,
        thresholds=thresholds,
        target_precision=settings.target_precision,
        params=params,
        model=model,
        holdout=tuple(held),
    )
