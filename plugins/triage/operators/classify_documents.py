"""The operators of ``classify_documents``: retrieve → classify → persist → publish events.

Each is an adapter: it reads the run's config and connections, calls :mod:`triage.pipeline`,
and maps the pipeline's stop reasons onto Airflow's retry semantics. ``AirflowException``
(here: work remains, circuit open) fails the try and Airflow retries it with exponential
backoff; ``AirflowFailException`` (a misconfigured dependency, invalid params) fails without
retrying. Per-document failures never fail a task: they are outcomes in the ledger.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from triage.adapters.connections import variable
from triage.adapters.http_actions import LABEL_ACTION_CONN_ID, build_label_action, event_sink, label_action_connection
from triage.adapters.model_api import model_access
from triage.adapters.task_context import batch_key, lease_owner, owner_prefix
from triage.jobs.vocabulary.states import Step
from triage.operators import lineage
from triage.operators.base import TriageOperator
from triage.operators.retry import DependencyOutage

if TYPE_CHECKING:
    from airflow.sdk import Context

    from triage.pipeline.publish import EventSink
    from triage.pipeline.trailing_relay import TrailingRelay


log = logging.getLogger(__name__)

__all__ = ["DOCUMENT_LABELS", "SUMMARY_KEY"]

DOCUMENT_LABELS = Asset(name="triage_document_labels", uri="triage://document_labels")
"""Updated whenever a run publishes: downstream DAGs can be scheduled on it."""

SUMMARY_KEY = "summary"
"""The XCom key of a ``classify`` try's counts (its return value is what it leaves ``persist``)."""


def _payloads(explicit: str | None) -> Any:
    from airflow.sdk import ObjectStoragePath

    from triage import settings
    from triage.payloads import PayloadStore

    base = settings.payload_base(explicit or variable("triage_payload_base"))
    return PayloadStore(ObjectStoragePath(base) if "://" in base else base)


def confined_inbox(inbox: str) -> Any:
    """The run's inbox, if it lies inside this deployment's inbox roots (resolved: symlinks and
    ``..`` cannot lead out); otherwise the task fails without retry, naming the roots."""
    from triage import settings
    from triage.sources.inbox_roots import InboxNotAllowed, confine_inbox

    try:
        return confine_inbox(inbox, settings.inbox_roots(), base=settings.project_root())
    except InboxNotAllowed as exc:
        raise AirflowFailException(str(exc)) from None


