"""What intake does, without HTTP: the queue bound, accepting documents, telling Airflow, and a
document's state. Its seams (tests give their own): the Triage service (the store and the
payload base), the classifier version, the announcement, and a hook after the commit.

Telling Airflow is an asset event on ``triage://intake`` (``triage_intake``), recorded the way
Airflow's own REST endpoint ``POST /api/v2/assets/events`` records one: the asset manager's
``register_asset_change`` in a session on Airflow's metadata database, which the API server
serving this app holds anyway. It queues a run of every DAG scheduled on the asset
(``classify_intake``); with a run of it active, the queued request waits and the scheduler
starts the next run when the active one ends, so nothing posted during a run is left behind.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from triage import settings
from triage.contracts.intake import INTAKE_ASSET_NAME, INTAKE_ASSET_URI, IntakeDocument
from triage.jobs.store.intake import Accepted
from triage.jobs.vocabulary.states import JobStatus
from triage.web.service import TriageService

if TYPE_CHECKING:
    import sqlalchemy as sa

    from triage.payloads import PayloadStore

log = logging.getLogger(__name__)

DEPTH_TTL_SECONDS = 1.0
"""How long a measured queue depth is reused (plus what this process accepted since): one depth
query a second per API server process, not one a request. The bound may be overshot by what the
other API server processes accept within it."""

VERSION_TTL_SECONDS = 60.0
"""How long the classifier version and the payload store are reused before they are worked out
again (a changed ``triage_llm`` connection, taxonomy or ``triage_payload_base`` reaches intake
within this)."""


class NotAnnounced(Exception):
    """The documents are committed, but Airflow could not be told (no asset event)."""


def announce_intake(documents: int) -> bool:
    """Record an asset event on the intake asset; False when Airflow does not know the asset yet
    (``classify_intake`` not parsed). The call Airflow's own ``POST /api/v2/assets/events``
    handler makes, in this (the API server's) process: why not over HTTP or the Task SDK is
    docs/adr/0008-intake-asset-events-in-process.md."""
    import sqlalchemy as sa
    from airflow.assets.manager import asset_manager
    from airflow.models.asset import AssetModel
    from airflow.sdk import Asset
    from airflow.utils.session import create_session

    uri = Asset(name=INTAKE_ASSET_NAME, uri=INTAKE_ASSET_URI).uri  # as Airflow stores it: triage://intake/
    with create_session() as session:
        asset = session.scalar(sa.select(AssetModel).where(AssetModel.name == INTAKE_ASSET_NAME, AssetModel.uri == uri))
        if asset is None:
            return False
        event = asset_manager.register_asset_change(
            asset=asset,
            extra={"documents": documents},
            source_is_api=True,
            session=session,
        )
        return event is not None


class NoIntakeClassifier(Exception):
    """No classifier can take intake's documents: nothing is accepted until one can (the message
    says what to do: train a model, or give the taxonomy's labels keywords)."""


def intake_classifier_version(engine: sa.Engine) -> str:
    """The version of the classifier ``classify_intake`` runs (``$TRIAGE_INTAKE_CLASSIFIER``, with
    ``auto`` resolved as a run resolves it: the champion's version when the registry of
    ``engine`` has one, else the keyword rules'). The champion's artifact is not read: its
    version is the registry row's.

    :raises NoIntakeClassifier: ``learned`` with no champion, or a taxonomy the chosen
        classifier refuses (``keyword`` with labels without keywords) or cannot read.
    """
    from triage.classifiers import Taxonomy, TaxonomyError, classifier_version
    from triage.learning.registry import champion_version, concrete_classifier

    configured = settings.intake_classifier()
    champion = champion_version(engine) if configured in ("auto", "learned") else None
    name = concrete_classifier(configured, champion)
    if name == "learned":
        version = champion
        if version is None:
            raise NoIntakeClassifier(
                f"{settings.ENV_INTAKE_CLASSIFIER} is learned and no model is champion yet: train one with "
                "`triage train` (or trigger the train_classifier DAG)"
            )
        return version
    from triage.pipeline.classify_plan import model_needs

    llm = None
    if "model_connection" in model_needs(name):
        from triage.adapters.model_api import llm_settings

        llm = llm_settings()
    try:
        return classifier_version(name, taxonomy=Taxonomy.load(), llm_settings=llm)
    except TaxonomyError as exc:
        hint = " (with no learned champion yet, auto means keyword: train one with `triage train`)"
        raise NoIntakeClassifier(f"intake's classifier {name}: {exc}{hint if configured == 'auto' else ''}") from None


class IntakeService:
    """:param triage: the Triage service (its store and payload base).
    :param announce: tells Airflow that ``n`` documents wait (default :func:`announce_intake`);
        returns whether it could.
    :param classifier_version: a fixed version (default: worked out, :func:`intake_classifier_version`).
    :param after_commit: called with what was accepted, after the commit and before the answer
        (the kill test's seam).
    """

    def __init__(
        self,
        triage: TriageService,
        *,
        announce: Callable[[int], bool] | None = None,
        classifier_version: str | None = None,
        max_attempts: int | None = None,
        after_commit: Callable[[Sequence[Accepted]], None] | None = None,
    ) -> None:
        self.triage = triage
        self._announce = announce or announce_intake
        self._fixed_version = classifier_version
        self._version: tuple[float, str] | None = None
        self._lock = threading.Lock()
        self._max_attempts = max_attempts
        self.after_commit = after_commit
        self._depth: tuple[float, int] | None = None  # (measured at, depth) of the intake queue
        self._payloads: tuple[float, PayloadStore] | None = None  # (made at, store)

    @property
    def max_queued(self) -> int:
        return settings.intake_max_queued()

    def classifier_version(self) -> str:
        if self._fixed_version is not None:
            return self._fixed_version
        with self._lock:
            now = time.monotonic()
            if self._version is None or now - self._version[0] > VERSION_TTL_SECONDS:
                self._version = (now, intake_classifier_version(self.triage.store.engine))
            return self._version[1]

    def queue_full_known(self) -> bool | None:
        """:meth:`queue_full` from a depth measured less than :data:`DEPTH_TTL_SECONDS` ago,
        without touching the database; None when it must be measured again."""
        with self._lock:
            known = self._depth
        if known is None or time.monotonic() - known[0] > DEPTH_TTL_SECONDS:
            return None
        return known[1] >= self.max_queued

    def queue_full(self) -> bool:
        """Whether the intake queue holds its bound: its unfinished jobs (parked ones included),
        counted up to it (one bounded index scan) at most every :data:`DEPTH_TTL_SECONDS`, plus
        what this process accepted since."""
        bound = self.max_queued
        with self._lock:
            known = self._depth
        if known is None or time.monotonic() - known[0] > DEPTH_TTL_SECONDS:
            known = (time.monotonic(), self.triage.store.intake.unfinished_depth(bound=bound))
            with self._lock:
                self._depth = known
        return known[1] >= bound

    def _accepted(self, new: int) -> None:
        with self._lock:
            if self._depth is not None:
                self._depth = (self._depth[0], self._depth[1] + new)

    def payload_store(self) -> PayloadStore:
        """Where payloads are stored (the Triage service's base), reused for
        :data:`VERSION_TTL_SECONDS`: the base may be an Airflow Variable, read from Airflow's
        database, and a store resolves its base and learns its folders once."""
        from triage.payloads import PayloadStore

        with self._lock:
            now = time.monotonic()
            if self._payloads is None or now - self._payloads[0] > VERSION_TTL_SECONDS:
                base = self.triage.payload_base()
                if "://" in base:
                    from airflow.sdk import ObjectStoragePath

                    self._payloads = (now, PayloadStore(ObjectStoragePath(base)))
                else:
                    self._payloads = (now, PayloadStore(base))
            return self._payloads[1]

    def accept(self, documents: Sequence[tuple[IntakeDocument, bytes]], caller: str) -> list[Accepted]:
        """Payloads stored, jobs committed, Airflow told; one :class:`Accepted` per document.

        :raises NotAnnounced: the jobs are committed but Airflow was not told; posting again
            answers their ids and tells it again.
        :raises NoIntakeClassifier: no classifier can take them (nothing is stored).
        """
        from triage.contracts.run_config import ClassifyRunConfig
        from triage.pipeline.intake import IntakeSettings, accept_documents

        if self._max_attempts is None:
            self._max_attempts = ClassifyRunConfig().max_attempts
        max_attempts = self._max_attempts
        accepted = accept_documents(
            self.triage.store,
            self.payload_store(),
            documents,
            IntakeSettings(self.classifier_version(), max_attempts),
            actor=f"intake:{caller}"[:200],
        )
        self._accepted(sum(a.new for a in accepted))
        if self.after_commit is not None:
            self.after_commit(accepted)
        waiting = sum(1 for a in accepted if a.status == JobStatus.QUEUED.value)
        if waiting:
            # Also for a document known before and still queued: an earlier request's announcement
            # may have been lost with its answer, and one more asset event costs a row.
            try:
                told = self._announce(waiting)
            except Exception as exc:  # noqa: BLE001 - the answer says so; the jobs are committed
                log.warning("intake: the asset event failed: %s", type(exc).__name__)
                told = False
            if not told:
                raise NotAnnounced(f"Airflow has no asset {INTAKE_ASSET_URI} or could not record its event")
        return accepted

    def status(self, job_id: uuid.UUID) -> dict[str, Any] | None:
        found = self.triage.store.intake.intake_status(job_id)
        return dataclasses.asdict(found) if found is not None else None
