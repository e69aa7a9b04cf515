"""Where a deployment keeps its files (payloads, the event log, reports), and what its DAG
runs may ask for (where an inbox may be, whether the failure drill may run).

Files are resolved from, in order: an explicit argument, an Airflow Variable (read by the
operators), an environment variable, and ``$TRIAGE_HOME`` (``.triage/`` of the checkout by
default). The limits on runs come from the environment only: whoever may trigger a DAG or edit
a Variable must not be able to widen them.
"""

from __future__ import annotations

import os
from pathlib import Path

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


# -- intake (POST /triage/api/documents): limits and the classifier its documents wait for --------

ENV_INTAKE_MAX_BODY_BYTES = "TRIAGE_INTAKE_MAX_BODY_BYTES"
ENV_INTAKE_MAX_DOCUMENTS = "TRIAGE_INTAKE_MAX_DOCUMENTS"
ENV_INTAKE_MAX_QUEUED = "TRIAGE_INTAKE_MAX_QUEUED"
ENV_INTAKE_RETRY_AFTER = "TRIAGE_INTAKE_RETRY_AFTER_SECONDS"
ENV_INTAKE_CLASSIFIER = "TRIAGE_INTAKE_CLASSIFIER"


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
    (``$TRIAGE_INTAKE_CLASSIFIER``: ``keyword``, the default, or ``llm``). One setting for both:
    a job is claimed only by a run of the classifier version it was registered for."""
    name = os.environ.get(ENV_INTAKE_CLASSIFIER, "").strip() or "keyword"
    if name not in ("keyword", "llm"):
        raise ValueError(f"{ENV_INTAKE_CLASSIFIER} must be keyword or llm, not {name!r}")
    return name
