"""The operator of ``triage_maintenance``: an adapter over :mod:`triage.maintenance.retention`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from triage.operators.base import MAINTENANCE_CONN_ID, TriageOperator, variable

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)


class ApplyRetentionOperator(TriageOperator):
    """Make the coming days' partitions, rotate the event file, and remove what the deployment's
    retention says is expired (never anything open); return what went, per kind (XCom).

    The job database is ``triage_db_maintenance`` by default: the maintenance role's login, the
    only one that may run the retention functions, within the owner's ``triage.retention_policy``
    (``retention`` can keep the ledger's kinds longer than the policy, never shorter).

    :param retention: a JSON object of days per kind (default: Variable ``triage_retention``,
        then ``$TRIAGE_RETENTION``, then :class:`triage.settings.Retention`'s defaults).
    :param payload_base: the payload store (default: Variable ``triage_payload_base``, then
        ``$TRIAGE_PAYLOAD_BASE``, then ``$TRIAGE_HOME/payloads``).
    :param event_log: the JSON-lines event file whose rotated files expire (default: Variable
        ``triage_event_sink``, then ``$TRIAGE_EVENT_LOG``, then ``$TRIAGE_HOME/events/outbox.jsonl``).
    :param reports_dir: the reconciliation reports' folder (default: Variable
        ``triage_reports_dir``, then ``$TRIAGE_REPORTS_DIR``, then ``$TRIAGE_HOME/reports``).
    """

    template_fields = ("retention", "payload_base", "event_log", "reports_dir")

    def __init__(
        self,
        *,
        retention: str | None = None,
        payload_base: str | None = None,
        event_log: str | None = None,
        reports_dir: str | None = None,
        triage_conn_id: str = MAINTENANCE_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(triage_conn_id=triage_conn_id, **kwargs)
        self.retention, self.payload_base = retention, payload_base
        self.event_log, self.reports_dir = event_log, reports_dir

    def execute(self, context: Context) -> dict[str, Any]:
        from triage import settings
        from triage.maintenance.retention import apply_retention

        try:
            retention = settings.retention(self.retention or variable("triage_retention"))
        except ValueError as exc:  # a wrong setting will not fix itself on a retry
            raise AirflowFailException(f"triage_retention: {exc}") from None
        try:
            report = apply_retention(
                self.engine,
                retention,
                payload_base=settings.payload_base(self.payload_base or variable("triage_payload_base")),
                event_log=settings.event_log(self.event_log or variable("triage_event_sink")),
                reports_dir=settings.reports_dir(self.reports_dir or variable("triage_reports_dir")),
            )
        finally:
            self.dispose()
        log.info("retention applied in %.1f s\n%s", report.seconds, "\n".join(report.lines()))
        return report.as_dict()
