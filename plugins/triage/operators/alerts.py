"""Triage's alerts on Airflow's notifier mechanism: the notifier, the task that decides a
``classify_documents`` run's alerts, and the run's deadline.

- :class:`TriageAlertNotifier` (an ``airflow.sdk.BaseNotifier``) sends one
  :class:`~triage.alerts.Alert` to the webhook of the ``triage_alerts`` connection, or logs it
  when that connection does not exist. Delivery never raises (:func:`triage.alerts.deliver`).
- :class:`RunAlertsOperator` is ``classify_documents``' last task (a teardown: it runs when
  every other task is done, succeeded or not, and its own state never decides the run's). It
  asks the ledger what this run sent to review or failed, emits the counters, and alerts past
  the thresholds. On the happy path ``publish_events``
  (:class:`PublishEventsThenAlertOperator`) does this at its end and skips the teardown.
- :func:`classify_deadline` is the DAG's ``DeadlineAlert``: Airflow's scheduler calls
  :class:`DeadlineMissedNotifier` through the executor (``SyncCallback``) when a run has not
  succeeded in time.

Connection ``triage_alerts`` (conn type ``http``): host is the webhook URL (or host, port and
path, as for every HTTP connection of Triage); extra ``headers`` (an object), ``timeout``
(seconds, default 5), ``format`` (``json``: ``{"text", "triage_alert"}``, the default; ``text``:
``{"text"}`` only) and the thresholds of :class:`triage.alerts.Thresholds`
(``review_min_jobs``, ``review_fraction``, ``terminal_min_jobs``, ``terminal_fraction``,
``orphan_min_jobs``). Without it, alerts are WARNING lines of the task's log and the default
thresholds apply. Thresholds live with the connection, not in the run's params: whoever may
trigger a run must not be able to silence its alerts.
"""

from __future__ import annotations

import logging
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk import BaseNotifier
from airflow.sdk.bases.xcom import BaseXCom

# airflow.sdk exports these too, but its type stub (3.3.2) does not name them yet.
from airflow.sdk.definitions.callback import SyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference
from airflow.sdk.exceptions import DownstreamTasksSkipped

from triage.adapters.connections import api_server_url
from triage.adapters.http_actions import ALERTS_CONN_ID, AlertRoute, alert_route
from triage.adapters.task_context import batch_key, run_began_after, run_prefix
from triage.operators.base import TriageOperator
from triage.operators.classify_documents import PublishEventsOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from triage.alerts import Alert
    from triage.jobs.sql.reads.alerts import RunMoves
    from triage.jobs.store import JobStore
    from triage.observability import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

CLASSIFY_DEADLINE = timedelta(days=1, hours=2)
"""From a ``classify_documents`` run's logical date (its data interval's start) to its deadline:
two hours after the day ends, when its scheduled run starts. A day's batch takes minutes, and
every Airflow retry of a task is over within half an hour."""


def run_link(dag_id: str, run_id: str) -> str:
    """The run's page in Airflow's UI (:func:`~triage.adapters.connections.api_server_url`)."""
    base = api_server_url()
    return f"{base}/dags/{urllib.parse.quote(dag_id, safe='')}/runs/{urllib.parse.quote(run_id, safe='')}"


def stats_metrics() -> Metrics:
    """Airflow's metrics API (``Stats``; dropped when no backend is configured)."""
    from triage.operators.metrics import AirflowStatsMetrics

    return AirflowStatsMetrics()


