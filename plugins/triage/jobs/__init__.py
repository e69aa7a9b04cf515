"""The job ledger: its vocabulary, its schema, every named SQL statement, and the store that runs
them. No Airflow imports. Callers ask :class:`~triage.jobs.store.JobStore` (``from
triage.jobs.store import JobStore``) and nothing else opens a transaction on the ledger.

The rooms, each importing only the rooms listed before it (``python -m triage_tools.layout``
checks it):

``vocabulary/``  what the ledger talks in; no SQL
    ``states`` (:class:`JobStatus`, the transitions as data, the groupings), ``errors`` (the
    exception tree database errors are translated into), ``backoff`` (the retry policy),
    ``models`` (the frozen objects that go into and come out of the store: a claim, an outcome,
    a review decision).
``schema/``  the tables as SQLAlchemy Core metadata, which the migrations create exactly
    ``schema`` itself (jobs, job_events, classifications, document_labels, manual_review, outbox
    and the rest), ``access`` (who may do what: transition roles, taxonomy labels, retention
    policy), ``learning`` (labelled examples, the model registry).
``sql/``  every statement, named, built once and never executed here; split by what it does
    ``expressions`` (the pieces and named predicates statements share: batch parameters, typed
    states, ``parked``, the outbox insert), ``state_events`` (the events a move emits for the
    state it enters), ``session`` (a transaction's settings).

    ``sql/moves/``: every way a job's state changes, one fenced statement each:
    ``registration`` (the one ``INSERT … ON CONFLICT (idempotency_key)``, for retrieval and
    intake), ``worker`` (claim, lease, an attempt's outcome), ``recovery`` (expired leases, a
    failed task's batch), ``outages`` (park, resume, a provider batch's jobs made due),
    ``probes`` (the half-open probe), ``repairs`` (reconciliation's), ``last_tries`` (a dead
    final try's jobs), ``review`` (a reviewer's decisions), ``replays`` (a replay by filter; a
    single requeue is its move of one).

    ``sql/writes/``: what work leaves besides a job's state: ``outputs`` (classifications,
    document labels), ``outbox`` (the relay's claim and marks), ``batches`` (provider batch
    rows), ``budgets`` (the shared model call budgets), ``learning`` (examples, model versions),
    ``taxonomy`` (the taxonomy's labels), ``retention`` (the database's removal functions).

    ``sql/reads/``: read-only questions by name: ``queries`` (the store's own), ``checks`` and
    ``last_tries`` (reconciliation's), ``batch_summary`` (a run's summary, the reports),
    ``alerts``, ``review_queue`` (the review pages), ``label_actions``, ``answers`` (the content
    cache), ``intake``.
``store/``  the only code that opens a ledger transaction
    ``JobStore`` (``store/__init__``: a worker's moves, recovery, repairs, the relay, reads), over
    ``ledger`` (the transaction: actor set, errors translated) and its named parts, each a
    :class:`~triage.jobs.store.ledger.Part` sharing the store's transactions: ``store.review``,
    ``store.intake``, ``store.probes``, ``store.last_tries``, ``store.batches``,
    ``store.budgets``, ``store.retention``, ``store.learning``. ``recording``,
    ``review_results``, ``replays`` and ``relay`` are the transaction bodies they run.

Who uses the rows lives outside: the budget's worker side is :mod:`triage.classifiers.budgets`,
batch mode's bookkeeping :mod:`triage.pipeline.batch_mode`, the usage bounds the ledger's
columns hold :mod:`triage.contracts.usage`.
"""

# The schema's metadata is whole (its access and learning tables included) wherever any part of
# the ledger is imported.
from triage.jobs import schema as _schema  # noqa: F401
