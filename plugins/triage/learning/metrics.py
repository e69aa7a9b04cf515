"""How good a classifier is on labelled examples, and the per-label thresholds that make it safe.

Metrics as annotation tools report a model against its annotators: accuracy, macro-F1 (each
label weighs the same, however rare), per-label precision and recall, the most confused pairs,
and for the model's thresholds the *coverage* (the share it would accept without a person) and
the *accepted precision* (how often what it accepts is right).

Thresholds are chosen on held-out predictions, three ways:

- **Each label on its own** (:func:`choose_thresholds`): a label's threshold is the lowest
  confidence at which its held-out predictions, taken from the most confident down, are still
  right at least ``target_precision`` of the time, over at least :data:`MIN_ACCEPTED` of them.
  "Right at least target_precision of the time" is judged by the Wilson lower bound at ``z``
  standard errors, not by the observed share alone: a threshold chosen where the held-out
  precision only just reaches the target falls below it on new documents about half of the time
  (measured: docs/adr/0007-learned-classifier.md). ``z = 0`` is the observed share.
- **Pooled** (:func:`choose_pooled_thresholds`): the target is a property of everything
  accepted, so the margin is taken on all accepted held-out predictions together (thousands, a
  margin of a few tenths of a point) instead of on each label's hundred or so (a margin of a
  point or more each). One shared bar of confidence; a label accepts down to the bar when its
  own held-out precision there is not below the target by more than ``z`` standard errors (the
  Wilson *upper* bound reaches it), and down to its own threshold above whenever that is lower;
  the bar is the one that accepts most while the Wilson lower bound of the pooled accepted
  predictions still reaches the target. Every label accepts at least what it accepts on its own.
  The bound counts the predictions but not that the same predictions chose the thresholds: with
  a few dozen predictions a label, the chosen thresholds are flattered by them.
- **Verified** (:func:`choose_verified_thresholds`, what training uses): the pooled rule with
  that selection taken out. The held-out predictions are cut in two halves by a hash of the
  example id; one half proposes pooled thresholds, and the other, which did not choose them,
  certifies how far down toward them the thresholds may go (the pooled Wilson lower bound of
  what it accepts must reach the target, candidates tested in a fixed order from the most
  cautious: Learn-then-Test's fixed-sequence testing).
Every way, a label with fewer than ``min_examples`` training examples, or that reaches the target
at no threshold and is not trusted at the bar, has none and never auto-accepts.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "MIN_ACCEPTED",
    "Prediction",
    "Ranked",
    "choose_pooled_thresholds",
    "choose_thresholds",
    "choose_verified_thresholds",
    "score",
    "wilson_lower_bound",
    "wilson_upper_bound",
]

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


def wilson_upper_bound(right: int, n: int, z: float) -> float:
    """The upper end of the Wilson score interval of ``right`` successes in ``n`` at ``z``."""
    if n == 0:
        return 1.0
    return 1.0 - wilson_lower_bound(n - right, n, z)


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


class Ranked:
    """One label's held-out predictions, most confident first: how many of them a threshold takes,
    and how many of those are right.

    ``negated``: their confidences negated (ascending, for ``bisect``); ``right[n]``: how many of
    the ``n`` most confident are right (``right[0]`` is 0). The threshold rules here and the
    bench's (``bench/learning.py``) rank with it."""

    __slots__ = ("negated", "right")

    def __init__(self, label: str, predictions: Sequence[Prediction]) -> None:
        mine = sorted((p for p in predictions if p.label == label), key=lambda p: -p.confidence)
        self.negated = [-p.confidence for p in mine]
        self.right = [0]
        for prediction in mine:
            self.right.append(self.right[-1] + (prediction.truth == label))

    def taken(self, threshold: float | None) -> tuple[int, int]:
        """(accepted, right) at ``threshold`` (None: nothing)."""
        if threshold is None:
            return 0, 0
        n = bisect.bisect_right(self.negated, -threshold)
        return n, self.right[n]


def _at_bar(
    bar: float,
    labels: Sequence[str],
    own: Mapping[str, float | None],
    ranked: Mapping[str, Ranked],
    *,
    target_precision: float,
    z: float,
) -> dict[str, float | None]:
    """Each label's threshold at the shared ``bar``: the bar when at least :data:`MIN_ACCEPTED`
    of its predictions (``ranked``: the labels with ``min_examples``) reach it and the Wilson upper
    bound at ``z`` of their precision reaches the target; its ``own`` threshold when that is lower
    or the bar is refused; None for a label not in ``ranked``."""
    thresholds: dict[str, float | None] = dict.fromkeys(labels)
    for label, mine in ranked.items():
        n, right = mine.taken(bar)
        trusted = n >= MIN_ACCEPTED and wilson_upper_bound(right, n, z) >= target_precision
        candidates = [t for t in (bar if trusted else None, own[label]) if t is not None]
        thresholds[label] = min(candidates) if candidates else None
    return thresholds


