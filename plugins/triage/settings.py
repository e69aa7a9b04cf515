"""Where a deployment keeps its files: payloads, the event log, reports.

Resolved from, in order: an explicit argument, an Airflow Variable (read by the operators),
an environment variable, and ``$TRIAGE_HOME`` (``.triage/`` of the checkout by default).
"""

from __future__ import annotations

import os

from triage.embedded import triage_home

ENV_PAYLOAD_BASE = "TRIAGE_PAYLOAD_BASE"
ENV_EVENT_LOG = "TRIAGE_EVENT_LOG"
ENV_REPORTS_DIR = "TRIAGE_REPORTS_DIR"


def payload_base(explicit: str | None = None) -> str:
    return explicit or os.environ.get(ENV_PAYLOAD_BASE) or str(triage_home() / "payloads")


def event_log(explicit: str | None = None) -> str:
    return explicit or os.environ.get(ENV_EVENT_LOG) or str(triage_home() / "events" / "outbox.jsonl")


def reports_dir(explicit: str | None = None) -> str:
    return explicit or os.environ.get(ENV_REPORTS_DIR) or str(triage_home() / "reports")
