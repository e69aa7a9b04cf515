"""``make run``'s progress line: one line rewritten in place on a terminal, a short log otherwise."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest

from triage.jobs.vocabulary.states import JobStatus
from triage_tools.progress import HEARTBEAT_EVERY, LINE_EVERY, Progress, progress_line

S = JobStatus


def counts(**by_state: int) -> dict[JobStatus, int]:
    return {s: by_state.get(s.value, 0) for s in JobStatus}


@pytest.mark.parametrize(
    ("phase", "figures", "elapsed", "rate", "expected"),
    [
        pytest.param(
            "classify_documents",
            counts(),
            0.4,
            None,
            "classify_documents  0:00  0 jobs: no jobs yet",
            id="before-the-first-job",
        ),
        pytest.param(
            "classify_documents",
            counts(queued=40, running=16, completed=144),
            42.0,
            12.4,
            "classify_documents  0:42  200 jobs: queued 40 · running 16 · completed 144  ·  12 documents/s",
            id="states-in-machine-order-with-rate",
        ),
        pytest.param(
            "reconcile_jobs",
            counts(completed=180, manual_review=20),
            125.0,
            None,
            "reconcile_jobs  2:05  200 jobs: completed 180 · manual_review 20",
            id="no-rate-when-none-settled",
        ),
    ],
)
def test_progress_line(
    phase: str, figures: dict[JobStatus, int], elapsed: float, rate: float | None, expected: str
) -> None:
    assert progress_line(phase, figures, elapsed, rate) == expected


class Script:
    """A clock and the ledger's answers, advanced by the test."""

    def __init__(self, answers: list[dict[JobStatus, int] | None]) -> None:
        self.now = 0.0
        self._answers: Iterator[dict[JobStatus, int] | None] = iter(answers)
        self.current: dict[JobStatus, int] | None = None

    def counts(self) -> dict[JobStatus, int] | None:
        return self.current

    def clock(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds
        self.current = next(self._answers)


def test_off_a_terminal_lines_come_every_few_seconds_when_the_figures_change() -> None:
    moving = [counts(queued=200 - 10 * i, completed=10 * i) for i in range(20)]
    script = Script([counts(queued=200), *moving, *[moving[-1]] * 70])
    out = io.StringIO()
    progress = Progress(script.counts, out, tty=False, clock=script.clock)
    script.step(0)
    progress.start("classify_documents")
    for _ in range(90):  # a tick a second: 20 s of change, then 70 s of the same figures
        progress.tick()
        script.step(1.0)
    progress.finish()

    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert progress.lines == len(lines)
    # One line at the start, one per LINE_EVERY while moving, one heartbeat in the still minute.
    assert len(lines) <= 1 + 20 / LINE_EVERY + 70 / HEARTBEAT_EVERY + 1
    assert lines[0].startswith("classify_documents  0:00  200 jobs: queued 200")
    assert lines[-1].startswith("classify_documents  1:")  # the heartbeat, the last figures
    assert "completed 190" in lines[-1]
    assert "documents/s" in lines[2]


def test_on_a_terminal_one_line_is_rewritten_and_ended_once_per_phase() -> None:
    script = Script([counts(queued=5), counts(queued=3, running=2), counts(completed=5), counts(completed=5)])
    out = io.StringIO()
    progress = Progress(script.counts, out, tty=True, clock=script.clock)
    script.step(0)
    progress.start("classify_documents")
    progress.tick()
    script.step(1)
    progress.tick()
    script.step(1)
    progress.start("reconcile_jobs")  # ends the first phase's line with its last figures
    script.step(1)
    progress.finish()

    text = out.getvalue()
    assert text.count("\n") == 2 == progress.lines
    first, second = text.split("\n")[:2]
    assert first.count("\r") == 3  # two ticks and the final figures, in place
    assert first.rsplit("\r", 1)[1].startswith("classify_documents  0:02  5 jobs: completed 5")
    assert second.rsplit("\r", 1)[1].startswith("reconcile_jobs  0:01  5 jobs: completed 5")


def test_a_look_the_ledger_cannot_answer_is_skipped() -> None:
    script = Script([None, counts(queued=1)])
    out = io.StringIO()
    progress = Progress(script.counts, out, tty=False, clock=script.clock)
    script.step(0)
    progress.start("classify_documents")
    progress.tick()
    assert out.getvalue() == ""
    script.step(1)
    progress.finish()
    assert out.getvalue() == "classify_documents  0:01  1 jobs: queued 1\n"


def test_documents_per_second_is_the_current_pace_not_the_phase_average() -> None:
    # 20 s of Airflow starting up (no jobs), then 100 documents settled in 2 s.
    script = Script([*[counts()] * 20, counts(queued=100), counts(queued=50, completed=50), counts(completed=100)])
    out = io.StringIO()
    progress = Progress(script.counts, out, tty=True, clock=script.clock)
    script.step(0)
    progress.start("classify_documents")
    for _ in range(22):
        progress.tick()
        script.step(1.0)
    progress.tick()

    last = out.getvalue().rsplit("\r", 1)[1]
    assert last.startswith("classify_documents  0:22  100 jobs: completed 100  ·  ")
    # Over the last RATE_WINDOW seconds (100 in 10 s), not over the phase (100 in 22 s).
    assert "  ·  10 documents/s" in last
