"""Where a deployment keeps its files (payloads, the event log, reports), and what its DAG
runs may ask for (where an inbox may be, whether the failure drill may run).

Files are resolved from, in order: an explicit argument, an Airflow Variable (read by the
operators), an environment variable, and ``$TRIAGE_HOME`` (``.triage/`` of the checkout by
default). The limits on runs come from the environment only: whoever may trigger a DAG or edit
a Variable must not be able to widen them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

ENV_HOME = "TRIAGE_HOME"
ENV_PAYLOAD_BASE = "TRIAGE_PAYLOAD_BASE"
ENV_EVENT_LOG = "TRIAGE_EVENT_LOG"
ENV_REPORTS_DIR = "TRIAGE_REPORTS_DIR"
ENV_INBOX_ROOTS = "TRIAGE_INBOX_ROOTS"
ENV_ALLOW_DRILL = "TRIAGE_ALLOW_DRILL"

_TRUE = frozenset({"1", "true", "yes", "on"})


def project_root() -> Path:
    """The folder holding ``plugins/``, ``dags/`` and ``include/``: the checkout, or
    ``/opt/airflow`` in the image (``plugins/triage/settings.py`` -> two levels up)."""
    return Path(__file__).resolve().parents[2]


def triage_home() -> Path:
    """Local state: payloads, reports, the event log (and, for the developer tools, the embedded
    database and the Airflow home): ``$TRIAGE_HOME``, else ``.triage/`` of the project folder."""
    home = os.environ.get(ENV_HOME)
    return Path(home).resolve() if home else project_root() / ".triage"


def payload_base(explicit: str | None = None) -> str:
    return explicit or os.environ.get(ENV_PAYLOAD_BASE) or str(triage_home() / "payloads")


def event_log(explicit: str | None = None) -> str:
    return explicit or os.environ.get(ENV_EVENT_LOG) or str(triage_home() / "events" / "outbox.jsonl")


def reports_dir(explicit: str | None = None) -> str:
    return explicit or os.environ.get(ENV_REPORTS_DIR) or str(triage_home() / "reports")


def inbox_roots() -> tuple[str, ...]:
    """Where the ``inbox`` of a ``classify_documents`` run may be: ``$TRIAGE_INBOX_ROOTS``, a
    comma-separated list of folders (relative ones from the project folder) and URL prefixes
    (``s3://bucket/inbox``); unset means the project's sample inbox and ``$TRIAGE_HOME/inbox``.
    Set and empty means no inbox at all."""
    configured = os.environ.get(ENV_INBOX_ROOTS)
    if configured is None:
        return (str(project_root() / "include" / "sample_inbox"), str(triage_home() / "inbox"))
    return tuple(root.strip() for root in configured.split(",") if root.strip())


def drill_allowed() -> bool:
    """Whether runs may inject faults (the ``drill`` param): only where ``$TRIAGE_ALLOW_DRILL``
    is ``1`` (or true/yes/on). ``make run``, ``make chaos`` and the tests set it; docker-compose
    leaves it off."""
    return os.environ.get(ENV_ALLOW_DRILL, "").strip().lower() in _TRUE


# -- retention: how long what is done is kept (triage_maintenance applies it) --------------

ENV_RETENTION = "TRIAGE_RETENTION"


@dataclass(frozen=True)
class Retention:
    """Days each kind of finished record is kept (``None``: forever); ``triage_maintenance``
    removes what is older, and never anything open (a job not terminal, an open review, an
    unsent event, the payload of an open job), whatever these say.

    Set as a JSON object of these names in the Airflow Variable ``triage_retention`` or in
    ``$TRIAGE_RETENTION`` (``{"outbox": 3, "payloads": null}``); a name left out keeps its
    default. Each has a floor that what reconciliation and review read needs: the outbox the
    consistency checks' one-day window, the transition log the report's seven-day window.

    :ivar outbox: published outbox events (by day partition).
    :ivar job_events: the transition log (by day partition; a day holding an event of an open
        job is kept whole).
    :ivar classifications: the classifications of terminal jobs (in bounded batches).
    :ivar payloads: payload packs no open job and no labelled example references (local payload bases).
    :ivar event_files: the rotated files of the JSON-lines event sink (rotated daily).
    :ivar reports: reconciliation reports: the HTML files and the rows of ``reconciliation_runs``.
    :ivar partitions_ahead: days of partitions made in advance (not a retention).
    """

    outbox: float | None = 7
    job_events: float | None = 30
    classifications: float | None = 30
    payloads: float | None = 30
    event_files: float | None = 14
    reports: float | None = 30
    partitions_ahead: int = 7

    FLOORS: ClassVar[dict[str, float]] = {
        "outbox": 2,
        "job_events": 8,
        "classifications": 1,
        "payloads": 1,
        "event_files": 1,
        "reports": 1,
    }

    def __post_init__(self) -> None:
        for name, floor in self.FLOORS.items():
            days = getattr(self, name)
            if days is not None and not (isinstance(days, int | float) and days >= floor):
                raise ValueError(f"retention of {name} must be at least {floor} days or null (forever), not {days!r}")
        if not (isinstance(self.partitions_ahead, int) and 1 <= self.partitions_ahead <= 60):
            raise ValueError(f"partitions_ahead must be 1..60 days, not {self.partitions_ahead!r}")

    @classmethod
    def parse(cls, text: str | Mapping[str, Any] | None) -> Retention:
        if text is None or text == "":
            return cls()
        values = json.loads(text) if isinstance(text, str) else dict(text)
        if not isinstance(values, dict):
            raise ValueError("retention must be a JSON object of days per kind")
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown retention kinds: {', '.join(sorted(unknown))}")
        return cls(**values)


def retention(explicit: str | Mapping[str, Any] | None = None) -> Retention:
    """The deployment's retention: ``explicit`` (the operator passes Variable ``triage_retention``),
    else ``$TRIAGE_RETENTION``, else the defaults of :class:`Retention`."""
    return Retention.parse(explicit if explicit is not None else os.environ.get(ENV_RETENTION))


# -- intake (POST /triage/api/documents): limits and the classifier its documents wait for --------

ENV_INTAKE_MAX_BODY_BYTES = "TRIAGE_INTAKE_MAX_BODY_BYTES"
ENV_INTAKE_MAX_DOCUMENTS = "TRIAGE_INTAKE_MAX_DOCUMENTS"
ENV_INTAKE_MAX_QUEUED = "TRIAGE_INTAKE_MAX_QUEUED"
ENV_INTAKE_RETRY_AFTER = "TRIAGE_INTAKE_RETRY_AFTER_SECONDS"
ENV_INTAKE_CLASSIFIER = "TRIAGE_INTAKE_CLASSIFIER"
ENV_INTAKE_SOURCES = "TRIAGE_INTAKE_SOURCES"
ENV_INTAKE_RESERVED_SOURCES = "TRIAGE_INTAKE_RESERVED_SOURCES"


def _positive_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value = int(raw)  # a malformed limit is a deployment error: fail loudly, never guess
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, not {raw!r}")
    return value


def intake_max_body_bytes() -> int:
    """The largest request body intake reads (``$TRIAGE_INTAKE_MAX_BODY_BYTES``, 10 MiB): a
    longer one is refused with 413 while it is read, never buffered whole."""
    return _positive_int(ENV_INTAKE_MAX_BODY_BYTES, 10 << 20)


def intake_max_documents() -> int:
    """The most documents one intake request may carry (``$TRIAGE_INTAKE_MAX_DOCUMENTS``, 500)."""
    return _positive_int(ENV_INTAKE_MAX_DOCUMENTS, 500)


def intake_max_queued() -> int:
    """The backpressure bound (``$TRIAGE_INTAKE_MAX_QUEUED``, 50,000): while this many intake jobs
    are queued and not yet claimed, intake answers 429 with ``Retry-After``."""
    return _positive_int(ENV_INTAKE_MAX_QUEUED, 50_000)


def intake_retry_after() -> int:
    """The ``Retry-After`` of a 429 (``$TRIAGE_INTAKE_RETRY_AFTER_SECONDS``, 10 s)."""
    return _positive_int(ENV_INTAKE_RETRY_AFTER, 10)


def intake_classifier() -> str:
    """The classifier intake's documents are registered for and ``classify_intake`` runs with
    (``$TRIAGE_INTAKE_CLASSIFIER``: ``auto``, the default: the learned champion when there is
    one, else ``keyword``; or ``keyword``, ``llm``, ``learned``). One setting for both: a job is
    claimed only by a run of the classifier version it was registered for."""
    name = os.environ.get(ENV_INTAKE_CLASSIFIER, "").strip() or "auto"
    if name not in ("auto", "keyword", "llm", "learned"):
        raise ValueError(f"{ENV_INTAKE_CLASSIFIER} must be auto, keyword, llm or learned, not {name!r}")
    return name
