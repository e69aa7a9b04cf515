"""What the Triage pages and API do, without HTTP: read the queue, a job, its document and the
reports; decide through the same functions as ``review_jobs`` (:mod:`triage.review.decisions`).

:class:`TriageService` holds the app's seams: the ledger twice (made on first use through the
adapter room's hook, :mod:`triage.adapters.ledger_db`, as the operators make theirs): the pipeline's login (``triage_db``)
for intake, and the review role's (``triage_db_review``) for the pages, the API's reads and every
decision, since PostgreSQL lets only that role move a job out of review (docs/security.md); the
payload base, the taxonomy and the label action. Tests give their own.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from triage.jobs.sql.reads.review_queue import Cursor, QueueFilter, QueuePage, job_detail, queue_page
from triage.jobs.sql.reads.review_uncertainty import UncertainCursor, UncertainPage, uncertain_page
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import (
    JobNotFound,
    LabelNotInTaxonomy,
    LedgerError,
    NotInReview,
    ReplayLimitReached,
    RoleRefused,
)
from triage.payload_refs import PayloadError
from triage.ports.label_actions import LabelAction
from triage.reconciliation import history
from triage.review import decisions
from triage.review.config import ReviewRunConfig

log = logging.getLogger(__name__)

BULK_LIMIT = 100
"""The most jobs one bulk decision may name (a bulk decision is previewed, then applied to
exactly the jobs the preview showed)."""
DOCUMENT_CHARS = 200_000
"""The most characters of a document a page shows (the rest is cut, and said so)."""


@dataclass(frozen=True, slots=True)
class Refused(Exception):
    """A decision that changed nothing: ``status`` is the HTTP status that says why."""

    status: int
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class Document:
    text: str | None  # None: unavailable (see ``problem``)
    fields: dict[str, str]  # subject and body of a JSON document payload, for reading
    truncated: bool
    problem: str | None  # the payload store's error class, never its content


@dataclass(frozen=True, slots=True)
class Decided:
    job_id: uuid.UUID
    outcome: str  # applied | already_applied
    status: str
    resolved_by: str | None
    resolved_at: Any
    label_action: str | None


def _refusal(exc: LedgerError) -> Refused:
    if isinstance(exc, JobNotFound):
        return Refused(404, str(exc))
    if isinstance(exc, LabelNotInTaxonomy):
        return Refused(422, str(exc))
    if isinstance(exc, NotInReview | ReplayLimitReached):
        return Refused(409, str(exc))
    if isinstance(exc, RoleRefused):  # triage_db_review logs in as a role that may not decide
        log.error("the database refused the review connection's login: %s", exc)
        return Refused(503, "the review connection (triage_db_review) logs in as a role that may not decide")
    return Refused(409, f"{type(exc).__name__}: {exc}")


POOL_SIZE = 10
"""Connections an API server process keeps to the job database. An intake request holds one
for its one statement, so as many requests at once as this reuse connections; past it, each
opens and closes a connection (a PostgreSQL backend started per request: 5 kept cost a fifth
of intake's database CPU with 8 clients, measured)."""


REVIEW_POOL_SIZE = 3
"""Connections kept for the pages and decisions (a person's pace, not intake's)."""


class TriageService:
    """:param store: the pipeline's ledger, for intake (None: from ``triage_db`` on first use).
    :param review_store: the review role's ledger, for reading and deciding (None: ``store``
        when one is given, else from ``triage_db_review`` on first use).
    :param payload_base: where payloads are (None: Variable ``triage_payload_base``, then
        ``TRIAGE_PAYLOAD_BASE``, as the operators).
    :param taxonomy_names: the labels a reviewer may give (None: the taxonomy file, read per call).
    :param label_action: where a reviewer's label is sent (None: the ``triage_label_action``
        connection, when it exists).
    """

    def __init__(
        self,
        store: JobStore | None = None,
        *,
        review_store: JobStore | None = None,
        payload_base: str | None = None,
        taxonomy_names: Sequence[str] | None = None,
        label_action: Callable[[], LabelAction | None] | None = None,
    ) -> None:
        self._store = store
        self._review_store = review_store if review_store is not None else store
        self._lock = threading.Lock()
        self._payload_base = payload_base
        self._taxonomy = list(taxonomy_names) if taxonomy_names is not None else None
        self._label_action = label_action

    @property
    def store(self) -> JobStore:
        with self._lock:
            if self._store is None:
                from triage.adapters.ledger_db import DEFAULT_CONN_ID, ledger_store

                self._store = ledger_store(DEFAULT_CONN_ID, pool_size=POOL_SIZE)
            return self._store

    @property
    def review_store(self) -> JobStore:
        with self._lock:
            if self._review_store is None:
                from triage.adapters.ledger_db import REVIEW_CONN_ID, ledger_store

                self._review_store = ledger_store(REVIEW_CONN_ID, pool_size=REVIEW_POOL_SIZE)
            return self._review_store

    def taxonomy(self) -> list[str]:
        if self._taxonomy is not None:
            return self._taxonomy
        from triage.classifiers.taxonomy import Taxonomy

        return sorted(Taxonomy.load().names)

    def payload_base(self) -> str:
        from triage import settings

        if self._payload_base is not None:
            return self._payload_base
        from triage.adapters.connections import variable

        return settings.payload_base(variable("triage_payload_base"))

    def import_labels(self, examples: Sequence[Any], *, source: str, labelled_by: str) -> Any:
        """Store labelled examples (:func:`triage.learning.examples.import_examples`); the report."""
        from triage.learning.examples import import_examples
        from triage.payloads import PayloadStore

        payloads = PayloadStore(self.payload_base())
        return import_examples(self.store.engine, payloads, examples, source=source, labelled_by=labelled_by)

    # -- reading -----------------------------------------------------------------------------

    def queue(self, where: QueueFilter, *, limit: int, after: Cursor | None = None) -> QueuePage:
        with self.review_store.reading() as conn:
            return queue_page(conn, where, limit=limit, after=after)

    def queue_by_uncertainty(
        self, where: QueueFilter, *, limit: int, after: UncertainCursor | None = None
    ) -> UncertainPage:
        """The queue least sure first (:func:`triage.jobs.sql.reads.review_uncertainty.uncertain_page`)."""
        with self.review_store.reading() as conn:
            return uncertain_page(conn, where, limit=limit, after=after)

    def job(self, job_id: uuid.UUID) -> dict[str, Any] | None:
        with self.review_store.reading() as conn:
            return job_detail(conn, job_id)

    def document(self, job: dict[str, Any]) -> Document:
        """The job's document, read through the payload store and verified against its hash."""
        from triage.payloads import read_payload

        try:
            content = read_payload(job["payload_ref"], job["content_sha256"], self.payload_base())
        except PayloadError as exc:
            log.warning("job=%s document unavailable: %s", job["id"], exc.error_class)
            return Document(None, {}, False, exc.error_class)
        text = content.decode("utf-8", errors="replace")
        fields: dict[str, str] = {}
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            fields = {k: str(data[k]) for k in ("subject", "body") if isinstance(data.get(k), str)}
            text = json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True)
        cut = len(text) > DOCUMENT_CHARS
        return Document(text[:DOCUMENT_CHARS], {k: v[:DOCUMENT_CHARS] for k, v in fields.items()}, cut, None)

    def report(self, *, run_id: int | None = None, dag_run_id: str | None = None) -> dict[str, Any] | None:
        with self.review_store.reading() as conn:
            return history.stored_run(conn, run_id=run_id, dag_run_id=dag_run_id)

    def trend(self) -> list[dict[str, Any]]:
        with self.review_store.reading() as conn:
            return history.trend_rows(conn)

    # -- deciding ----------------------------------------------------------------------------

    def config(self, job_ids: Sequence[uuid.UUID], action: str, label: str | None, note: str | None) -> ReviewRunConfig:
        """The decision as ``review_jobs`` takes it (the same rules: a label only with ``label``).

        :raises Refused: 422, the decision is not valid.
        """
        from pydantic import ValidationError

        try:
            return ReviewRunConfig.model_validate(
                {"job_ids": [str(j) for j in job_ids], "decision": action, "label": label or None, "note": note or None}
            )
        except ValidationError as exc:
            problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
            raise Refused(422, problems) from None

    def decide(self, job_id: uuid.UUID, action: str, *, label: str | None, note: str | None, reviewer: str) -> Decided:
        """One job, one transaction (:func:`triage.review.decisions.decide`), then the reviewer's
        label to the label action as ``review_jobs`` sends it.

        :raises Refused: nothing changed: 404 unknown job, 409 not in review (or decided by
            someone else: the second of two reviewers), 422 invalid decision or label.
        """
        if action == "replay":
            raise Refused(422, "replay is a decision by filter: trigger review_jobs for it")
        config = self.config([job_id], action, label, note)
        try:
            result = decisions.decide(
                self.review_store, job_id, config, reviewer=reviewer, taxonomy_names=self.taxonomy()
            )
        except LedgerError as exc:
            raise _refusal(exc) from None
        if result.already_applied and result.resolved_by != reviewer:
            when = f"{result.resolved_at:%Y-%m-%d %H:%M:%S %Z}" if result.resolved_at else "?"
            raise Refused(409, f"job {job_id} was already decided ({action}) by {result.resolved_by} at {when}")
        sent = self._send_label(job_id) if action == "label" else None  # as review_jobs: a retry is safe
        return Decided(
            job_id,
            "already_applied" if result.already_applied else "applied",
            result.status.value,
            result.resolved_by,
            result.resolved_at,
            sent,
        )

    def decide_many(
        self, job_ids: Sequence[uuid.UUID], action: str, *, label: str | None, note: str | None, reviewer: str
    ) -> decisions.ReviewReport:
        """A bulk decision: each job on its own (:func:`triage.review.decisions.apply_review`)."""
        if not job_ids:
            raise Refused(422, "no jobs selected")
        if len(job_ids) > BULK_LIMIT:
            raise Refused(422, f"at most {BULK_LIMIT} jobs at once")
        if action == "replay":
            raise Refused(422, "replay is a decision by filter: trigger review_jobs for it")
        config = self.config(job_ids, action, label, note)
        action_client = self._label_action() if action == "label" and self._label_action else None
        try:
            return decisions.apply_review(
                self.review_store,
                [str(j) for j in job_ids],
                config,
                reviewer=reviewer,
                taxonomy_names=self.taxonomy(),
                send_label=action_client.send if action_client is not None else None,
            )
        finally:
            if action_client is not None:
                action_client.close()

    def _send_label(self, job_id: uuid.UUID) -> str | None:
        if self._label_action is None:
            return None
        client = self._label_action()
        if client is None:
            return None
        try:
            return decisions.send_reviewed_label(self.review_store, job_id, client.send)
        finally:
            client.close()