class TriageAlertNotifier(BaseNotifier):
    """Send a Triage alert to the ``triage_alerts`` webhook, or log it.

    :param alert: the alert to send; a subclass builds one from the context instead
        (:meth:`build`).
    :param conn_id: the connection naming the webhook (see the module's docstring).
    :param route: the connection's route when the caller has it already (else looked up).
    :param metrics: where the counters go (default: Airflow's ``Stats``).

    After :meth:`notify`, :attr:`outcome` says what happened: ``sent``, ``logged``,
    ``failed: …`` or None (nothing to send). Counters ``triage.alerts.sent.<kind>`` and
    ``triage.alerts.failed.<kind>``.
    """

    def __init__(
        self,
        alert: Alert | None = None,
        *,
        conn_id: str = ALERTS_CONN_ID,
        route: AlertRoute | None = None,
        metrics: Metrics | None = None,
        context: Any = None,
    ) -> None:
        super().__init__(context=context)
        self.alert, self.conn_id, self.route = alert, conn_id, route
        self.metrics = metrics or stats_metrics()
        self.outcome: str | None = None

    def build(self, context: Any) -> Alert | None:
        return self.alert

    def notify(self, context: Any) -> None:
        from triage.alerts import deliver

        alert = self.build(context)
        if alert is None:
            return
        self.outcome = deliver(alert, (self.route or alert_route(self.conn_id)).delivery)
        failed = self.outcome.startswith("failed")
        self.metrics.incr(f"triage.alerts.{'failed' if failed else 'sent'}.{alert.kind}", 1, {"dag_id": alert.dag_id})
        if not failed:
            log.info("alert %s %s", alert.key, self.outcome)


class DeadlineMissedNotifier(TriageAlertNotifier):
    """The deadline alert's callback. Airflow 3.3 gives it a reduced context: the run as the
    REST API shows it (``dag_run``) and the deadline (``deadline``: ``id``, ``deadline_time``).

    A deadline that had passed before the run was even queued (a backfill or a manual run of a
    past date: its logical date is long gone) is no miss of the daily schedule: it is logged
    (INFO) and not sent. Such runs answer to their run alerts and their state instead."""

    def build(self, context: Any) -> Alert | None:
        from triage.alerts import deadline_alert

        run = dict(context.get("dag_run") or {})
        deadline = dict(context.get("deadline") or {})
        dag_id, run_id = str(run.get("dag_id") or "classify_documents"), str(run.get("dag_run_id") or "?")
        due, begun = _moment(deadline.get("deadline_time")), _moment(run.get("queued_at") or run.get("start_date"))
        if due is not None and begun is not None and due <= begun:
            log.info(
                "deadline %s of %s run %s had passed before the run began (%s): a past date, no alert",
                due.isoformat(),
                dag_id,
                run_id,
                begun.isoformat(),
            )
            return None
        self.metrics.incr("triage.deadline.missed", 1, {"dag_id": dag_id})
        return deadline_alert(
            dag_id=dag_id,
            run_id=run_id,
            state=run.get("state"),
            deadline_time=due.isoformat() if due else None,
            queued_at=begun.isoformat() if begun else None,
            links={"run": run_link(dag_id, run_id)},
        )


def _moment(value: Any) -> datetime | None:
    """A timestamp of the callback's context: a datetime, or its ISO text after a JSON trip."""
    if value is None or isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def classify_deadline(interval: timedelta = CLASSIFY_DEADLINE, conn_id: str = ALERTS_CONN_ID) -> DeadlineAlert:
    """``classify_documents``' deadline: ``interval`` after a run's logical date, the start of its
    data interval (26 hours: 02:00 UTC the day after the day it classifies). A run that has not
    *succeeded* by then (still running, or failed) gets a ``deadline_missed`` alert.

    Not ``DAGRUN_QUEUED_AT``, which would time every run from when it was queued: in Airflow
    3.3.2 clearing a run whose queued-at deadline is still pending fails with ``TypeError:
    unsupported type for timedelta seconds component: dict`` (apache/airflow#70368: the clear
    path reads ``deadline_alert.interval``, JSON since 3.3.0, as seconds), and clearing a failed
    run is what an operator does after an outage.

    A ``SyncCallback``: the executor runs it (LocalExecutor and CeleryExecutor support callbacks
    in Airflow 3.3), with the connections a task sees, through the same notifier as every other
    Triage alert. The triggerer's ``AsyncCallback`` would need an async webhook client for one
    POST a day."""
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_LOGICAL_DATE,
        interval=interval,
        callback=SyncCallback(DeadlineMissedNotifier, kwargs={"conn_id": conn_id}),
        name="classify_documents succeeded in time",
    )


def under_dags_test(argv: Sequence[str] | None = None) -> bool:
    """Whether this process is ``airflow dags test`` (``make run``, ``triage dags-test``)."""
    args = sys.argv if argv is None else argv
    return list(args[1:3]) == ["dags", "test"]


