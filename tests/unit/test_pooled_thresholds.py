"""Thresholds with the margin taken on the pool of accepted held-out predictions
(:func:`triage.learning.metrics.choose_pooled_thresholds`): what it gains over each label on its
own, and the three things it must never do: accept a pool whose Wilson lower bound misses the
target, trust a label at the shared bar whose own precision there is clearly below the target,
or accept less than a label does on its own."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.learning.metrics import (
    MIN_ACCEPTED,
    Prediction,
    Ranked,
    choose_pooled_thresholds,
    choose_thresholds,
    choose_verified_thresholds,
    wilson_lower_bound,
    wilson_upper_bound,
)
from triage.learning.training import Example, TrainSettings, evaluate_model, train, verification_half

TARGET = 0.95
Z = 1.0


def ranked(label: str, outcomes: str, top: float = 0.99, step: float = 0.01) -> list[Prediction]:
    """Predictions of ``label`` from ``top`` down by ``step``: ``outcomes`` says each one's truth,
    ``+`` right, ``-`` wrong (another label)."""
    return [
        Prediction(label if outcome == "+" else "other", label, round(top - i * step, 4))
        for i, outcome in enumerate(outcomes)
    ]


def taken(predictions: Sequence[Prediction], label: str, threshold: float | None) -> tuple[int, int]:
    mine = [p for p in predictions if p.label == label and threshold is not None and p.confidence >= threshold]
    return len(mine), sum(p.truth == label for p in mine)


def pooled(
    predictions: Sequence[Prediction], thresholds: Mapping[str, float | None], labels: Sequence[str]
) -> tuple[int, int]:
    counts = [taken(predictions, label, thresholds[label]) for label in labels]
    return sum(n for n, _ in counts), sum(r for _, r in counts)


# Twenty right, one wrong, nine right: 29 of 30. On its own a label stops above the wrong one (20
# of 20 has a lower bound of 0.952 at z = 1; 29 of 30, 0.916): one wrong answer in thirty is too
# little evidence for 95%. Eight such labels together are 232 of 240, lower bound 0.956.
ALMOST = "+" * 20 + "-" + "+" * 9
LABELS = [f"l{i}" for i in range(8)]
COUNTS = dict.fromkeys([*LABELS, "bad", "rare"], 100)


def test_a_ranking_takes_every_prediction_of_its_label_at_or_above_a_threshold() -> None:
    """:class:`Ranked`, which the rules and the bench's rules rank with: ties at the threshold are
    all taken, other labels' predictions never, no threshold takes nothing."""
    tie = Prediction("b", "b", 0.96)
    predictions = [*ranked("b", "++-+"), tie, *ranked("c", "++")]  # b: 0.99 + 0.98 + 0.97 - 0.96 + 0.96 +
    mine = Ranked("b", predictions)
    assert mine.negated == [-0.99, -0.98, -0.97, -0.96, -0.96]
    assert mine.right == [0, 1, 2, 2, 3, 4]
    assert mine.taken(0.97) == (3, 2)
    assert mine.taken(0.96) == (5, 4)
    assert mine.taken(1.0) == (0, 0)
    assert mine.taken(None) == (0, 0)


def test_the_pool_accepts_what_each_label_alone_is_too_unsure_of() -> None:
    predictions = [p for label in LABELS for p in ranked(label, ALMOST)]
    alone = choose_thresholds(predictions, LABELS, target_precision=TARGET, train_counts=COUNTS, min_examples=20, z=Z)
    together = choose_pooled_thresholds(
        predictions, LABELS, target_precision=TARGET, train_counts=COUNTS, min_examples=20, z=Z
    )
    assert alone == dict.fromkeys(LABELS, pytest.approx(0.80))  # twenty each: 160 of 240
    assert together == dict.fromkeys(LABELS, pytest.approx(0.70))  # all thirty each
    n, right = pooled(predictions, together, LABELS)
    assert (n, right) == (240, 232)
    assert wilson_lower_bound(right, n, Z) >= TARGET


