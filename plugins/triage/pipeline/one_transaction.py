"""The classify step of an in-process classifier: claim, classify and complete in one transaction.

A keyword or learned classifier answers in microseconds, so the lease of the general step
runner (:func:`triage.pipeline.steps.run_step`: ``queued -> running`` in one transaction, the
outcome in the next) writes each job and its log once more than the work needs. Here each chunk
of queued jobs is picked ``FOR UPDATE SKIP LOCKED``, classified in process and completed in the
same transaction (:class:`triage.jobs.store.one_transaction.Chunks`): the job row is written
twice in its life (registered, completed) and its log twice. The decision and what ``running``
still means: ``docs/adr/0009-claim-classify-complete-in-one-transaction.md``.

The guarantees, and who keeps each:

- a crash or SIGKILL mid-chunk: PostgreSQL rolls the chunk's transaction back; its jobs are
  queued as before, nothing of them is written, no attempt is spent;
- a poison document (one that kills the process every time): the chunks run only on a task's
  first try (:func:`uses_chunks`); its retry takes the leased path, whose attempt counted at
  claim and whose poison isolation (``suspect_cap``) find the document. Chunks never pick a
  retry, a suspect or a parked job;
- anything but an accepted or doubtful answer (a payload the store cannot read, an outage, a
  classifier that raises), or a write that fails: that chunk is rolled back and the rest of
  the try takes the leased path, unchanged (its retries, outages, probes and stop reasons);
- the state machine: ``queued -> completed`` and ``queued -> manual_review`` are moves of
  ``triage.job_transitions`` that only the app role may make (migration 0030).

Once no chunk is left, :func:`~triage.pipeline.steps.run_step` runs as always: it takes what
chunks never pick (retries due, jobs parked on an outage) and stops as it does today.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import sqlalchemy as sa

from triage.contracts.drill import DrillSettings
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import LedgerError
from triage.jobs.vocabulary.models import ClaimedJob, Outcome
from triage.observability import NULL_METRICS, Metrics, log_job_outcomes, observe_batch
from triage.pipeline.classify import ClassifyHandler
from triage.pipeline.heap import freeze_long_lived
from triage.pipeline.ownership import Drain
from triage.pipeline.steps import RunSettings, StepError, StepReport, run_step
from triage.tracing import batch_span

log = logging.getLogger(__name__)

IN_PROCESS_CLASSIFIERS = frozenset({"keyword", "learned"})
"""Classifiers that answer in process, in microseconds a document: a chunk's row locks are held
only that long. The llm classifier keeps the lease (its calls take seconds, and a heartbeat)."""


IN_CHUNKS_VARIABLE = "triage_classify_in_chunks"
"""The Airflow Variable that turns chunks off for every classify task (``off``): the leased path
for everything, as before issue #29 (a deployment that wants to compare, or to rule the path out)."""


def uses_chunks(
    classifier: str,
    *,
    try_number: int,
    separate_persist: bool,
    drill: DrillSettings | None,
    switched_off: bool = False,
) -> bool:
    """Whether a classify try claims, classifies and completes in one transaction.

    Only an in-process classifier's first try: a try that follows one that died (a poison
    document's SIGKILL rolled its chunk back, no attempt counted) takes the leased path, which
    counts attempts and isolates the poison. Not with a separate persist step (an accepted job
    advances, ``running -> queued``, for its external action), nor in a drill that injects
    faults: those exercise the leased path's retries and kills, as before. ``switched_off``:
    Variable :data:`IN_CHUNKS_VARIABLE` is ``off``.
    """
    return (
        not switched_off
        and classifier in IN_PROCESS_CLASSIFIERS
        and try_number <= 1
        and not separate_persist
        and not (drill is not None and drill.injects_faults)
    )


LANES = 2
"""Chunks in flight at once in one task, each its own transaction on its own connection: while
PostgreSQL writes one lane's chunk, the other lane's is classified, as the leased path's
background writer overlaps a claim's record with the next claim's handling. One lane ran a real
keyword day at about half the leased path's rate on a loaded machine (its classify and its
writes in turn, never at once)."""


