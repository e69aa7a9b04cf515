"""The cyclic garbage collector's share of a step that makes and drops many objects a document.

A step allocates a few dozen small objects a document (the payload, the answer, the outcome, its
rows) and drops them a chunk later. Every collection of the oldest generation then walks every
object the process holds: the modules it imported, the classifier, the engine; an Airflow task
process holds far more of them than the work does. Measured on a chunk loop of keyword
documents: 80-85 µs of CPU a document with the collector as it is, 66-69 with what was there
before the loop frozen (``gc.freeze()``), 65-67 with the collector off. The collections after
the freeze still took 4-5 µs a document of ``python -m bench pipeline-profile``'s chunks of
1,000 (one of the youngest generation every 700 allocations, each moving the chunk's live
objects on to an older one, walked again in turn), ~0.2 with one every :data:`YOUNG_THRESHOLD`.
"""

from __future__ import annotations

import gc
from functools import cache

YOUNG_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation once the set-up is frozen
(CPython's default: 700). A step's objects live a chunk and are freed by their reference counts;
only a cycle waits for a collection, at most this many allocations longer."""


@cache
def freeze_long_lived() -> None:
    """Move what this process holds now out of the collector's walks, once per process, and
    collect the young generations less often (:data:`YOUNG_THRESHOLD`).

    The young generations are collected first (the set-up's own garbage, a fraction of a
    millisecond); the oldest is frozen as it is: a task process's imports and set-up are never
    collected later. Collecting the oldest generation first would free the few hundred cyclic
    objects left by imports (~700 in a task process of the local deployment), but walks every
    object the process holds: 0.15-0.25 s of a task's ``execute``, more in a process forked from
    the preloaded forkserver, whose pages the walk copies (docs/performance.md, "Task start-up,
    preloaded"). Objects made afterwards are collected as always. Later calls do nothing, so a
    process that runs many steps (a test session) freezes only its first set-up. A threshold
    already higher, or the collector switched off (a threshold of 0), is left as it is."""
    gc.collect(1)
    gc.freeze()
    young, older, oldest = gc.get_threshold()
    if 0 < young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
