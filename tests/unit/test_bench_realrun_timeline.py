"""The real run's timeline figures (``bench/realrun.py``): the relay's tail starts at the last
task that moves jobs, whether or not ``persist`` ran (issue #29: it is skipped when classify left
it nothing), and the hand-offs around the classification are read from the same timeline."""

from __future__ import annotations

from bench.realrun import hand_offs, relay_tail

WITH_PERSIST = {
    "retrieve[0]": [0.8, 5.0],
    "retrieve[1]": [0.9, 5.2],
    "size_classify": [5.6, 6.0],
    "classify[0]": [6.4, 16.0],
    "classify[1]": [6.4, 16.5],
    "persist": [17.0, 17.4],
    "publish_events": [17.9, 22.0],
    "alert": [22.4, 22.8],
}
WITHOUT_PERSIST = {name: span for name, span in WITH_PERSIST.items() if name not in ("persist", "alert")}


def test_the_relay_tail_starts_at_persists_end_when_it_ran() -> None:
    assert relay_tail(WITH_PERSIST) == 22.0 - 17.4


def test_the_relay_tail_starts_at_the_last_classify_end_when_persist_was_skipped() -> None:
    assert relay_tail(WITHOUT_PERSIST) == 22.0 - 16.5


def test_a_timeline_without_publish_events_has_no_relay_tail() -> None:
    assert relay_tail({"classify[0]": [1.0, 2.0]}) == 0.0


def test_hand_offs_are_the_gaps_around_the_classification() -> None:
    assert hand_offs(WITH_PERSIST, 23.0) == {
        "retrieve_to_classify": 1.2,
        "classify_to_publish": 1.4,  # persist and the hand-offs either side of it
        "publish_to_run_end": 1.0,
    }
    assert hand_offs(WITHOUT_PERSIST, 22.3) == {
        "retrieve_to_classify": 1.2,
        "classify_to_publish": 1.4,
        "publish_to_run_end": 0.3,
    }