def test_the_bar_stops_where_the_pooled_lower_bound_would_miss_the_target() -> None:
    # A second wrong answer and ten right below it: each label alone is still not clearly below
    # the target (38 of 40, upper bound 0.975), but the pool of them all (304 of 320) is not
    # surely at it, nor is any bar below the second wrong answer.
    predictions = [p for label in LABELS for p in ranked(label, ALMOST + "-" + "+" * 10)]
    assert wilson_upper_bound(38, 40, Z) >= TARGET
    assert wilson_lower_bound(304, 320, Z) < TARGET
    together = choose_pooled_thresholds(
        predictions, LABELS, target_precision=TARGET, train_counts=COUNTS, min_examples=20, z=Z
    )
    assert together == dict.fromkeys(LABELS, pytest.approx(0.70))
    n, right = pooled(predictions, together, LABELS)
    assert (n, right) == (240, 232)
    assert wilson_lower_bound(right, n, Z) >= TARGET


def test_a_label_sure_below_the_bar_on_its_own_keeps_its_own_lower_threshold() -> None:
    # 'deep' is right 60 of 60, down to 0.40: on its own it accepts them all. The bar stops at
    # 0.70 (below it the other labels' second wrong answers sink the pool: 364 of 380); 'deep'
    # is not held up to the bar.
    predictions = [p for label in LABELS for p in ranked(label, ALMOST + "-" + "+" * 10)] + ranked("deep", "+" * 60)
    labels = [*LABELS, "deep"]
    assert wilson_lower_bound(304 + 60, 320 + 60, Z) < TARGET
    together = choose_pooled_thresholds(
        predictions, labels, target_precision=TARGET, train_counts={**COUNTS, "deep": 100}, min_examples=20, z=Z
    )
    assert together["deep"] == pytest.approx(0.40)
    assert {label: together[label] for label in LABELS} == dict.fromkeys(LABELS, pytest.approx(0.70))


def test_a_label_clearly_below_the_target_at_the_bar_keeps_its_own_threshold() -> None:
    # 'bad' is right 20 of 20 at the top, then 6 of 10: 26 of 30 at the bar (upper bound 0.94).
    # Beside ten labels right every time the pool could carry it (558 of 570 has a lower bound
    # of 0.97): the label's own evidence is what keeps it out.
    sure = [f"s{i}" for i in range(10)]
    good = [p for label in LABELS for p in ranked(label, ALMOST)] + [p for s in sure for p in ranked(s, "+" * 30)]
    bad = ranked("bad", "+" * 20 + "-++-++-++-")
    labels = [*LABELS, *sure, "bad"]
    counts = {**COUNTS, **dict.fromkeys(sure, 100)}
    assert wilson_upper_bound(26, 30, Z) < TARGET
    assert wilson_lower_bound(232 + 300 + 26, 240 + 300 + 30, Z) >= TARGET
    together = choose_pooled_thresholds(
        good + bad, labels, target_precision=TARGET, train_counts=counts, min_examples=20, z=Z
    )
    assert together["bad"] == pytest.approx(0.80)  # its own: 20 of 20
    assert {label: together[label] for label in LABELS} == dict.fromkeys(LABELS, pytest.approx(0.70))


def test_a_label_with_too_few_examples_or_predictions_never_auto_accepts() -> None:
    good = [p for label in LABELS for p in ranked(label, ALMOST)]
    rare = ranked("rare", "+" * 30)  # right every time, but trained on 5 examples
    few = ranked("few", "+" * (MIN_ACCEPTED - 1))  # enough examples, too few held-out predictions
    labels = [*LABELS, "rare", "few", "unseen"]
    counts = {**COUNTS, "rare": 5, "few": 100, "unseen": 100}
    together = choose_pooled_thresholds(
        good + rare + few, labels, target_precision=TARGET, train_counts=counts, min_examples=20, z=Z
    )
    assert together["rare"] is None
    assert together["few"] is None
    assert together["unseen"] is None


