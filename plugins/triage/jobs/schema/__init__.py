"""The job tables as SQLAlchemy Core metadata, in schema ``triage``.

Migrations create exactly this (a test compares them). Invariants live here as constraints so
that no writer, ours or ad hoc, can break them: one idempotency key, a lease only while
``running``, a ``next_attempt_at`` only while ``retryable_failed`` or parked (``waiting``), one open review per job.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.vocabulary.states import EventType, JobStatus

SCHEMA = "triage"

metadata = sa.MetaData(
    schema=SCHEMA,
    naming_convention={
        "ix": "%(table_name)s_%(column_0_N_name)s_idx",
        "uq": "%(table_name)s_%(column_0_N_name)s_key",
        "ck": "%(table_name)s_%(constraint_name)s_check",
        "fk": "%(table_name)s_%(column_0_name)s_fkey",
        "pk": "%(table_name)s_pkey",
    },
)

job_status = pg.ENUM(
    *[s.value for s in JobStatus],
    name="job_status",
    schema=SCHEMA,
    metadata=metadata,
    create_type=False,  # the migration creates it, with a comment per value
)

NOW = sa.text("now()")
DECIDED_LABEL = ("labelled", "corrected")
"""Review resolutions that are a person's label for the job's text: a label decision, and the
correction of an audit sample (the content cache never reuses the model's answer for that text)."""
DECIDED_LABEL_SQL = "('labelled', 'corrected')"
ARRIVED_UNSUPPORTED = "(context ->> 'malformed_reason') = 'unsupported_schema_version'"  # routed on arrival (0020)
CACHED_VERSIONS = "llm:"
"""How the version of a classifier whose answers the content cache reuses begins: the llm's
(``triage.classifiers.llm.llm_version``; the cache runs for model-calling classifiers only,
``triage.pipeline.classify_plan.MODEL_CALLING``). ``classifications_answers_idx`` holds only
their answers (0036), and the cache's lookup says so in the words of the index's predicate."""
REVIEW_UNCERTAINTY = (
    "(\nCASE\n    WHEN jsonb_typeof(context -> 'uncertainty'::text) = 'number'::text"
    " THEN GREATEST(LEAST((context -> 'uncertainty'::text)::numeric, 2::numeric), '-1'::integer::numeric)"
    "::double precision\n    ELSE 2::double precision\nEND)"
)
"""An open review's uncertainty (0028): ``context.uncertainty`` (written with the review from the
model's answer, :func:`triage.jobs.sql.reads.review_uncertainty.answer_uncertainty`), else 2 (no answer:
after every margin and confidence). Read as numeric and bounded before it becomes a float, so no
value a context can hold fails the insert that indexes it. Spelled as PostgreSQL prints it back
(``pg_indexes``), so that the migrated index compares equal to this metadata."""

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")),
    sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("external_id", sa.Text, nullable=False),
    sa.Column("content_sha256", sa.Text, nullable=False),
    sa.Column("payload_ref", sa.Text, nullable=False),
    sa.Column("classifier_version", sa.Text, nullable=False),
    sa.Column("correlation_id", sa.Text, nullable=False),
    sa.Column("batch_key", sa.Text, nullable=False),
    sa.Column("step", sa.Text, nullable=False),
    sa.Column("status", job_status, nullable=False),
    sa.Column("status_reason", sa.Text),  # why the job entered its status; copied into job_events
    # Attempts only grow over a job's life (a classification is keyed by its attempt). Each
    # budget runs from attempt_base (0, or the attempt of the latest advance or requeue) up to
    # max_attempts: a claim needs attempt < max_attempts; the budget's size is their difference.
    sa.Column("attempt", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("attempt_base", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column("replays", sa.Integer, nullable=False, server_default=sa.text("0")),  # requeues from review
    sa.Column("lease_rescues", sa.Integer, nullable=False, server_default=sa.text("0")),  # expired leases returned
    # Reviewers' corrections of the completed job's label (0026): each one a move completed ->
    # completed, the review role's, which the jobs trigger checks and logs as any other move.
    sa.Column(
        "corrections",
        sa.Integer,
        nullable=False,
        server_default=sa.text("0"),
        comment="Reviewers' corrections of the completed job's label: each a move completed -> completed (0026)",
    ),
    # Poison isolation (migration 0009): NULL for a clean job; for a job whose claim died under
    # it (its lease taken back), the largest claim it may be part of next. Claims never mix
    # suspects with clean jobs; a suspect that dies again in a claim of one is poison.
    sa.Column("suspect_cap", sa.Integer),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True)),
    sa.Column("lease_owner", sa.Text),
    sa.Column("lease_token", pg.UUID(as_uuid=True)),
    sa.Column("lease_expires_at", sa.DateTime(timezone=True)),
    sa.Column("last_error_class", sa.Text),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.CheckConstraint(
        "attempt_base >= 0 AND attempt >= attempt_base AND attempt <= max_attempts", name="attempt_bounds"
    ),
    sa.CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
    sa.CheckConstraint("corrections >= 0", name="corrections"),
    sa.CheckConstraint(
        "(status = 'running' AND lease_owner IS NOT NULL AND lease_token IS NOT NULL"
        " AND lease_expires_at IS NOT NULL)"
        " OR (status <> 'running' AND lease_owner IS NULL AND lease_token IS NULL"
        " AND lease_expires_at IS NULL)",
        name="lease_only_while_running",
    ),
    # Due again at next_attempt_at: a retryable job always, a job parked on an outage (waiting,
    # reason outage:<dependency>) when it was parked with a time (revision 0010).
    sa.CheckConstraint(
        "(status = 'retryable_failed' AND next_attempt_at IS NOT NULL) OR status = 'waiting'"
        " OR (status NOT IN ('retryable_failed', 'waiting') AND next_attempt_at IS NULL)",
        name="next_attempt_only_while_retryable_or_parked",
    ),
    # Serves claim_batch: the claimable jobs of one batch and step, due first.
    sa.Index(
        "jobs_claimable_idx",
        "batch_key",
        "step",
        "next_attempt_at",
        postgresql_where=sa.text("status IN ('queued', 'retryable_failed')"),
    ),
    sa.CheckConstraint("suspect_cap >= 1", name="suspect_cap_positive"),
    # Serves claim_batch's probe for suspects (poison isolation): empty on the common path.
    sa.Index(
        "jobs_suspects_idx",
        "batch_key",
        "step",
        "suspect_cap",
        postgresql_where=sa.text("suspect_cap IS NOT NULL AND status IN ('queued', 'retryable_failed')"),
    ),
    # Serves release_expired_leases: only running jobs carry a lease.
    sa.Index("jobs_lease_expiry_idx", "lease_expires_at", postgresql_where=sa.text("status = 'running'")),
    # Serves batch summaries, the failure callback and reconciliation's per-state scans.
    sa.Index("jobs_batch_key_status_idx", "batch_key", "status"),
    # Serves reconciliation and retention: the jobs that are not terminal (few, whatever the
    # history). The partial predicate lists the states so that a check of one state matches it.
    sa.Index(
        "jobs_open_idx",
        "status",
        "created_at",
        postgresql_where=sa.text(
            "status IN ('received', 'queued', 'running', 'waiting', 'retryable_failed', 'manual_review')"
        ),
    ),
    # Serves the consistency checks of recent completions and the report's window of finished jobs.
    sa.Index(
        "jobs_terminal_recent_idx",
        "status",
        "updated_at",
        postgresql_where=sa.text("status IN ('completed', 'terminal_failed')"),
    ),
    # Autovacuum at 2 % (0015), no fillfactor: no transition can be HOT (status is indexed); not metadata.
)

