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