def test_nothing_to_accept_is_nothing_accepted() -> None:
    assert choose_pooled_thresholds(
        [], ["a", "b"], target_precision=TARGET, train_counts={"a": 100}, min_examples=20, z=Z
    ) == {"a": None, "b": None}
    wrong = ranked("a", "-" * 30)
    assert choose_pooled_thresholds(
        wrong, ["a"], target_precision=TARGET, train_counts={"a": 100}, min_examples=20, z=Z
    ) == {"a": None}


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from("abcd"), st.booleans(), st.integers(min_value=50, max_value=100)),
        max_size=160,
    ),
    target=st.sampled_from([0.8, 0.9, 0.95]),
    z=st.sampled_from([0.0, 0.5, 1.0]),
    small=st.sampled_from(["a", "b", "c", "d"]),
)
def test_the_pooled_thresholds_keep_their_promises(
    rows: list[tuple[str, bool, int]], target: float, z: float, small: str
) -> None:
    """Whatever the predictions (ties included: confidences are hundredths): a label trained on
    too few examples never accepts; every label accepts at least what it does on its own; a label
    beyond its own threshold is not clearly below the target where it stops, with enough
    predictions; and when anything beyond the labels' own is accepted, the pool's lower bound
    reaches the target."""
    predictions = [Prediction(label if right else "x", label, hundredths / 100) for label, right, hundredths in rows]
    labels = ["a", "b", "c", "d"]
    counts = {label: 5 if label == small else 50 for label in labels}
    alone = choose_thresholds(predictions, labels, target_precision=target, train_counts=counts, min_examples=20, z=z)
    together = choose_pooled_thresholds(
        predictions, labels, target_precision=target, train_counts=counts, min_examples=20, z=z
    )
    assert together[small] is None
    for label in labels:
        own, shared = alone[label], together[label]
        if own is not None:
            assert shared is not None
            assert shared <= own
        if together[label] != alone[label]:
            n, right = taken(predictions, label, together[label])
            assert n >= MIN_ACCEPTED
            assert wilson_upper_bound(right, n, z) >= target
    if pooled(predictions, together, labels) != pooled(predictions, alone, labels):
        n, right = pooled(predictions, together, labels)
        assert wilson_lower_bound(right, n, z) >= target


def test_training_chooses_verified_thresholds_unless_told_otherwise() -> None:
    topics = {
        "billing": ["invoice", "charged twice", "receipt", "payment card", "vat"],
        "shipping": ["parcel", "delivery", "tracking number", "courier", "in transit"],
        "refund_request": ["refund", "money back", "return the item", "reimburse", "chargeback"],
    }
    names = list(topics)
    rng = random.Random(7)
    data = []
    for i in range(900):
        label = names[i % 3]
        # One word in five is another topic's (or its own): the model is not always right.
        words = [rng.choice(topics[label] if rng.random() < 0.8 else topics[rng.choice(names)]) for _ in range(3)]
        data.append(Example("test", f"ex-{i}", label, f"{i:064x}", "about " + " and ".join(words)))
    verified = train(data, taxonomy_sha256="t" * 64)
    pooled_model = train(data, taxonomy_sha256="t" * 64, settings=TrainSettings(thresholds="pooled"))
    per_label = train(data, taxonomy_sha256="t" * 64, settings=TrainSettings(thresholds="per-label"))
    assert verified.params["thresholds"] == "verified"
    assert pooled_model.params["thresholds"] == "pooled"
    assert per_label.params["thresholds"] == "per-label"
    assert len({verified.version, pooled_model.version, per_label.version}) == 3
    assert pooled_model.thresholds != per_label.thresholds  # these data tell the two apart
    assert pooled_model.metrics["coverage"] > per_label.metrics["coverage"]
    common: dict[str, Any] = {"target_precision": 0.97, "min_examples": 20, "z": 0.5}
    for trained, choose in ((pooled_model, choose_pooled_thresholds), (per_label, choose_thresholds)):
        predictions, _ = evaluate_model(trained.model, list(trained.holdout), None)
        assert trained.thresholds == choose(
            predictions, trained.model.labels, train_counts=trained.label_counts, **common
        )
    predictions, _ = evaluate_model(verified.model, list(verified.holdout), None)
    halves = [verification_half(e.source, e.external_id) for e in verified.holdout]
    assert verified.thresholds == choose_verified_thresholds(
        predictions, halves, verified.model.labels, train_counts=verified.label_counts, **common
    )


def test_an_unknown_threshold_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="thresholds must be one of"):
        TrainSettings(thresholds="loose")  # type: ignore[arg-type]