job_events = sa.Table(
    "job_events",
    metadata,
    # From one sequence. No primary key: partitioned by day of ``at`` (its key would need it), never read by id.
    sa.Column("id", sa.BigInteger, nullable=False, server_default=sa.text("nextval('triage.job_events_id_seq')")),
    # No foreign key: rows come only from the jobs trigger and jobs are never deleted (a check doubles a move).
    sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("from_status", job_status),  # NULL: the job was created
    sa.Column("to_status", job_status, nullable=False),
    sa.Column("step", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("actor", sa.Text, nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    # The database's own word on who moved it (the actor is a setting anyone may set): migration 0021.
    sa.Column("login", sa.Text, comment="session_user of the move (NULL before 0021)"),
    sa.Index("job_events_job_id_id_idx", "job_id", "id"),
    sa.Index("job_events_unsupported_idx", "job_id", postgresql_where=sa.text("reason = 'unsupported_schema_version'")),
    postgresql_partition_by="RANGE (at)",  # one partition per UTC day; retention drops whole days
)

job_transitions = sa.Table(
    "job_transitions",
    metadata,
    sa.Column("from_status", job_status),  # NULL: a state a job may be created in
    sa.Column("to_status", job_status, nullable=False),
    # A move allowed only while the job is at this step (0033: queued -> completed at classify).
    sa.Column(
        "at_step",
        sa.Text,
        comment="The step a job must be at (its step before the move) for the move to be allowed; NULL: any step (0033)",
    ),
    sa.UniqueConstraint("from_status", "to_status", postgresql_nulls_not_distinct=True),
    sa.CheckConstraint("at_step IS NULL OR from_status IS NOT NULL", name="at_step"),
)

classifications = sa.Table(
    "classifications",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),  # not partitioned
    # No foreign key on the hot path (a row-level check cost 4 µs a row, measured): rows are
    # written only by the store, in the transaction that holds the job's lease, and jobs are
    # never deleted (a trigger refuses it). Reconciliation checks the pairing.
    sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("label", sa.Text),
    sa.Column("confidence", sa.Float),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("rejected_reason", sa.Text),
    sa.Column("classifier_version", sa.Text, nullable=False),
    sa.Column("latency_ms", sa.Float),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("completion_tokens", sa.Integer),
    sa.Column("cost_usd", sa.Numeric(12, 6)),
    # The usage figures the model reported out of range (comma-separated names), stored as NULL.
    sa.Column("usage_discarded", sa.Text),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    # How the answer's shape was asked for (migration 0013): json_schema | json_object; NULL: no model.
    sa.Column("output_mode", sa.Text),
    # The content cache (0013): the SHA-256 of the text the classifier read (subject and body: not
    # the payload's hash, which covers its external id and time too), and the classification
    # (job, attempt) a reused answer was copied from (NULL: the model's own answer, maybe an entry).
    sa.Column("input_sha256", sa.Text),
    sa.Column("reused_job_id", pg.UUID(as_uuid=True)),
    sa.Column("reused_attempt", sa.Integer),
    # The model's top candidate labels, best first (0028): at most three {"label", "score"}; NULL
    # where the classifier scores one label only (an LLM) or the row is older.
    sa.Column("candidates", pg.JSONB),
    sa.UniqueConstraint("job_id", "attempt"),
    sa.CheckConstraint("outcome IN ('accepted', 'inconclusive', 'rejected')", name="outcome_known"),
    sa.CheckConstraint("confidence IS NULL OR (confidence >= 0 AND confidence <= 1)", name="confidence_range"),
    sa.CheckConstraint(
        "output_mode IS NULL OR output_mode IN ('json_schema', 'json_object')", name="output_mode_known"
    ),
    sa.CheckConstraint("(reused_job_id IS NULL) = (reused_attempt IS NULL)", name="reused_whole"),
    sa.CheckConstraint(
        "candidates IS NULL OR (jsonb_typeof(candidates) = 'array' AND jsonb_array_length(candidates) <= 3)",
        name="candidates_shape",
    ),
    sa.Index("classifications_rejected_idx", "created_at", postgresql_where=sa.text("outcome = 'rejected'")),  # 0020
    # Serves the quality figures' window of days (0026): rows arrive in time order, so a BRIN
    # index finds a day's pages at almost no cost to the hot path's inserts.
    sa.Index("classifications_created_at_idx", "created_at", postgresql_using="brin"),
    # Serves the content cache's lookup (triage.jobs.sql.reads.answers): its entries only, the accepted and
    # doubtful answers of the model itself, by input and classifier version, oldest first (0016); of
    # the llm classifier only (0036: the cache is its alone, and each keyword or learned answer was
    # an entry here nothing read, a random place in the index: ~3 µs of server CPU a document).
    sa.Index(
        "classifications_answers_idx",
        "input_sha256",
        "classifier_version",
        "id",
        postgresql_where=sa.text(
            "outcome IN ('accepted', 'inconclusive') AND reused_job_id IS NULL AND input_sha256 IS NOT NULL"
            f" AND starts_with(classifier_version, '{CACHED_VERSIONS}')"
        ),
    ),
)

document_labels = sa.Table(
    "document_labels",
    metadata,
    sa.Column("source", sa.Text, primary_key=True),
    sa.Column("external_id", sa.Text, primary_key=True),
    sa.Column("label", sa.Text, nullable=False),
    sa.Column("confidence", sa.Float),
    sa.Column("classifier_version", sa.Text, nullable=False),
    sa.Column("content_sha256", sa.Text, nullable=False),
    sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),  # no foreign key: see classifications
    # The ordering key of writes: the creation time of the job that wrote the label. A write
    # from an older job (stale retry, older classifier version) never replaces a newer one.
    sa.Column("job_created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Index("document_labels_job_id_idx", "job_id"),
    sa.Index("document_labels_updated_at_idx", "updated_at"),  # the consistency checks' window
)

manual_review = sa.Table(
    "manual_review",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("job_id", pg.UUID(as_uuid=True), sa.ForeignKey("triage.jobs.id"), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("error_class", sa.Text),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("last_error", sa.Text),
    sa.Column("context", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("resolved_at", sa.DateTime(timezone=True)),
    sa.Column("resolution", sa.Text),
    sa.Column("resolved_by", sa.Text),
    sa.Column("note", sa.Text),
    sa.CheckConstraint("(resolved_at IS NULL) = (resolution IS NULL)", name="resolution_with_time"),
    sa.CheckConstraint(
        "resolution IS NULL OR resolution IN ('labelled', 'requeued', 'rejected', 'superseded', 'confirmed', 'corrected')",
        name="resolution_known",
    ),
    # At most one open review per job.
    sa.Index(
        "manual_review_one_open_per_job",
        "job_id",
        unique=True,
        postgresql_where=sa.text("resolved_at IS NULL"),
    ),
    # Serve the review queue page (migration 0011): open reviews oldest first, a page at a time
    # after the last (created_at, id) shown, as a whole or of one reason.
    sa.Index("manual_review_open_queue_idx", "created_at", "id", postgresql_where=sa.text("resolved_at IS NULL")),
    sa.Index(
        "manual_review_open_reason_idx", "reason", "created_at", "id", postgresql_where=sa.text("resolved_at IS NULL")
    ),
    # Serve the queue least sure first (0028): open reviews by uncertainty, then oldest, as a whole
    # or of one reason (triage.jobs.sql.reads.review_uncertainty).
    sa.Index(
        "manual_review_open_uncertainty_idx",
        sa.text(REVIEW_UNCERTAINTY),
        "created_at",
        "id",
        postgresql_where=sa.text("resolved_at IS NULL"),
    ),
    sa.Index(
        "manual_review_open_reason_uncertainty_idx",
        "reason",
        sa.text(REVIEW_UNCERTAINTY),
        "created_at",
        "id",
        postgresql_where=sa.text("resolved_at IS NULL"),
    ),
    # Serves the content cache's refusal to answer for content a reviewer labelled or corrected (0032).
    sa.Index(
        "manual_review_decided_label_idx",
        "job_id",
        postgresql_where=sa.text(f"resolution IN {DECIDED_LABEL_SQL}"),
    ),
    # Serves the report's schema mismatches found on arrival (0020): empty on a healthy ledger.
    sa.Index("manual_review_unsupported_idx", "job_id", postgresql_where=sa.text(ARRIVED_UNSUPPORTED)),
    # Serves the quality figures (0026): the decisions of a window of days, by when they were taken.
    sa.Index("manual_review_resolved_at_idx", "resolved_at", postgresql_where=sa.text("resolved_at IS NOT NULL")),
)

outbox = sa.Table(
    "outbox",
    metadata,
    # A UUIDv7 made without a system call when the writer brings none (migration 0035).
    sa.Column(
        "event_id", pg.UUID(as_uuid=True), primary_key=True, server_default=sa.text("triage.time_ordered_uuid()")
    ),
    # Part of the key: the table is partitioned by day of it (migration 0015).
    sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("event_type", sa.Text, nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    # Extra data of the event type. The envelope (ids, attempt, time, and the job's correlation
    # id and payload reference, migration 0029) lives in columns of the row, written with the
    # fact: the relay joins nothing. A JSON document per event built inside the completing
    # transaction cost more than the job update itself; the relay builds it from these columns.
    sa.Column("payload", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("created_at", sa.DateTime(timezone=True), primary_key=True, server_default=NOW),
    # Set for the events published before migration 0029 only; since, an event is published once
    # ``outbox_watermark`` has passed its (txid, event_id) (:mod:`triage.jobs.sql.writes.outbox`).
    sa.Column("published_at", sa.DateTime(timezone=True)),
    # Written with the fact (0029); NULL only in rows published before 0029 (their envelope was joined).
    sa.Column("correlation_id", sa.Text),
    sa.Column("payload_ref", sa.Text),
    # The id of the transaction that wrote the event (``pg_current_xact_id()``), NULL only in rows
    # published before 0029: the relay's order and watermark are (txid, event_id), read only below
    # the oldest transaction still running, so no event can commit behind the watermark (0029).
    sa.Column("txid", sa.BigInteger, server_default=sa.text("(pg_current_xact_id())::text::bigint")),
    # Serves the outbox relay (the events after the watermark, in order) and the unsent counts.
    sa.Index("outbox_relay_order_idx", "txid", "event_id"),
    sa.Index("outbox_job_id_idx", "job_id"),
    # The envelope checked where it is written (0034), as ``WorkEvent`` checks it: the relay writes
    # the rows' JSON through to the sinks without building a model (:mod:`triage.jobs.sql.writes.outbox`).
    sa.CheckConstraint(
        "event_type IN ({})".format(", ".join(f"'{t.value}'" for t in EventType)), name="event_type_known"
    ),
    sa.CheckConstraint("schema_version IN (1)", name="schema_version_supported"),
    sa.CheckConstraint("attempt >= 0", name="attempt"),
    # Rows published before 0029 carry no envelope of their own (it was joined); they are never relayed again.
    sa.CheckConstraint(
        "published_at IS NOT NULL OR (correlation_id IS NOT NULL AND correlation_id <> ''"
        " AND payload_ref IS NOT NULL AND payload_ref <> '')",
        name="envelope",
    ),
    sa.CheckConstraint("jsonb_typeof(payload) = 'object'", name="payload_object"),
    sa.CheckConstraint(
        "created_at >= '0001-01-01 00:00:00+00' AND created_at < '10000-01-01 00:00:00+00'", name="occurred_at"
    ),
    postgresql_partition_by="RANGE (created_at)",  # one partition per UTC day; retention drops whole days
)

# How far the relay has published (migration 0029): one row, the (txid, event_id) of the last
# event of the longest run of sent batches from the start. Every event at or before it is
# published; an event after it is not yet (or is in a sent batch behind one still being sent).
outbox_watermark = sa.Table(
    "outbox_watermark",
    metadata,
    sa.Column("id", sa.Boolean, primary_key=True, server_default=sa.true()),
    sa.Column("txid", sa.BigInteger, nullable=False),
    sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("advanced_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.CheckConstraint("id", name="one_row"),
    comment="How far the outbox relay has published: the (txid, event_id) of its last event in order",
)

# A relay's claim on a range of events while it sends them outside any transaction (0007; ranges
# since 0029): the events after (after_txid, after_event_id) up to and with (upto_txid,
# upto_event_id). The claims continue one another from the watermark; a sent claim is folded into
# the watermark once every claim before it is sent. One row per batch, no write per event.
outbox_claims = sa.Table(
    "outbox_claims",
    metadata,
    sa.Column("token", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=False),
    sa.Column("after_txid", sa.BigInteger, nullable=False),
    sa.Column("after_event_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("upto_txid", sa.BigInteger, nullable=False),
    sa.Column("upto_event_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("events", sa.Integer, nullable=False),
    sa.Column("sent", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.UniqueConstraint("after_txid", "after_event_id", name="outbox_claims_after_key"),
    comment="A relay's claim on a range of outbox events while it sends them",
)

# One row per replay by filter (migration 0008), keyed by a digest of its filter and note: the same submission
# twice is one request, applied once. Each job it moved has a job_events row of reason ``replayed:<replay_key>``.
replay_requests = sa.Table(
    "replay_requests",
    metadata,
    sa.Column("replay_key", sa.Text, primary_key=True),
    sa.Column("filter", pg.JSONB, nullable=False),
    sa.Column("requested_by", sa.Text, nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("applied_at", sa.DateTime(timezone=True)),  # NULL: not finished (a retry resumes it)
    sa.Column("replayed", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.CheckConstraint("replayed >= 0", name="replayed"),
    comment="One row per replay by filter: the filter, who asked and why, how many jobs it moved",
)

reconciliation_runs = sa.Table(
    "reconciliation_runs",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("finished_at", sa.DateTime(timezone=True)),  # NULL: the run is in progress or died
    sa.Column("dry_run", sa.Boolean, nullable=False),
    sa.Column("params", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("findings", pg.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    sa.Column("repairs", pg.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    sa.Column("summary", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("report_path", sa.Text),  # NULL: the HTML page was not rendered (a degraded run)
    sa.Column("dag_run_id", sa.Text),  # the reconcile_jobs run that made it; NULL outside Airflow (0011)
    # Serves "the latest run" (make run's summary, the next run's comparison).
    sa.Index("reconciliation_runs_started_at_idx", "started_at"),
    # Serves the report tab of a reconcile_jobs run page in the Airflow UI.
    sa.Index("reconciliation_runs_dag_run_id_idx", "dag_run_id"),
    comment="One row per reconcile_jobs run: its params, findings, repairs and report summary",
)

# The requests and tokens per minute of a model connection, shared by every worker (migration
# 0017, triage.jobs.store.budgets). A generic cell rate: ``request_tat``/``token_tat`` is when the
# budget would be empty again at its rate (a call may start once it is at most ``burst_seconds``
# ahead of now), ``blocked_until`` is how long the provider asked to be left alone (a 429's
# Retry-After, an x-ratelimit reset). One row per connection, updated by one statement per call.
model_budgets = sa.Table(
    "model_budgets",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),  # the Airflow connection id
    sa.Column("requests_per_minute", sa.Float),  # NULL: no request budget
    sa.Column("tokens_per_minute", sa.Float),  # NULL: no token budget
    sa.Column("burst_seconds", sa.Float, nullable=False, server_default=sa.text("1")),
    sa.Column("request_tat", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("token_tat", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("blocked_until", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("'-infinity'")),
    sa.Column("rate_limited", sa.BigInteger, nullable=False, server_default=sa.text("0")),  # 429s reported
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.CheckConstraint("requests_per_minute IS NULL OR requests_per_minute > 0", name="requests_per_minute"),
    sa.CheckConstraint("tokens_per_minute IS NULL OR tokens_per_minute > 0", name="tokens_per_minute"),
    sa.CheckConstraint("burst_seconds >= 0", name="burst_seconds"),
    comment="Requests and tokens per minute of a model connection, shared by every worker",
    prefixes=["UNLOGGED"],  # a pacing state: not worth a WAL flush per call (migration 0017)
)

# A set of jobs submitted to the provider's batch interface (migration 0017, triage.jobs.store.batches):
# written before the provider is asked (status ``submitting``, keyed by the submission's name),
# so that a resubmission after a crash adopts the provider's batch instead of paying twice.
model_batches = sa.Table(
    "model_batches",
    metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("batch_key", sa.Text, nullable=False),
    sa.Column("classifier_version", sa.Text, nullable=False),
    sa.Column("provider_batch_id", sa.Text),  # NULL until the provider accepted it
    sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'submitting'")),
    sa.Column("job_ids", pg.ARRAY(pg.UUID(as_uuid=True)), nullable=False),
    sa.Column("attempts", pg.ARRAY(sa.Integer), nullable=False),  # each job's attempt, as submitted
    sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
    sa.CheckConstraint("status IN ('submitting', 'running', 'collected', 'lost')", name="status"),
    # Serves the open batches of a run (the collector's and the operator's question).
    sa.Index("model_batches_open_idx", "batch_key", postgresql_where=sa.text("status IN ('submitting', 'running')")),
    comment="A set of jobs submitted to the provider's batch interface, and what became of it",
)

# A job's answer from a provider batch: the classify step takes it instead of calling the model.
model_batch_answers = sa.Table(
    "model_batch_answers",
    metadata,
    sa.Column("job_id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True),
    sa.Column("batch", sa.Text, sa.ForeignKey(model_batches.c.key), nullable=False),
    sa.Column("label", sa.Text),
    sa.Column("confidence", sa.Float),
    sa.Column("rejected_reason", sa.Text),
    sa.Column("output_mode", sa.Text),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("completion_tokens", sa.Integer),
    sa.Column("error_class", sa.Text),  # the batch's request failed: asked again interactively
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    comment="A job's answer from a provider batch, taken by the classify step instead of a call",
)

# The tables of who may do what (access: 0021, 0022) and the learning loop's (learning: 0025) join this
# metadata in modules of their own, imported with it so that the metadata is whole wherever it is.
from triage.jobs.schema import access as _access  # noqa: E402, F401
from triage.jobs.schema import learning as _learning  # noqa: E402, F401
