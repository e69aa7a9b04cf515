"""``make run``'s live line: a batch's jobs by state and documents settled per second.

On a terminal the line is rewritten in place (``\\r``) about once a second; anywhere else (CI,
a pipe, a file) a line is written every few seconds when the figures changed, and at least once
a minute, so that a log stays short and still shows the run moving.
"""

from __future__ import annotations

import shutil
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TextIO

from triage.jobs.vocabulary.states import SETTLED, JobStatus

Counts = Mapping[JobStatus, int]

LINE_EVERY = 5.0
"""Seconds between lines when the output is not a terminal (and the figures changed)."""
HEARTBEAT_EVERY = 60.0
"""Seconds between lines when nothing changed, off a terminal."""
RATE_WINDOW = 10.0
"""Documents/s is measured over this many seconds: the current pace, not the phase's average
(which Airflow's start-up, before the first document, would drag down)."""


def settled(counts: Counts) -> int:
    return sum(n for status, n in counts.items() if status in SETTLED)


def progress_line(phase: str, counts: Counts, elapsed: float, per_second: float | None) -> str:
    """``classify_documents  0:42  200 jobs: queued 40 · running 16 · completed 144  ·  12 documents/s``"""
    minutes, seconds = divmod(int(elapsed), 60)
    total = sum(counts.values())
    states = " · ".join(f"{status.value} {n}" for status, n in counts.items() if n) or "no jobs yet"
    rate = f"  ·  {per_second:,.0f} documents/s" if per_second is not None else ""
    return f"{phase}  {minutes}:{seconds:02d}  {total} jobs: {states}{rate}"


class Progress:
    """Writes :func:`progress_line` for ``counts()`` to ``stream`` on each :meth:`tick`.

    :param counts: the batch's jobs by state, asked at every tick (None when it cannot be read
        right now, e.g. while the database restarts: the tick is skipped).
    :param tty: whether ``stream`` is a terminal (default: ask it).
    """

    def __init__(
        self,
        counts: Callable[[], Counts | None],
        stream: TextIO,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.counts, self.stream, self.clock = counts, stream, clock
        self.tty = stream.isatty() if tty is None else tty
        self.lines = 0  # lines ended, for the tests' line budget
        self._phase = ""
        self._started = self._written_at = 0.0
        self._samples: deque[tuple[float, int]] = deque()  # (when, settled) within RATE_WINDOW
        self._last: dict[JobStatus, int] | None = None  # the figures last written
        self._open = False  # a terminal line waits for its newline

    def start(self, phase: str) -> None:
        self.finish()
        self._phase, self._started, self._written_at = phase, self.clock(), float("-inf")
        self._samples.clear()
        self._last = None

    def tick(self, *, final: bool = False) -> None:
        counts = self.counts()
        if counts is None:
            return
        now = self.clock()
        elapsed = now - self._started
        self._samples.append((now, settled(counts)))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW:
            self._samples.popleft()
        (then, before), done = self._samples[0], settled(counts)
        per_second = (done - before) / (now - then) if now - then >= 1 and done > before else None
        line = progress_line(self._phase, counts, elapsed, per_second)
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            self.stream.write("\r" + line[:width] + "\x1b[K")
            self._open = True
        else:
            changed = dict(counts) != self._last
            due = now - self._written_at >= (LINE_EVERY if changed else HEARTBEAT_EVERY)
            if not (due or (final and changed)):
                return
            self.stream.write(line + "\n")
            self.lines += 1
            self._written_at = now
        self._last = dict(counts)
        self.stream.flush()

    def finish(self) -> None:
        """The phase's last figures, and the end of its line."""
        if not self._phase:
            return
        self.tick(final=True)
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self.lines += 1
            self._open = False
        self._phase = ""
