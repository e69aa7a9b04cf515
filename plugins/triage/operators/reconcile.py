"""The operator of ``reconcile_jobs``: an adapter over :mod:`triage.reconciliation`.

It reads the run's params, builds the event sink and the Airflow REST client, runs one
reconciliation, writes the Markdown report to the task log, logs the HTML page's path, emits
gauges and counters through Airflow's metrics API (StatsD or OpenTelemetry when enabled), and
returns the JSON summary (XCom). Domain code stays Airflow-free: metrics live here. When the
run took back orphaned work (a dead worker's leases, a dead run's jobs) it alerts through the
``triage_alerts`` connection (:func:`triage.operators.alerts.alert_on_orphans`). Airflow's DAG
runs reach the rules through the Task SDK (:meth:`ReconcileJobsOperator.get_dag_runs`): the
resumes of work parked on an outage it plans are cleared by the DAG's next tasks
(:mod:`triage.operators.outage_resume`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook, conf
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

from triage.adapters.connections import api_server_url, http_url, variable
from triage.adapters.http_actions import event_sink
from triage.operators.alerts import ALERTS_CONN_ID, alert_on_orphans
from triage.operators.base import TriageOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from triage.adapters.airflow_api import AirflowApi
    from triage.reconciliation.outage_resumes import DagRuns

log = logging.getLogger(__name__)

DAGS_TEST_USER = "dag_test"
"""The triggering user Airflow 3.3 gives a run of ``airflow dags test`` (``Dag.test``)."""


def under_dags_test(context: Context) -> bool:
    """Whether this run is ``airflow dags test``'s (``make run``, the DAG tests): no scheduler or
    API server started with it, so there is none to wait for."""
    return getattr(context.get("dag_run"), "triggering_user_name", None) == DAGS_TEST_USER


def emit_metrics(summary: dict[str, Any]) -> None:
    """Gauges of the ledger's state and counters of this run's repairs and conflicts."""
    from airflow.sdk.observability.stats import Stats

    for state, n in summary["by_state"].items():
        Stats.gauge(f"triage.jobs.{state}", n)
    for row in summary["queue_age"]:
        Stats.gauge(f"triage.queue_age_seconds.{row['status']}", row["oldest_seconds"])
    Stats.gauge("triage.review.open", summary["totals"]["open_reviews"])
    Stats.gauge("triage.outbox.unsent", summary["outbox"]["unsent"])
    Stats.gauge("triage.outbox.oldest_seconds", summary["outbox"]["oldest_seconds"])
    for repair in summary["repairs"]:
        Stats.incr(f"triage.reconcile.repairs.{repair['action']}", repair["count"])
    for conflict in summary["conflicts"]:
        Stats.incr(f"triage.reconcile.conflicts.{conflict['check']}", conflict["count"])
    Stats.incr("triage.reconcile.runs")


class ReconcileJobsOperator(TriageOperator):
    """Return expired leases, find stuck work, republish old outbox events, check that jobs,
    labels, reviews and Airflow's task states agree, repair what is certain, and report.

    :param reports_dir: where the HTML page goes (default: Variable ``triage_reports_dir``, then
        ``$TRIAGE_REPORTS_DIR``, then ``$TRIAGE_HOME/reports``).
    :param event_log: the JSON-lines event log old events are republished to (as ``publish_events``).
    :param webhook_conn_id: when set, republish to this HTTP connection's URL instead.
    :param api_conn_id: the connection to Airflow's API server: its host is the base URL and
        its login and password go to ``POST /auth/token``; every deployment of Triage provisions
        it with a read-only user (``triage_reconcile``); a host without a port gets ``[api] port``.
        Without it: ``[api] base_url``, else localhost at ``[api] port``
        (:func:`~triage.adapters.connections.api_server_url`), and ``GET /auth/token`` (simple auth
        manager with all admins).
    :param llm_conn_id: the model connection: its settings are part of the ``llm`` classifier's
        version, and queued jobs of a version no classifier has are reported.
    :param alerts_conn_id: where the orphans alert goes (see :mod:`triage.operators.alerts`).
    :param api_wait_seconds: how long the cross-check waits for an API server that refuses
        connections (still starting: the first run after ``make up``), with backoff, before it
        is skipped; not under ``airflow dags test``, which starts no API server.
    """

    template_fields = ("reports_dir", "event_log")

    def __init__(
        self,
        *,
        reports_dir: str | None = None,
        event_log: str | None = None,
        webhook_conn_id: str | None = None,
        api_conn_id: str = "airflow_api",
        llm_conn_id: str = "triage_llm",
        alerts_conn_id: str = ALERTS_CONN_ID,
        api_wait_seconds: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.alerts_conn_id, self.api_wait_seconds = alerts_conn_id, api_wait_seconds
        self.reports_dir, self.event_log = reports_dir, event_log
        self.webhook_conn_id, self.api_conn_id, self.llm_conn_id = webhook_conn_id, api_conn_id, llm_conn_id

    def get_airflow_api(self, wait_s: float = 0.0) -> AirflowApi:
        """The seam tests override: a client of Airflow's public REST API that waits up to
        ``wait_s`` for an API server still starting."""
        from triage.adapters.airflow_api import AirflowApi

        base_url = api_server_url()
        username = password = None
        try:
            connection = BaseHook.get_connection(self.api_conn_id)
        except AirflowNotFoundException:
            connection = None
        if connection is not None:
            if connection.host:
                base_url = http_url(connection, default_port=conf.getint("api", "port", fallback=8080))
            username, password = connection.login or None, connection.password
        return AirflowApi(base_url, username=username, password=password, wait_s=wait_s)

    def get_dag_runs(self, context: Context) -> DagRuns:
        """The seam tests override: Airflow's DAG runs as this task instance sees them (the
        Task SDK), to plan the resumes of work parked on an outage."""
        from triage.operators.outage_resume import TaskSdkDagRuns

        return TaskSdkDagRuns(context["ti"])

    def execute(self, context: Context) -> dict[str, Any]:
        from triage import settings
        from triage.adapters.model_api import configured_classifier_versions
        from triage.operators.tasks import DEFAULT_ARGS
        from triage.reconciliation.params import InvalidReconcileParams, ReconcileParams
        from triage.reconciliation.runner import reconcile

        try:
            params = ReconcileParams.from_params(context["params"])
        except InvalidReconcileParams as exc:
            raise AirflowFailException(str(exc)) from None
        sink = event_sink(self.webhook_conn_id, self.event_log)
        api = self.get_airflow_api(0.0 if under_dags_test(context) else self.api_wait_seconds)
        reports = settings.reports_dir(self.reports_dir or variable("triage_reports_dir"))
        try:
            outcome = reconcile(
                self.store,
                params,
                publish=sink.publish,
                api=api,
                reports_dir=reports,
                classifier_versions=configured_classifier_versions(self.llm_conn_id, self.store.engine),
                runs=self.get_dag_runs(context),
                dag_run_id=context["run_id"],
                # The classifying tasks' last try: jobs a dead one held are the ledger-only rule's.
                final_try=int(DEFAULT_ARGS["retries"]) + 1,
            )
        finally:
            api.close()
            sink.close()
            self.dispose()
        log.info("reconciliation report (run %d)\n%s", outcome.run_id, outcome.markdown)
        if outcome.html_path is not None:
            log.info("HTML report: %s", outcome.html_path)
        else:
            log.warning("the HTML report was not rendered (see the error above); the JSON summary is in XCom")
        emit_metrics(outcome.summary)
        alert_on_orphans(outcome.summary, context, self.alerts_conn_id)
        return outcome.summary
