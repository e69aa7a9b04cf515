"""How good a classifier is on labelled examples, and the per-label thresholds that make it safe.

Metrics as annotation tools report a model against its annotators: accuracy, macro-F1 (each
label weighs the same, however rare), per-label precision and recall, the most confused pairs,
and for the model's thresholds the *coverage* (the share it would accept without a person) and
the *accepted precision* (how often what it accepts is right).

A label's threshold is the lowest confidence at which the held-out predictions of that label,
taken from the most confident down, are still right at least ``target_precision`` of the time,
over at least :data:`MIN_ACCEPTED` of them; a label with fewer than ``min_examples`` training
examples, or that reaches the target at no threshold, has none and never auto-accepts.
"Right at least target_precision of the time" is judged by the Wilson lower bound at ``z``
standard errors, not by the observed share alone: a threshold chosen where the held-out
precision only just reaches the target falls below it on new documents about half of the time
(measured: docs/adr/0007-learned-classifier.md). ``z = 0`` is the observed share.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["MIN_ACCEPTED", "Prediction", "choose_thresholds", "score", "wilson_lower_bound"]

MIN_ACCEPTED: Final = 5
"""Held-out predictions of a label needed before its threshold is believed."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """One example: its true label, the predicted label (None: none) and the confidence."""

    truth: str
    label: str | None
    confidence: float


def accepted(prediction: Prediction, thresholds: Mapping[str, float | None]) -> bool:
    """Whether ``prediction`` would be auto-accepted at ``thresholds`` (no threshold: never)."""
    if prediction.label is None:
        return False
    threshold = thresholds.get(prediction.label)
    return threshold is not None and prediction.confidence >= threshold


def wilson_lower_bound(right: int, n: int, z: float) -> float:
    """The lower end of the Wilson score interval of ``right`` successes in ``n`` at ``z``."""
    if n == 0:
        return 0.0
    share = right / n
    spread = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    return (share + z * z / (2 * n) - spread) / (1 + z * z / n)


def choose_thresholds(
    predictions: Sequence[Prediction],
    labels: Sequence[str],
    *,
    target_precision: float,
    train_counts: Mapping[str, int],
    min_examples: int,
    z: float = 0.0,
) -> dict[str, float | None]:
    """Each label's threshold (see the module docstring); None: the label never auto-accepts."""
    thresholds: dict[str, float | None] = {}
    for label in labels:
        thresholds[label] = None
        if train_counts.get(label, 0) < min_examples:
            continue
        mine = sorted((p for p in predictions if p.label == label), key=lambda p: -p.confidence)
        right = 0
        best: float | None = None
        for n, prediction in enumerate(mine, start=1):
            right += prediction.truth == label
            # Ties are accepted together: only cut after the last of equal confidences.
            if n < len(mine) and mine[n].confidence == prediction.confidence:
                continue
            if n >= MIN_ACCEPTED and wilson_lower_bound(right, n, z) >= target_precision:
                best = prediction.confidence
        thresholds[label] = best
    return thresholds


def score(
    predictions: Sequence[Prediction],
    thresholds: Mapping[str, float | None] | None = None,
    *,
    top_confusions: int = 5,
) -> dict[str, Any]:
    """The metrics of ``predictions`` (JSON-ready). With ``thresholds``: coverage and accepted
    precision at them (None when nothing is accepted); without, the outcome the classifier
    decided is not known here, and both are None."""
    n = len(predictions)
    truths = Counter(p.truth for p in predictions)
    predicted = Counter(p.label for p in predictions if p.label is not None)
    right = Counter(p.truth for p in predictions if p.label == p.truth)
    labels = sorted(set(truths) | set(predicted))
    per_label: dict[str, dict[str, Any]] = {}
    f1s = []
    for label in labels:
        precision = right[label] / predicted[label] if predicted[label] else 0.0
        recall = right[label] / truths[label] if truths[label] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_label[label] = {
            "precision": round(precision, 4),
            "recall": round(recall, 4),
            "f1": round(f1, 4),
            "support": truths[label],
        }
        f1s.append(f1)
    confused = Counter((p.truth, p.label or "(none)") for p in predictions if p.label != p.truth)
    result: dict[str, Any] = {
        "n": n,
        "accuracy": round(sum(right.values()) / n, 4) if n else None,
        "macro_f1": round(sum(f1s) / len(f1s), 4) if f1s else None,
        "per_label": per_label,
        "confused": [
            {"truth": truth, "predicted": label, "count": count}
            for (truth, label), count in sorted(confused.items(), key=lambda item: (-item[1], item[0]))[:top_confusions]
        ],
        "coverage": None,
        "accepted": None,
        "accepted_precision": None,
    }
    if thresholds is not None:
        taken = [p for p in predictions if accepted(p, thresholds)]
        result["accepted"] = len(taken)
        result["coverage"] = round(len(taken) / n, 4) if n else None
        result["accepted_precision"] = round(sum(p.label == p.truth for p in taken) / len(taken), 4) if taken else None
    return result
