"""Pooled thresholds certified on held-out predictions that did not choose them
(:func:`triage.learning.metrics.choose_verified_thresholds`): half 0 proposes, half 1
certifies. What must hold: a proposal the other half contradicts is refused, the certified
pool's Wilson lower bound reaches the target on the half that certified it, nothing goes below
what half 0 proposed, and a label with too few training examples never auto-accepts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.learning.metrics import (
    Prediction,
    choose_pooled_thresholds,
    choose_verified_thresholds,
    wilson_lower_bound,
)
from triage.learning.training import verification_half

TARGET = 0.9
Z = 1.0


def verified(
    proposing: list[Prediction], certifying: list[Prediction], counts: dict[str, int]
) -> dict[str, float | None]:
    """The verified thresholds with ``proposing`` as half 0 and ``certifying`` as half 1."""
    return choose_verified_thresholds(
        proposing + certifying,
        [0] * len(proposing) + [1] * len(certifying),
        sorted(counts),
        target_precision=TARGET,
        train_counts=counts,
        min_examples=20,
        z=Z,
    )


def ranked(label: str, outcomes: str, top: float = 0.99, step: float = 0.01) -> list[Prediction]:
    """Predictions of ``label`` from ``top`` down by ``step``: ``+`` right, ``-`` wrong."""
    return [
        Prediction(label if outcome == "+" else "other", label, round(top - i * step, 4))
        for i, outcome in enumerate(outcomes)
    ]


def pooled(predictions: Sequence[Prediction], thresholds: Mapping[str, float | None]) -> tuple[int, int]:
    taken = [
        p
        for p in predictions
        if p.label is not None and thresholds.get(p.label) is not None and p.confidence >= thresholds[p.label]  # type: ignore[operator]
    ]
    return len(taken), sum(p.truth == p.label for p in taken)


def test_a_proposal_the_other_half_contradicts_is_refused() -> None:
    """Half 0 is right every time; half 1, at the same confidences, one time in three wrong. Half
    0 alone (what the pooled rule sees if it is all there is) proposes to accept all of it; half
    1 refuses it: the label never auto-accepts."""
    flattering = ranked("a", "+" * 30)
    sobering = ranked("a", "++-" * 10)
    counts = {"a": 100}
    proposed = choose_pooled_thresholds(
        flattering, ["a"], target_precision=TARGET, train_counts=counts, min_examples=20, z=Z
    )
    assert proposed["a"] == 0.7  # what the selection alone would accept: all of it
    assert verified(flattering, sobering, counts) == {"a": None}


def test_the_verification_half_stops_the_descent_where_it_would_miss() -> None:
    """The selection half is right 50 times in 51 and proposes to accept all of it (down to
    0.49); the verification half, at the same confidences, is right down to 0.80 and wrong below:
    the thresholds come down only while what they accept there is still certified."""
    selection = ranked("a", "+" * 40 + "-" + "+" * 10)
    verification = ranked("a", "+" * 20 + "-" * 31)
    counts = {"a": 100}
    proposed = choose_pooled_thresholds(
        selection, ["a"], target_precision=TARGET, train_counts=counts, min_examples=20, z=Z
    )
    certified = verified(selection, verification, counts)
    assert proposed["a"] is not None
    assert certified["a"] is not None
    assert proposed["a"] == 0.49
    assert certified["a"] == 0.80
    n, right = pooled(verification, certified)
    assert wilson_lower_bound(right, n, Z) >= TARGET
    # One step further down would take a wrong one the bound cannot carry.
    lower = max(p.confidence for p in verification if p.confidence < certified["a"])
    n, right = pooled(verification, {"a": lower})
    assert wilson_lower_bound(right, n, Z) < TARGET


def test_halves_must_match_the_predictions() -> None:
    with pytest.raises(ValueError, match="one half per prediction"):
        choose_verified_thresholds(
            ranked("a", "+++"), [0, 1], ["a"], target_precision=TARGET, train_counts={"a": 100}, min_examples=20
        )


def test_the_verification_half_is_fixed_by_the_id_and_splits_evenly() -> None:
    halves = [verification_half("so", f"ex-{i}") for i in range(2000)]
    assert halves == [verification_half("so", f"ex-{i}") for i in range(2000)]
    assert set(halves) == {0, 1}
    assert 900 < sum(halves) < 1100


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from("abc"), st.booleans(), st.integers(min_value=50, max_value=100), st.integers(0, 1)),
        max_size=200,
    ),
    target=st.sampled_from([0.8, 0.9]),
    z=st.sampled_from([0.0, 0.5, 1.0]),
    small=st.sampled_from("abc"),
)
def test_verified_thresholds_keep_their_promises(
    rows: list[tuple[str, bool, int, int]], target: float, z: float, small: str
) -> None:
    """Whatever the predictions and halves (ties included: confidences are hundredths): a label
    trained on too few examples never accepts; what is kept accepts on half 1 a pool whose
    Wilson lower bound reaches the target (or nothing at all), and no label goes below what half
    0 proposed."""
    predictions = [Prediction(label if right else "x", label, hundredths / 100) for label, right, hundredths, _ in rows]
    halves = [half for *_, half in rows]
    labels = ["a", "b", "c"]
    counts = {label: 5 if label == small else 50 for label in labels}
    kept = choose_verified_thresholds(
        predictions, halves, labels, target_precision=target, train_counts=counts, min_examples=20, z=z
    )
    proposing = [p for p, h in zip(predictions, halves, strict=True) if h == 0]
    certifying = [p for p, h in zip(predictions, halves, strict=True) if h == 1]
    proposed = choose_pooled_thresholds(
        proposing, labels, target_precision=target, train_counts=counts, min_examples=20, z=z
    )
    assert kept[small] is None
    if any(t is not None for t in kept.values()):
        n, right = pooled(certifying, kept)
        assert n > 0
        assert wilson_lower_bound(right, n, z) >= target
    for label in labels:
        if kept[label] is not None:
            assert proposed[label] is not None
            assert kept[label] >= proposed[label]  # type: ignore[operator]


def test_a_target_no_count_can_certify_accepts_nothing() -> None:
    """At a target of 1.0 and z > 0 no number of right predictions has a Wilson lower bound that
    reaches it (n / (n + z²) < 1): nothing is certified, nothing auto-accepts (it raised
    StopIteration after a million candidates)."""
    perfect = [Prediction("a", "a", 0.99 - i / 1000) for i in range(200)]
    thresholds = choose_verified_thresholds(
        perfect,
        [i % 2 for i in range(200)],
        ["a"],
        target_precision=1.0,
        train_counts={"a": 100},
        min_examples=20,
        z=0.5,
    )
    assert thresholds == {"a": None}