def run_step_in_chunks(
    store: JobStore,
    handler: ClassifyHandler,
    *,
    batch_key: str,
    settings: RunSettings,
    metrics: Metrics = NULL_METRICS,
    drain: Drain | None = None,
    committed: Callable[[], None] | None = None,
) -> StepReport:
    """Settle the batch's queued jobs at the classify step in chunks of ``settings.batch_size``,
    one transaction each, :data:`LANES` at once, then :func:`~triage.pipeline.steps.run_step` for
    the rest (the same errors: :class:`~triage.pipeline.steps.WorkRemains`, ``CircuitOpen``,
    ``Drained``, …; their ``report`` counts the chunks too). ``committed`` is called after each
    chunk commits (it must not block: :meth:`triage.pipeline.trailing_relay.TrailingRelay.committed`)."""
    freeze_long_lived()  # the task's imports and set-up: out of the collector's walks (triage.pipeline.heap)
    drain = drain or Drain()
    report = StepReport(step=handler.step, batch_key=batch_key)
    began = time.perf_counter()
    version = handler.classifier_version
    counted = threading.Lock()
    stop = threading.Event()  # a chunk needs the lease, or the try is ending: every lane stops after its chunk

    def decide(jobs: Sequence[ClaimedJob]) -> list[Outcome]:
        with batch_span(handler.step, batch_key, jobs):
            return handler.handle(jobs)

    def lane() -> None:
        try:
            settle_chunks()
        except BaseException:
            # A bug fails the try at once, as in run_step: without this the other lane (which the
            # try may be waiting on) would go on over the whole batch before the try failed.
            stop.set()
            raise

    def settle_chunks() -> None:
        while not (drain.requested or stop.is_set()):  # a drain: run_step stops at once, with Drained
            started = time.perf_counter()
            try:
                chunk = store.chunks.settle(
                    batch_key=batch_key,
                    step=handler.step,
                    classifier_version=version,
                    limit=settings.batch_size,
                    actor=settings.owner,
                    decide=decide,
                    lease_seconds=settings.lease_seconds,
                )
            except (LedgerError, sa.exc.SQLAlchemyError) as exc:
                # Rolled back, nothing written: the leased path takes the batch, and meets the
                # same database (a dependency down fails the try there, with Airflow's retries).
                log.warning(
                    "step=%s batch=%s a chunk failed (%s): the leased claim takes the rest",
                    handler.step,
                    batch_key,
                    exc.__class__.__name__,
                )
                stop.set()
                return
            if not chunk.jobs:  # nothing left this lane may take (the other may hold the last chunk)
                return
            if chunk.rolled_back:
                kinds = dict(Counter(type(o).__name__ for o in chunk.outcomes))
                log.info(
                    "step=%s batch=%s a chunk of %d jobs rolled back, outcomes %s need a lease: the leased "
                    "claim takes the rest",
                    handler.step,
                    batch_key,
                    len(chunk.jobs),
                    kinds,
                )
                stop.set()
                return
            if committed is not None:
                committed()
            with counted:
                report.claimed += len(chunk.jobs)
                report.outcomes.update(type(o).__name__ for o in chunk.outcomes)
            observe_batch(metrics, handler.step, chunk.outcomes, time.perf_counter() - started)
            log_job_outcomes(log, handler.step, chunk.jobs, chunk.outcomes)

    with ThreadPoolExecutor(LANES, "triage-chunk") as lanes:
        # Each lane in a copy of this thread's context: the task's span and bound log fields.
        running = [lanes.submit(contextvars.copy_context().run, lane) for _ in range(LANES)]
        try:
            for done in running:
                done.result()  # what no chunk turns into an outcome (a bug) fails the try, as in run_step
        finally:  # an exception here (an execution_timeout): the lanes end with their chunk in hand
            stop.set()
    in_chunks = report.claimed
    log.info(
        "step=%s batch=%s %d jobs in chunks of one transaction, %.0f/s, outcomes=%s",
        handler.step,
        batch_key,
        in_chunks,
        in_chunks / max(time.perf_counter() - began, 1e-9),
        dict(report.outcomes),
    )
    try:
        rest = run_step(store, handler, batch_key=batch_key, settings=settings, metrics=metrics, drain=drain)
    except StepError as exc:
        exc.report = _merged(report, exc.report, began)  # type: ignore[attr-defined]
        raise
    return _merged(report, rest, began)


def _merged(chunks: StepReport, rest: StepReport, began: float) -> StepReport:
    return StepReport(
        step=chunks.step,
        batch_key=chunks.batch_key,
        claimed=chunks.claimed + rest.claimed,
        outcomes=chunks.outcomes + rest.outcomes,
        seconds=time.perf_counter() - began,
        stopped=rest.stopped,
    )
