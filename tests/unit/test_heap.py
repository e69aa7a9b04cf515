"""The step's set-up frozen out of the collector's walks, once per process (triage.pipeline.heap)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from triage.pipeline import heap


@pytest.fixture
def fresh_process() -> Iterator[None]:
    heap.freeze_long_lived.cache_clear()  # as in a new process: not called yet
    yield
    heap.freeze_long_lived.cache_clear()
    gc.unfreeze()  # the rest of the session's objects back to the collector


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
