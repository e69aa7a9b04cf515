"""The reconciliation rules. Each takes the store and the run's params and returns a
:class:`~triage.reconciliation.findings.RuleResult`; with ``dry_run`` it only reads.

A rule reads through the ledger's named checks (:mod:`triage.jobs.sql.reads.checks`, on the store's
read-only connection) and repairs only where the repair is certain, through the store's named
repairs (:mod:`triage.jobs.sql.moves.repairs`: allowed transitions, fenced statements); anything it cannot
settle with certainty is a :class:`Conflict` for a human. ``docs/reconciliation.md`` gives the reasoning
behind each decision.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import httpx

from triage.contracts.events import WorkEvent
from triage.jobs.sql.reads import checks as Q
from triage.jobs.sql.reads import last_tries
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import REPAIRER
from triage.jobs.vocabulary.states import JobStatus
from triage.reconciliation.findings import Conflict, Finding, Repair, RuleResult, sample
from triage.reconciliation.params import ReconcileParams

Publish = Callable[[Sequence[WorkEvent]], None]
SINK_ERRORS: tuple[type[Exception], ...] = (OSError, httpx.HTTPError)
"""What the event sinks raise when the destination is unavailable (file system, webhook)."""


def _check(store: JobStore, statement: Any, **params: Any) -> Any:
    with store.reading() as conn:
        return conn.execute(statement, params).one()


def _finding(check: str, row: Any, detail: str, repair: str | None = None) -> Finding:
    return Finding(
        check, int(row.n), detail, sample(row.job_ids), repair, {"oldest_seconds": round(float(row.oldest_seconds), 1)}
    )


def expired_leases(store: JobStore, params: ReconcileParams) -> RuleResult:
    """Running jobs whose lease has passed go back to ``retryable_failed`` (due at once), or to
    ``manual_review`` once rescued ``max_rescues`` times (``lease_expired_repeatedly``) or out
    of attempts (``retries_exhausted``): :meth:`JobStore.release_expired_leases`, fenced."""
    row = _check(store, Q.expired_leases())
    findings = (_finding("lease_expired", row, "running jobs whose lease has passed", "release_expired_leases"),)
    if params.dry_run or row.n == 0:
        return RuleResult("expired_leases", findings=findings if row.n else ())
    released = store.release_expired_leases(max_rescues=params.max_rescues, actor=REPAIRER)
    repairs = []
    if released.retrying:
        repairs.append(
            Repair(
                "lease_released",
                released.retrying,
                "expired lease: retryable_failed, due now",
                sample(released.job_ids),
            )
        )
    if released.to_review:
        repairs.append(
            Repair(
                "lease_released_to_review",
                released.to_review,
                "expired lease, rescued too often or out of attempts: manual_review",
                sample(released.job_ids),
            )
        )
    return RuleResult("expired_leases", findings=findings, repairs=tuple(repairs))


STUCK_STATES = (JobStatus.RECEIVED, JobStatus.QUEUED, JobStatus.RETRYABLE_FAILED, JobStatus.WAITING, JobStatus.RUNNING)
"""The unfinished states (:data:`~triage.jobs.vocabulary.states.UNFINISHED`; a test keeps them equal) in
the order their stuck checks run and the report lists them."""


def stuck_work(
    store: JobStore,
    params: ReconcileParams,
    classifier_versions: Collection[str] | None = None,
) -> RuleResult:
    """Jobs in a state longer than its threshold. Only two have a certain repair:

    - ``received`` → ``queued`` with its ``job.registered`` event: ``queued`` means exactly
      "received, and its event recorded", so this finishes retrieval's own last step;
    - ``retryable_failed`` with its attempts spent → ``manual_review`` (``retries_exhausted``):
      no claim can ever take it.

    The rest (``queued``, ``waiting``, due ``retryable_failed``, long ``running`` under a live
    lease) are reported: they wait for a run of their batch or an external system, and moving
    them would take work from whoever may still hold it.

    With ``classifier_versions`` (the versions of the deployment's classifiers now), jobs
    waiting for a classify claim under any other version are reported as ``version_mismatch``:
    a claim takes only its own classifier's version, so only a run with theirs (the taxonomy,
    model or prompt they were registered under) will take them. Not repaired: whether that
    version comes back or the jobs are obsolete (a re-run of the date registers new ones under
    the new version) is a human's call.
    """
    findings: list[Finding] = []
    for status in STUCK_STATES:  # every check first: a repair must not feed the next check
        row = _check(store, Q.stuck_in(status), threshold=params.threshold(status))
        if row.n:
            repair = "queue_received" if status == JobStatus.RECEIVED else None
            detail = f"{status.value} for more than {params.threshold(status)} s"
            findings.append(_finding(f"stuck_{status.value}", row, detail, repair))
    row = _check(store, Q.unclaimable_retryable(), grace=params.grace_seconds)
    if row.n:
        findings.append(
            _finding("retryable_unclaimable", row, "retryable_failed with every attempt spent", "exhaust_unclaimable")
        )
    if classifier_versions is not None:
        row = _check(store, Q.unclaimable_version(), grace=params.grace_seconds, versions=sorted(classifier_versions))
        if row.n:
            findings.append(
                _finding(
                    "version_mismatch",
                    row,
                    f"waiting for a classifier version none of {', '.join(sorted(classifier_versions))} is",
                )
            )
    repairs: list[Repair] = []
    planned = {f.repair for f in findings}
    if not params.dry_run and "queue_received" in planned:
        ids = store.queue_stuck_received(older_than_seconds=params.received_seconds)
        if ids:
            repairs.append(Repair("queued_received", len(ids), "received -> queued with job.registered", sample(ids)))
    if not params.dry_run and "exhaust_unclaimable" in planned:
        ids = store.send_spent_retries_to_review(grace_seconds=params.grace_seconds)
        if ids:
            repairs.append(
                Repair(
                    "exhausted_unclaimable",
                    len(ids),
                    "retryable_failed -> manual_review (retries_exhausted)",
                    sample(ids),
                )
            )
    return RuleResult("stuck_work", findings=tuple(findings), repairs=tuple(repairs))


def outbox(store: JobStore, params: ReconcileParams, publish: Publish | None) -> RuleResult:
    """Report the outbox lag; republish events unsent for longer than ``outbox_age_seconds``.

    Relaying is at least once and every sink is keyed by event id, so republishing is safe. A
    sink that is down degrades the rule to a finding; the lag stays visible in the report.
    """
    lag = _check(store, Q.outbox_lag(), threshold=params.outbox_age_seconds)
    data = {"unsent": int(lag.unsent), "oldest_seconds": round(float(lag.oldest_seconds), 1), "old": int(lag.old)}
    findings = []
    if lag.unsent:
        findings.append(
            Finding(
                "outbox_lag",
                int(lag.unsent),
                f"unsent events, {lag.old} older than {params.outbox_age_seconds} s",
                (),
                "republish" if lag.old else None,
                data,
            )
        )
    if params.dry_run or lag.old == 0:
        return RuleResult("outbox", findings=tuple(findings))
    if publish is None:
        return RuleResult("outbox", findings=tuple(findings), skipped="no event sink configured")
    sent = 0
    try:
        while sent < lag.old:
            n = store.relay(publish, limit=min(1000, lag.old - sent), actor=REPAIRER)
            if n == 0:
                break
            sent += n
    except SINK_ERRORS as exc:
        findings.append(Finding("republish_failed", lag.old - sent, f"the event sink refused: {type(exc).__name__}"))
    repairs = (Repair("republished", sent, "old unsent events relayed to the event sink"),) if sent else ()
    return RuleResult("outbox", findings=tuple(findings), repairs=repairs)


def _repairable(
    store: JobStore,
    params: ReconcileParams,
    check: str,
    query: Any,
    detail: str,
    action: str,
    repair: Callable[..., list[Any]],
    done: str,
) -> tuple[list[Finding], list[Repair]]:
    row = _check(store, query, grace=params.grace_seconds)
    if row.n == 0:
        return [], []
    finding = _finding(check, row, detail, action)
    if params.dry_run:
        return [finding], []
    ids = repair(grace_seconds=params.grace_seconds)
    return [finding], ([Repair(action, len(ids), done, sample(ids))] if ids else [])


def consistency(store: JobStore, params: ReconcileParams) -> RuleResult:
    """Jobs, labels, review rows and events agree.

    Repaired (certain): a job in ``manual_review`` without an open review row (the row is
    inserted, reason ``reconciliation_missing_review``); an open review row of a job that is
    already terminal (resolved as ``superseded``: no decision can apply); a completed job
    without a completion event (``job.completed`` appended). Conflicts (a human decides): a
    completed job without its label, a label whose job is not completed, an open review row of
    a job back in automatic hands. An audit sample (an open review row, reason ``audit_sample``,
    of a completed job: :mod:`triage.jobs.sql.audit_samples`) is none of these.
    """
    findings: list[Finding] = []
    repairs: list[Repair] = []
    conflicts: list[Conflict] = []
    for check, query, detail, action, repair, done in (
        (
            "review_row_missing",
            Q.review_row_missing(),
            "manual_review without an open review row",
            "insert_missing_review",
            store.open_missing_reviews,
            "open review row inserted",
        ),
        (
            "review_open_for_terminal_job",
            Q.stale_open_reviews(True),
            "open review row of a terminal job",
            "supersede_review",
            store.supersede_reviews_of_terminal_jobs,
            "review row resolved as superseded",
        ),
        (
            "completed_without_event",
            Q.completed_without_event(),
            "completed without a completion event",
            "append_completed_event",
            store.append_missing_completion_events,
            "job.completed appended to the outbox",
        ),
    ):
        found, done_repairs = _repairable(store, params, check, query, detail, action, repair, done)
        findings += found
        repairs += done_repairs
    for check, query, detail in (
        ("completed_without_label", Q.completed_without_label(), "completed job without its document label"),
        ("label_without_completed_job", Q.label_without_completed_job(), "label whose job is not completed"),
        ("review_open_for_active_job", Q.stale_open_reviews(False), "open review row of a job back in automatic hands"),
    ):
        row = _check(store, query, grace=params.grace_seconds)
        if row.n:
            findings.append(_finding(check, row, detail))
            conflicts.append(Conflict(check, int(row.n), detail, sample(row.job_ids)))
    return RuleResult("consistency", findings=tuple(findings), repairs=tuple(repairs), conflicts=tuple(conflicts))


def orphaned_work(store: JobStore, params: ReconcileParams) -> RuleResult:
    """Claimable jobs of a batch nobody has worked on for ``orphan_seconds`` go to
    ``manual_review`` (``orphaned``): :meth:`JobStore.send_orphans_to_review`, fenced.

    The backstop that needs no Airflow API: a run that died where no failure callback ran
    (SIGKILL, OOM) leaves its batch's ``queued`` and ``retryable_failed`` jobs behind, and the
    Airflow view can settle them only when it can ask Airflow. The guard against fighting a live
    run is progress: a live run claims, heartbeats and completes, and every one of those writes
    some job of its batch; a batch with any job written within the threshold, or any job
    ``running`` (a lease) or ``waiting`` (parked on a dependency), is left alone. The threshold
    is hours, far beyond a run's retries. Not back to the queue: the jobs are claimable already
    and nobody claimed them; a reviewer's requeue (or replay by reason ``orphaned``) with a new
    run of the date is the decision to try again.
    """
    row = _check(store, Q.orphaned_work(), threshold=params.orphan_seconds)
    if row.n == 0:
        return RuleResult("orphaned_work")
    detail = f"queued or retryable in a batch with no progress for {params.orphan_seconds} s"
    findings = (_finding("orphaned", row, detail, "orphans_sent_to_review"),)
    if params.dry_run:
        return RuleResult("orphaned_work", findings=findings)
    ids = store.send_orphans_to_review(idle_seconds=params.orphan_seconds)
    repairs = (
        (
            Repair(
                "orphans_sent_to_review", len(ids), "queued/retryable_failed -> manual_review (orphaned)", sample(ids)
            ),
        )
        if ids
        else ()
    )
    return RuleResult("orphaned_work", findings=findings, repairs=repairs)


def dead_last_tries(
    store: JobStore,
    params: ReconcileParams,
    final_try: int | None,
    api_skipped: str | None,
    viewed_dag: str | None = None,
) -> RuleResult:
    """Retryable jobs whose last holder was its task's final try (``final_try``: the classifying
    tasks' retries + 1), due for ``last_try_seconds`` in a batch idle for as long, go to
    ``manual_review`` (``airflow_task_failed``): :meth:`JobStore.last_tries.send_dead_last_tries_to_review`,
    fenced. A ledger-only rule: it needs no Airflow API, and says in its finding whether the API
    answered (``api_skipped``: why the Airflow view was skipped, or None). When the view ran, the
    holders of its DAG (``viewed_dag``) are left to it: it knows the batch's other runs, and
    refuses while one of them is queued or running.

    A SIGKILL on a task's last try leaves the jobs it held behind with no failure callback; the
    lease rule gives them back as ``retryable_failed``, due at once, and no retry of that task
    will ever claim them. The Airflow view settles them where the API answers; this rule where
    it does not, in an hour instead of the orphan rule's twelve. ``docs/reconciliation.md``
    gives the threshold's reasoning. Without ``final_try`` (the tasks' retries are unknown
    outside Airflow) it is skipped."""
    if final_try is None:
        return RuleResult("dead_last_tries", skipped="no final try known (the classifying tasks' retries)")
    viewed = last_tries.viewed_prefix(viewed_dag)
    row = _check(
        store,
        last_tries.dead_last_tries(),
        threshold=params.last_try_seconds,
        final_try=final_try,
        viewed_prefix=viewed,
    )
    if row.n == 0:
        return RuleResult("dead_last_tries")
    why = "Airflow API unreachable: ledger-only rule" if api_skipped else "ledger-only rule"
    detail = (
        f"retryable_failed whose last holder was its task's final try (try {final_try}), due for more "
        f"than {params.last_try_seconds} s in a batch idle as long; {why}"
    )
    data = {
        "oldest_seconds": round(float(row.oldest_seconds), 1),
        "threshold_seconds": params.last_try_seconds,
        "final_try": final_try,
        "airflow_api": "unreachable" if api_skipped else "answered",
    }
    findings = (Finding("last_try_dead", int(row.n), detail, sample(row.job_ids), "last_try_dead_to_review", data),)
    if params.dry_run:
        return RuleResult("dead_last_tries", findings=findings)
    ids = store.last_tries.send_dead_last_tries_to_review(
        idle_seconds=params.last_try_seconds, final_try=final_try, viewed_dag=viewed_dag
    )
    repairs = (
        (Repair("last_try_dead_to_review", len(ids), f"retryable_failed -> manual_review ({detail})", sample(ids)),)
        if ids
        else ()
    )
    return RuleResult("dead_last_tries", findings=findings, repairs=repairs)


def unfinished_by_batch(store: JobStore, batch_keys: Sequence[str]) -> dict[str, Any]:
    """``batch_key -> (count, oldest_seconds, job_ids)`` of the unfinished jobs of each batch."""
    if not batch_keys:
        return {}
    with store.reading() as conn:
        rows = conn.execute(Q.unfinished_by_batch(), {"batch_keys": list(batch_keys)}).all()
    return {r.batch_key: r for r in rows}
