"""``stream_events``: relay the outbox while ``classify`` and ``persist`` run, so that a run's
events go out as its jobs move instead of all after its last step.

It starts beside ``size_classify`` (after ``retrieve`` in ``classify_documents``) and relays
again and again until the batch has no job a step will still move
(:func:`triage.pipeline.publish.stream_while_worked`); ``publish_events`` runs after it and
after ``persist`` and sends whatever is left, so the stream may stop at any moment without an
event waiting longer than it did before. Being early is all it adds: a relay error (the sink or
the database down) ends the stream with a warning, and ``publish_events``, which meets the same
error, is the task that fails and retries. Only a killed stream fails; like every task it is
retried (the retry finds the batch done and ends at once), and ``publish_events`` waits for it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from triage.operators.base import TriageOperator, batch_key, event_sink

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)


class StreamEventsOperator(TriageOperator):
    """Relay unsent outbox events while the batch's jobs are being worked on.

    :param event_log: the JSON-lines event log (as :class:`~triage.operators.PublishEventsOperator`).
    :param webhook_conn_id: when set, POST events to this HTTP connection's URL instead.
    :param idle_seconds: stop once nothing was sent for this long while no job of the batch runs.
    """

    ledger_step = None  # relays the outbox: no job is held or left unfinished by it

    template_fields = ("event_log",)

    def __init__(
        self,
        *,
        event_log: str | None = None,
        webhook_conn_id: str | None = None,
        idle_seconds: float = 3.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.event_log, self.webhook_conn_id, self.idle_seconds = event_log, webhook_conn_id, idle_seconds

    def execute(self, context: Context) -> dict[str, Any]:
        from triage.pipeline.publish import StreamSettings, stream_while_worked

        key, sent = batch_key(context), 0
        sink = event_sink(self.webhook_conn_id, self.event_log)
        try:
            sent = stream_while_worked(self.store, sink, key, StreamSettings(idle_seconds=self.idle_seconds))
        except Exception as exc:  # noqa: BLE001 - the stream is an early start, never the run's fate
            log.warning("stream of batch %s stopped by %s; publish_events sends the rest", key, type(exc).__name__)
        finally:
            sink.close()
            self.dispose()
        log.info("streamed %d events of batch %s", sent, key)
        return {"streamed": sent}