def choose_pooled_thresholds(
    predictions: Sequence[Prediction],
    labels: Sequence[str],
    *,
    target_precision: float,
    train_counts: Mapping[str, int],
    min_examples: int,
    z: float = 0.0,
) -> dict[str, float | None]:
    """Each label's threshold with the margin on the pool of accepted predictions (see the module
    docstring); None: the label never auto-accepts.

    For each candidate bar (every held-out confidence of a label with ``min_examples``), label by
    label: the bar when at least :data:`MIN_ACCEPTED` of its predictions reach it and the Wilson
    upper bound at ``z`` of their precision reaches ``target_precision``; its own threshold
    (:func:`choose_thresholds` at ``z``) when that is lower or the bar is refused. Of the bars
    whose accepted predictions, pooled, have a Wilson lower bound at ``z`` that reaches the
    target, the one accepting most is kept (ties: the higher bar). Each label's own threshold
    passes that test by itself (the pooled surplus of right answers is the sum of the labels'
    and the margin of the sum is at most the sum of their margins), so the result never accepts
    less than the labels on their own.
    """
    own = choose_thresholds(
        predictions,
        labels,
        target_precision=target_precision,
        train_counts=train_counts,
        min_examples=min_examples,
        z=z,
    )
    eligible = [label for label in labels if train_counts.get(label, 0) >= min_examples]
    ranked = {label: Ranked(label, predictions) for label in eligible}

    best: dict[str, float | None] = dict(own)
    most, _ = _pooled(ranked, own)
    bars = sorted({p.confidence for p in predictions if p.label in ranked}, reverse=True)
    for bar in bars:
        thresholds = _at_bar(bar, labels, own, ranked, target_precision=target_precision, z=z)
        n, right = _pooled(ranked, thresholds)
        if n > most and wilson_lower_bound(right, n, z) >= target_precision:
            best, most = thresholds, n
    return best


def _pooled(ranked: Mapping[str, Ranked], thresholds: Mapping[str, float | None]) -> tuple[int, int]:
    """How many predictions of the ``ranked`` labels ``thresholds`` accept, and how many of them
    are right, pooled over the labels."""
    taken = [ranking.taken(thresholds[label]) for label, ranking in ranked.items()]
    return sum(n for n, _ in taken), sum(right for _, right in taken)


def choose_verified_thresholds(
    predictions: Sequence[Prediction],
    halves: Sequence[int],
    labels: Sequence[str],
    *,
    target_precision: float,
    train_counts: Mapping[str, int],
    min_examples: int,
    z: float = 0.0,
) -> dict[str, float | None]:
    """Pooled thresholds certified on predictions that did not choose them (see the module
    docstring); None: the label never auto-accepts.

    ``halves`` gives each prediction's half (fixed by a hash of its example's id): the
    predictions of half 0, the selection, propose the pooled thresholds
    (:func:`choose_pooled_thresholds` on them), and those of half 1, the verification, certify
    them. One way only: each way is a certificate on its own, and the stricter of both ways would
    ask for the target twice over.

    The candidates are the proposal approached from above: at a level ``λ``, each label's threshold
    is the higher of ``λ`` and its proposed one, ``λ`` going down the selection's confidences
    from the highest, so each candidate accepts at least what the one before it did and the last
    is the proposal itself. In that order, fixed before the verification is read, a candidate is
    kept while the verification predictions it accepts, pooled, have a Wilson lower bound at
    ``z`` that reaches the target, and the first that misses ends the sequence (a fixed-sequence
    test: one check at a time, so their number needs no correction). A candidate accepting fewer
    verification predictions than could reach the target even if all were right is passed over,
    neither kept nor ending the sequence (that depends on how many there are, not on whether
    they are right). Nothing certified: nothing auto-accepts.
    """
    if len(halves) != len(predictions):
        raise ValueError("halves must give one half per prediction")
    selection = [p for p, half in zip(predictions, halves, strict=True) if half == 0]
    verification = [p for p, half in zip(predictions, halves, strict=True) if half != 0]
    proposed = choose_pooled_thresholds(
        selection,
        labels,
        target_precision=target_precision,
        train_counts=train_counts,
        min_examples=min_examples,
        z=z,
    )
    checked_on = {label: Ranked(label, verification) for label, t in proposed.items() if t is not None}
    kept: dict[str, float | None] = dict.fromkeys(labels)
    if z > 0 and target_precision >= 1.0:  # n right of n bound at n / (n + z²) < 1: none certifies
        return kept
    # Below this many accepted verification predictions even all right cannot reach the target.
    least = next(n for n in itertools.count(1) if wilson_lower_bound(n, n, z) >= target_precision)

    lowest = min((t for t in proposed.values() if t is not None), default=None)
    if lowest is None:
        return kept
    levels = sorted({p.confidence for p in selection if p.label in checked_on and p.confidence >= lowest})
    for level in reversed(levels):
        thresholds = {label: None if t is None else max(level, t) for label, t in proposed.items()}
        n, right = _pooled(checked_on, thresholds)
        if n < least:
            continue
        if wilson_lower_bound(right, n, z) < target_precision:
            break
        kept = thresholds
    return kept


def score(
    predictions: Sequence[Prediction],
    thresholds: Mapping[str, float | None] | None = None,
    *,
    top_confusions: int = 5,
) -> dict[str, Any]:
    """The metrics of ``predictions`` (JSON-ready). With ``thresholds``: coverage and accepted
    precision at them (None when nothing is accepted), in all and per label (``accepted``,
    ``accepted_precision`` of the documents auto-accepted with that label); without, the outcome
    the classifier decided is not known here, and they are None (per label: absent)."""
    n = len(predictions)
    truths = Counter(p.truth for p in predictions)
    predicted = Counter(p.label for p in predictions if p.label is not None)
    right = Counter(p.truth for p in predictions if p.label == p.truth)
    labels = sorted(set(truths) | set(predicted))
    taken = [p for p in predictions if accepted(p, thresholds)] if thresholds is not None else []
    taken_as = Counter(p.label for p in taken)
    right_as = Counter(p.label for p in taken if p.label == p.truth)
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
        if thresholds is not None:
            per_label[label]["accepted"] = taken_as[label]
            per_label[label]["accepted_precision"] = (
                round(right_as[label] / taken_as[label], 4) if taken_as[label] else None
            )
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
        result["accepted"] = len(taken)
        result["coverage"] = round(len(taken) / n, 4) if n else None
        result["accepted_precision"] = round(sum(p.label == p.truth for p in taken) / len(taken), 4) if taken else None
    return result