def classify_deadlines(argv: Sequence[str] | None = None) -> list[DeadlineAlert]:
    """The deadlines ``classify_documents`` is parsed with: :func:`classify_deadline`, except
    in ``airflow dags test``.

    Airflow 3.3.2's ``dag.test()`` round-trips the DAG through its serializer in memory, which
    leaves encoded alerts where the ``deadline_alert`` ids belong, and when the run succeeds
    ``DagRun.update_state`` looks them up by id and raises (``'dict' object has no attribute
    'hex'``; apache/airflow#73428): the command exits 1 for a run that succeeded, and ``make run``
    with it. ``dags test`` runs without a scheduler, so no deadline could be judged there anyway."""
    return [] if under_dags_test(argv) else [classify_deadline()]


class RunAlertsOperator(TriageOperator):
    """The end of a ``classify_documents`` run: count what it sent to review or failed, and alert
    beyond the thresholds. Use it as a teardown downstream of every other task, so that it runs
    once they are all done (their failure callbacks included), whatever their states.

    Emits ``triage.review.entered`` and ``triage.terminal.entered`` (jobs this run moved there).
    Returns the counts and each alert's outcome. Raises only when the job database cannot be
    read (the task retries; as a teardown it never fails the run); delivery never raises.

    :param alerts_conn_id: the webhook connection (see the module's docstring).
    """

    ledger_step = None  # reads the ledger only

    def __init__(self, *, alerts_conn_id: str = ALERTS_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.alerts_conn_id = alerts_conn_id

    def get_metrics(self) -> Metrics:
        """The seam tests override: where the counters go."""
        return stats_metrics()

    def run_moves(self, store: JobStore, context: Context) -> RunMoves:
        """What this run moved of its batch (:meth:`triage.jobs.store.JobStore.run_moves`), read
        through ``store``: this task's, or that of the task doing its work
        (:class:`PublishEventsThenAlertOperator`). A seam tests override."""
        return store.run_moves(
            batch_key=batch_key(context), run_prefix=run_prefix(context), since=run_began_after(context)
        )

    def alert(self, moves: RunMoves, context: Context) -> dict[str, Any]:
        """Emit the run's counters (``triage.review.entered``, ``triage.terminal.entered``) and
        send each alert past this task's connection's thresholds, through its metrics; the counts
        and each alert's outcome. Delivery never raises."""
        from triage.alerts import run_alerts
        from triage.jobs.vocabulary.states import JobStatus

        ti = context["ti"]
        key = batch_key(context)
        review, terminal = moves.of(JobStatus.MANUAL_REVIEW), moves.of(JobStatus.TERMINAL_FAILED)
        tags = {"dag_id": ti.dag_id, "batch_key": key}
        metrics = self.get_metrics()
        metrics.incr("triage.review.entered", review.jobs, tags)
        metrics.incr("triage.terminal.entered", terminal.jobs, tags)
        route = alert_route(self.alerts_conn_id)
        alerts = run_alerts(
            moves, route.thresholds, dag_id=ti.dag_id, run_id=ti.run_id, links={"run": run_link(ti.dag_id, ti.run_id)}
        )
        outcomes = {}
        for alert in alerts:
            notifier = TriageAlertNotifier(alert, conn_id=self.alerts_conn_id, route=route, metrics=metrics)
            notifier(context)
            outcomes[alert.kind] = notifier.outcome
        log.info(
            "run %s of batch=%s (%d jobs): review_entered=%d terminal_failed=%d alerts=%s",
            ti.run_id,
            key,
            moves.batch_jobs,
            review.jobs,
            terminal.jobs,
            outcomes or "none",
        )
        return {
            "batch_jobs": moves.batch_jobs,
            "review_entered": review.jobs,
            "terminal_failed": terminal.jobs,
            "review_reasons": dict(review.reasons),
            "alerts": outcomes,
        }

    def execute(self, context: Context) -> dict[str, Any]:
        try:
            moves = self.run_moves(self.store, context)
        finally:
            self.dispose()
        return self.alert(moves, context)


class PublishEventsThenAlertOperator(PublishEventsOperator):
    """``publish_events`` that also does the ``alert`` teardown's work at its end, and then skips
    the teardown: on the happy path the run ends with its relay, with no task process started
    and no scheduler round spent only to count and alert (issue #29).

    The teardown is the one :class:`RunAlertsOperator` teardown directly downstream (none, or more
    than one: this task only relays, and each teardown alerts for itself); its read of the ledger, its connection and its metrics are used, through this
    task's engine, so the alerts are configured once, on the teardown.

    It is the run's last task but the teardown, so every other task (and its failure callback)
    is done when it alerts. Whenever it does not get that far (a task before it failed, so it
    never runs; the relay failed; the alert's read of the ledger raised), the teardown is left
    as it was and alerts for the run, with its own retries: the alerts are sent once either
    way, and an alert never fails the relay nor decides the run's state.

    Its return value is the relay's counts plus ``run_alerts`` (what :class:`RunAlertsOperator`
    returns); ``alert`` shows ``skipped`` when this task alerted.
    """

    def alert_teardown(self) -> RunAlertsOperator | None:
        """The teardown this task does the work of: the one :class:`RunAlertsOperator` teardown
        directly downstream, or None. Only a teardown may be skipped for it: a teardown still runs
        (and alerts) when this task fails or never runs, a plain downstream task would not."""
        found = [task for task in self.downstream_list if isinstance(task, RunAlertsOperator) and task.is_teardown]
        return found[0] if len(found) == 1 else None

    def execute(self, context: Context) -> dict[str, Any]:
        teardown = self.alert_teardown()
        if teardown is None:
            return super().execute(context)
        # Read before the relay, which disposes the engine, so the read takes no connection of its
        # own; the same moves either way: relaying the outbox moves no job.
        moves = _or_teardown(teardown, lambda: teardown.run_moves(self.store, context))
        done = super().execute(context)
        alerted = None if moves is None else _or_teardown(teardown, lambda: teardown.alert(moves, context))
        if alerted is None:
            return done
        done = {**done, "run_alerts": alerted}
        # Skipping raises before execute could return: push the return value first.
        context["ti"].xcom_push(key=BaseXCom.XCOM_RETURN_KEY, value=done)
        # Raised here, not through ``SkipMixin.skip``: that also stores a ``skipmixin_key`` XCom,
        # which a clear does not delete (only a new try of this task does) and which the
        # scheduler's NotPreviouslySkippedDep obeys. A cleared run whose classify then failed
        # (this task upstream_failed, never run again) would have its teardown skipped by it and
        # fail with no alert. The price: clearing only ``alert`` after a success alerts again.
        raise DownstreamTasksSkipped(tasks=[teardown.task_id])


def _or_teardown(teardown: RunAlertsOperator, step: Callable[[], T]) -> T | None:
    """``step()``, or None when it raises: logged, and ``teardown`` alerts for the run instead
    (the one degraded path of :class:`PublishEventsThenAlertOperator`: an alert never fails the relay)."""
    try:
        return step()
    except Exception:
        log.exception("could not alert for the run here; the %s teardown will", teardown.task_id)
        return None


def alert_on_orphans(
    summary: dict[str, Any], context: Context, conn_id: str = ALERTS_CONN_ID, metrics: Metrics | None = None
) -> str | None:
    """After a reconciliation: count the orphans it took back (``triage.reconcile.orphans``) and
    alert past the threshold. Returns the alert's outcome, or None when there was none."""
    from triage.alerts import orphan_alert, orphans_of

    ti = context["ti"]
    taken = sum(orphans_of(summary.get("repairs") or ()).values())
    metrics = metrics or stats_metrics()
    metrics.incr("triage.reconcile.orphans", taken)
    route = alert_route(conn_id)
    alert = orphan_alert(
        summary.get("repairs") or (),
        route.thresholds.orphans,
        dag_id=ti.dag_id,
        run_id=ti.run_id,
        reconciliation_run=(summary.get("run") or {}).get("id"),
        links={"run": run_link(ti.dag_id, ti.run_id)},
    )
    if alert is None:
        return None
    notifier = TriageAlertNotifier(alert, conn_id=conn_id, route=route, metrics=metrics)
    notifier(context)
    return notifier.outcome
