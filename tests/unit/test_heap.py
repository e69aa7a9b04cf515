"""The step's set-up frozen out of the collector's walks, once per process (triage.pipeline.heap)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from triage.pipeline import heap


@pytest.fixture
def fresh_process() -> Iterator[None]:
    heap.freeze_long_lived.cache_clear()  # as in a new process: not called yet
    thresholds = gc.get_threshold()
    yield
    heap.freeze_long_lived.cache_clear()
    gc.unfreeze()  # the rest of the session's objects back to the collector
    gc.set_threshold(*thresholds)


def test_the_first_call_freezes_what_is_alive_and_later_calls_nothing(fresh_process: None) -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    heap.freeze_long_lived()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    made_after = [[i] for i in range(1000)]  # containers the collector tracks
    heap.freeze_long_lived()
    assert gc.get_freeze_count() == frozen, "a second step in the same process froze again"
    assert gc.is_tracked(made_after[0])  # what comes later is collected as always


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param((700, 10, 10), (heap.YOUNG_THRESHOLD, 10, 10), id="cpython-default-raised"),
        pytest.param((50_000, 5, 20), (50_000, 5, 20), id="higher-left-alone"),
        pytest.param((0, 10, 10), (0, 10, 10), id="collector-off-stays-off"),
    ],
)
def test_the_young_generations_are_collected_less_often(
    fresh_process: None, before: tuple[int, int, int], after: tuple[int, int, int]
) -> None:
    gc.set_threshold(*before)
    heap.freeze_long_lived()
    assert gc.get_threshold() == after


def test_it_never_walks_the_oldest_generation(fresh_process: None) -> None:
    """A walk of the oldest generation visits every object a preloaded task process holds (and
    copies their pages in a forked one): 0.15-0.25 s of a task's execute, to free a few hundred."""
    collected: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collected.append(info["generation"])

    gc.unfreeze()
    gc.callbacks.append(note)
    try:
        heap.freeze_long_lived()
    finally:
        gc.callbacks.remove(note)
    assert collected, "the young generations are collected first"
    assert max(collected) < 2