class RetrieveDocumentsOperator(TriageOperator):
    """Read the run's data interval from the configured source and register one job per document.

    :param payload_base: where payloads are stored (default: Variable ``triage_payload_base``,
        then ``$TRIAGE_PAYLOAD_BASE``, then ``$TRIAGE_HOME/payloads``).
    :param llm_conn_id: the model connection (its settings are part of the classifier version).
    :param shard: with ``shards``, this task registers only the documents of shard ``shard``
        (by external id; :class:`~triage.sources.base.Shard`): the DAG maps it over every shard.
    """

    ledger_step = Step.CLASSIFY  # the jobs it registers wait there

    template_fields = ("payload_base",)

    def __init__(
        self,
        *,
        payload_base: str | None = None,
        llm_conn_id: str = "triage_llm",
        shard: int = 0,
        shards: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.payload_base = payload_base
        self.llm_conn_id = llm_conn_id
        self.shard, self.shards = shard, shards

    def execute(self, context: Context) -> dict[str, Any]:
        from triage.classifiers import Taxonomy
        from triage.pipeline.classify_plan import run_classifier_version
        from triage.pipeline.retrieve import retrieve
        from triage.sources import Shard, build_source

        config = self.run_config(context)
        key = batch_key(context)  # refuses a run without a data interval
        start, end = context["data_interval_start"], context["data_interval_end"]
        assert start is not None
        assert end is not None
        inbox = None
        if config.source == "synthetic":
            source = build_source(
                "synthetic",
                documents=config.documents,
                seed=config.drill.seed,
                duplicate_rate=config.drill.duplicate_rate,
            )
        else:
            inbox = confined_inbox(config.inbox)
            source = build_source("jsonl", inbox=inbox)
        source = Shard(source, self.shard, self.shards)
        # The version only: no classifier is built (the learned one's is the registry's champion row).
        version = run_classifier_version(config, Taxonomy.load(), model_access(config, self.llm_conn_id, self.store))
        try:
            result = retrieve(
                self.store,
                source,
                _payloads(self.payload_base),
                start=start,
                end=end,
                batch_key=key,
                classifier_version=version,
                max_attempts=config.max_attempts,
                actor=lease_owner(context),
            )
        finally:
            self.dispose()
        log.info(
            "retrieved batch=%s shard=%d/%d read=%d registered=%d existing=%d malformed=%d rate=%.0f/s",
            key,
            self.shard,
            self.shards,
            result.read,
            result.registered,
            result.existing,
            result.malformed,
            result.rate,
        )
        done = {
            "read": result.read,
            "registered": result.registered,
            "existing": result.existing,
            "malformed": result.malformed,
            "seconds": round(result.seconds, 3),
        }
        self.record_lineage(
            lambda: self.ledger_lineage(
                context, [], ["jobs", "job_events", "outbox"], done, also_read=[lineage.source(inbox)]
            )
        )
        return done


class ClassifyDocumentsOperator(TriageOperator):
    """Claim the batch's jobs in batches under a lease and classify them.

    :param batch_size: jobs per claim (and per recording transaction).
    :param retry_soon_seconds: retryable jobs due within this are retried in the same try;
        later ones fail the try so that Airflow's retry picks them up.
    :param separate_persist: hand accepted jobs to the ``persist`` step instead of completing
        them here; on by itself when the label action connection exists, since ``persist``
        then runs the external action.
    :param action_conn_id: the label action connection (see :data:`LABEL_ACTION_CONN_ID`).
    :param worker: which of the DAG's parallel classify tasks this is (the DAG maps over it).
        Every one claims from the whole batch with ``FOR UPDATE SKIP LOCKED``, so they split the
        work without a partition and one that dies leaves nothing unreachable; its lease owner
        carries the map index.
    :param relay_events: relay the outbox on a thread of this task while it classifies
        (:mod:`triage.pipeline.trailing_relay`), through the sink of the ``publish_events`` task
        downstream of it, so that ``publish_events`` sends only what is left; no relay without
        such a task downstream, or with Variable ``triage_relay_in_classify`` = ``off``.
    """

    ledger_step = Step.CLASSIFY

    template_fields = ("payload_base",)

    def __init__(
        self,
        *,
        payload_base: str | None = None,
        llm_conn_id: str = "triage_llm",
        batch_size: int = 1000,
        retry_soon_seconds: float = 30.0,
        separate_persist: bool = False,
        action_conn_id: str | None = LABEL_ACTION_CONN_ID,
        worker: int = 0,
        relay_events: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.worker, self.relay_events = worker, relay_events
        self.payload_base, self.llm_conn_id, self.action_conn_id = payload_base, llm_conn_id, action_conn_id
        self.batch_size, self.retry_soon_seconds, self.separate_persist = (
            batch_size,
            retry_soon_seconds,
            separate_persist,
        )

    def execute(self, context: Context) -> dict[str, Any] | None:
        from triage.classifiers import Taxonomy
        from triage.operators.metrics import AirflowStatsMetrics
        from triage.pipeline.classify_plan import classify_handler, plan_classify
        from triage.pipeline.one_transaction import IN_CHUNKS_VARIABLE, run_step_in_chunks
        from triage.pipeline.steps import (
            CircuitOpen,
            DependencyMisconfigured,
            RunSettings,
            StepError,
            claim_size,
            run_step,
        )

        config = self.run_config(context)
        taxonomy = Taxonomy.load()
        access = model_access(config, self.llm_conn_id, self.store, load_model=True)
        separate = self.separate_persist or label_action_connection(self.action_conn_id) is not None
        # Model calls in flight never exceed the pool slots this task holds (the llm_api pool
        # bounds them across every worker): the plan's concurrency (triage.pipeline.classify_plan).
        plan = plan_classify(
            config,
            taxonomy,
            access,
            pool_slots=self.pool_slots,
            separate_persist=separate,
            try_number=context["ti"].try_number,
            chunks_off=variable(IN_CHUNKS_VARIABLE) == "off",
        )
        if plan.capped:
            log.info(
                "concurrency %d capped at this task's %d slots of pool %s",
                config.concurrency,
                plan.concurrency,
                self.pool,
            )
        handler = classify_handler(plan, config, taxonomy, access, self.store, _payloads(self.payload_base))
        cache = handler.cache
        settings = RunSettings(
            owner=lease_owner(context),
            batch_size=claim_size(self.batch_size, plan.concurrency),
            lease_seconds=config.lease_seconds,
            retry_soon_seconds=self.retry_soon_seconds,
            earlier_tries_of=owner_prefix(context),
            # The model calls' window across claims: the next claim is taken one round of calls
            # before it is needed, so a second classify instance still finds its share of the day.
            claim_ahead=plan.claim_ahead,
        )
        relay = self.trailing_relay(context, actor=f"{settings.owner} relay")
        # Keyword and learned: each chunk claimed, classified and completed in one transaction,
        # on the first try (triage.pipeline.one_transaction); a retry takes the leased path.
        step = (
            functools.partial(run_step_in_chunks, committed=relay.committed if relay is not None else None)
            if plan.in_chunks
            else run_step
        )
        try:
            with relay if relay is not None else contextlib.nullcontext():  # ends with the step's last round
                report = step(
                    self.store,
                    handler,
                    batch_key=batch_key(context),
                    settings=settings,
                    metrics=AirflowStatsMetrics(),
                    drain=self.drain,
                )
            done = {
                "worker": self.worker,
                "claimed": report.claimed,
                "outcomes": dict(report.outcomes),
                "reused_answers": cache.reused if cache is not None else 0,
                "relayed": relay.sent if relay is not None else 0,
                "seconds": round(report.seconds, 3),
            }
            handed = self.hand_over(context, done)  # on this try's engine, before it is disposed
        except DependencyMisconfigured as exc:
            raise AirflowFailException(f"{exc}; fix the triage_llm connection, then clear this task") from None
        except CircuitOpen as exc:
            raise DependencyOutage(
                f"{exc}; parked the batch's unfinished jobs (waiting, outage:{exc.dependency}) "
                f"for {exc.delay_seconds:.0f}s"
                + ("" if exc.retry_after is not None else " (doubled for each earlier outage parking, up to 1 h)")
                + " without spending an attempt; Airflow's retry, the next run of this date or "
                "reconcile_jobs (once they are all due) takes them up again",
                dependency=exc.dependency,
                retry_after=exc.retry_after,
            ) from None
        except StepError as exc:  # work remains, drained, lease lost
            raise AirflowException(f"{exc}; Airflow's retry continues with the unfinished jobs") from None
        finally:
            handler.close()
            if relay is not None:
                relay.sink.close()
            self.dispose()
        written = ["jobs", "job_events", "classifications", "manual_review"]
        if not separate:  # accepted jobs complete here: their label and completion event too
            written += ["document_labels", "outbox"]
        sent_to = lineage.sink(relay.sink) if relay is not None and relay.sent else []
        self.record_lineage(lambda: self.ledger_lineage(context, ["jobs"], written, done, also_written=sent_to))
        return handed

    def hand_over(self, context: Context, done: dict[str, Any]) -> dict[str, Any] | None:
        """This try's counts as XCom ``summary``, and what it leaves ``persist`` as its return
        value: ``{"worker", "persist"}`` when jobs of the batch wait at the persist step, else
        None. ``persist`` is mapped over these return values (:mod:`triage.operators.tasks`),
        so when no instance left it work (no label action, the default) the scheduler skips it
        without starting a process. Counted after this try's moves committed: an instance that
        advanced jobs to persist always sees them (only ``persist`` completes them). Called by
        :meth:`execute` before it disposes the engine, so the count takes no connection of its own."""
        context["ti"].xcom_push(key=SUMMARY_KEY, value=done)
        waiting = self.store.open_in_step(batch_key(context), Step.PERSIST)
        return {"worker": self.worker, "persist": waiting} if waiting else None

    def trailing_relay(self, context: Context, *, actor: str) -> TrailingRelay | None:
        """The relay beside this try, sending through the sink the ``publish_events`` task
        downstream builds (:meth:`PublishEventsOperator.build_sink`, its settings rendered for
        this run), or None: ``relay_events`` false, Variable ``triage_relay_in_classify`` =
        ``off``, no single ``publish_events`` downstream, or a sink that cannot be built (logged;
        ``publish_events`` meets it and fails as before: the step is never failed by its relay)."""
        from triage.pipeline.trailing_relay import RELAY_IN_CLASSIFY_VARIABLE, TrailingRelay

        if not self.relay_events or variable(RELAY_IN_CLASSIFY_VARIABLE) == "off":
            return None
        publishers = [t for t in self.get_flat_relatives(upstream=False) if isinstance(t, PublishEventsOperator)]
        if len(publishers) != 1:
            return None
        try:
            sink = publishers[0].build_sink(context)
        except Exception as exc:  # noqa: BLE001 - the relay beside the step never fails the step
            log.warning("no relay beside classify: its sink could not be built (%s)", type(exc).__name__)
            return None
        return TrailingRelay(self.store, sink, actor=actor)


class PersistLabelsOperator(TriageOperator):
    """Complete jobs waiting at the ``persist`` step: label, job state and event in one
    transaction, after the external action when one is configured.

    :param action_conn_id: an HTTP connection whose host is the URL the label is POSTed to,
        with the job's idempotency key; extra ``timeout`` (seconds) and ``headers``. No action
        when the connection does not exist.
    :param handed_over: what the ``classify`` instance this one is mapped from left it
        (:meth:`ClassifyDocumentsOperator.hand_over`); every instance claims from the whole
        batch's persist step with ``FOR UPDATE SKIP LOCKED``, whatever it was handed.
    """

    ledger_step = Step.PERSIST

    def __init__(
        self, *, action_conn_id: str | None = LABEL_ACTION_CONN_ID, handed_over: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.action_conn_id = action_conn_id
        # A classify instance's hand-over ({"worker", "persist"}): the DAG maps persist over them.
        self.handed_over = handed_over

    def execute(self, context: Context) -> dict[str, Any]:
        from triage.operators.metrics import AirflowStatsMetrics
        from triage.pipeline.persist import PersistHandler
        from triage.pipeline.steps import CircuitOpen, RunSettings, StepError, run_step

        config = self.run_config(context)
        settings = RunSettings(
            owner=lease_owner(context), lease_seconds=config.lease_seconds, earlier_tries_of=owner_prefix(context)
        )
        action = build_label_action(self.action_conn_id)
        try:
            report = run_step(
                self.store,
                PersistHandler(self.store, action, audit_rate=config.audit_rate),
                batch_key=batch_key(context),
                settings=settings,
                metrics=AirflowStatsMetrics(),
                drain=self.drain,
            )
        except CircuitOpen as exc:
            raise DependencyOutage(
                f"{exc}; parked the batch's unfinished jobs (waiting, outage:{exc.dependency}) for "
                f"{exc.delay_seconds:.0f}s (doubled for each earlier outage parking, up to 1 h) without "
                "spending an attempt; Airflow's retry, the next run of this date or reconcile_jobs "
                "(once they are all due) takes them up again",
                dependency=exc.dependency,
                retry_after=None,
            ) from None
        except StepError as exc:  # work remains, drained, lease lost
            raise AirflowException(str(exc)) from None
        finally:
            if action is not None:
                action.close()
            self.dispose()
        done = {"claimed": report.claimed, "outcomes": dict(report.outcomes)}
        self.record_lineage(
            lambda: self.ledger_lineage(
                context,
                ["jobs", "classifications"],
                ["document_labels", "jobs", "job_events", "outbox"],
                done,
                also_written=[lineage.location(action.url)] if action is not None else [],
            )
        )
        return done


class PublishEventsOperator(TriageOperator):
    """Relay unsent outbox events to the event sink and mark them sent; updates the
    ``triage_document_labels`` asset.

    :param event_log: the JSON-lines event log (default: Variable ``triage_event_sink``, then
        ``$TRIAGE_EVENT_LOG``, then ``$TRIAGE_HOME/events/outbox.jsonl``).
    :param webhook_conn_id: when set, POST events to this HTTP connection's URL instead.
    """

    ledger_step = None  # relays the outbox: no job is held or left unfinished by it

    template_fields = ("event_log",)

    def __init__(self, *, event_log: str | None = None, webhook_conn_id: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [DOCUMENT_LABELS])
        super().__init__(**kwargs)
        self.event_log, self.webhook_conn_id = event_log, webhook_conn_id

    def build_sink(self, context: Context | None = None) -> EventSink:
        """Where this task sends events. With ``context``: for another task of the run (``classify``'s
        relay, :meth:`ClassifyDocumentsOperator.trailing_relay`), ``event_log`` rendered for it
        first (this task's own fields are rendered before :meth:`execute`)."""
        event_log = self.event_log if context is None else self.render_template(self.event_log, context)
        return event_sink(self.webhook_conn_id, event_log)

    def execute(self, context: Context) -> dict[str, Any]:
        from triage.pipeline.publish import publish_all

        sink: EventSink | None = None
        try:
            # Built inside the try: a sink that cannot be built (a bad webhook connection or
            # event_log) still leaves the engine disposed.
            sink = self.build_sink()
            sent = publish_all(self.store, sink)
        finally:
            if sink is not None:
                sink.close()
            self.dispose()
        done = {"published": sent}
        self.record_lineage(
            lambda: self.ledger_lineage(
                context,
                ["outbox"],
                ["outbox"],
                done,
                also_written=[*lineage.sink(sink), lineage.asset(DOCUMENT_LABELS.uri)],
            )
        )
        return done
