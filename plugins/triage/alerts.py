"""Alerts: when a person must be told that work needs them, and what they are told.

Four kinds, one alert per DAG run and kind (:attr:`Alert.key`):

- ``review_threshold``: a ``classify_documents`` run sent more of its batch to ``manual_review``
  than :attr:`Thresholds.review` allows (:func:`run_alerts`);
- ``terminal_failures``: it moved jobs to ``terminal_failed`` beyond :attr:`Thresholds.terminal`;
- ``orphans``: ``reconcile_jobs`` took back work that a dead worker or a dead run left behind
  (:data:`ORPHAN_REPAIRS`; :func:`orphan_alert`);
- ``deadline_missed``: a ``classify_documents`` run had not succeeded by its deadline
  (:func:`deadline_alert`, called by Airflow's deadline alert).

An alert carries ids, counts, reason codes, the run and where to look; never a document's text,
an external id (it comes from outside and may hold anything), an error message (it may echo the
input), a prompt or a credential. The decisions are pure functions over what the ledger and the
reconciliation report say; delivery is a webhook POST (:class:`WebhookAlerts`) or a log line
(:class:`LogAlerts`). No Airflow here: :mod:`triage.operators.alerts` is the notifier.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from triage.jobs.sql.reads.alerts import RunMoves
from triage.jobs.vocabulary.states import JobStatus

log = logging.getLogger(__name__)

REVIEW_THRESHOLD, TERMINAL_FAILURES, ORPHANS, DEADLINE_MISSED = (
    "review_threshold",
    "terminal_failures",
    "orphans",
    "deadline_missed",
)

ORPHAN_REPAIRS: Mapping[str, str] = {
    "lease_released": "a worker died or hung holding their lease: back to retryable_failed",
    "lease_released_to_review": "a worker died or hung holding their lease, too often or out of attempts: to review",
    "batch_sent_to_review": "a run Airflow gave up on left them and its failure callback never ran: to review",
    "orphans_sent_to_review": "their batch saw no progress for hours and no run holds it (no Airflow API needed): "
    "to review as orphaned",
    "last_try_dead_to_review": "their task's final try died holding them and nobody came back (no Airflow API "
    "needed): to review as airflow_task_failed",
}
"""The reconciliation repairs (``docs/reconciliation.md``) that take back work nobody alive
holds any more, and what each means. A new backstop repair of that kind belongs here."""


class InvalidAlertSettings(ValueError):
    """A threshold setting that is not a number in its range."""


@dataclass(frozen=True, slots=True)
class Threshold:
    """Exceeded when at least ``min_jobs`` jobs, and at least ``fraction`` of the batch, are in it."""

    min_jobs: int
    fraction: float = 0.0

    def exceeded(self, count: int, total: int) -> bool:
        return count >= max(self.min_jobs, 1) and count >= self.fraction * total

    def describe(self) -> str:
        share = f" and >= {self.fraction:.0%} of the batch" if self.fraction else ""
        return f">= {self.min_jobs} jobs{share}"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When to alert. The defaults: a tenth of a batch (and at least 10 jobs) sent to review is
    more than a model's usual doubt; any job that no automatic attempt will finish, and any
    orphan, is worth a look (``terminal_failed`` jobs sit in no review queue)."""

    review: Threshold = Threshold(10, 0.10)
    terminal: Threshold = Threshold(1, 0.0)
    orphans: Threshold = Threshold(1, 0.0)

    SETTINGS = ("review_min_jobs", "review_fraction", "terminal_min_jobs", "terminal_fraction", "orphan_min_jobs")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Thresholds:
        """The defaults with those of :attr:`SETTINGS` that ``settings`` holds (other keys are
        ignored); a value out of range raises :class:`InvalidAlertSettings` naming it."""
        default = cls()

        def count(key: str, fallback: int) -> int:
            value = settings.get(key, fallback)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidAlertSettings(f"{key} must be a whole number of jobs >= 1, not {value!r}")
            return value

        def share(key: str, fallback: float) -> float:
            value = settings.get(key, fallback)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise InvalidAlertSettings(f"{key} must be a fraction between 0 and 1, not {value!r}")
            return float(value)

        return cls(
            review=Threshold(
                count("review_min_jobs", default.review.min_jobs), share("review_fraction", default.review.fraction)
            ),
            terminal=Threshold(
                count("terminal_min_jobs", default.terminal.min_jobs),
                share("terminal_fraction", default.terminal.fraction),
            ),
            orphans=Threshold(count("orphan_min_jobs", default.orphans.min_jobs)),
        )


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert: what happened (``summary``, one line), to how many jobs, in which run, and
    where to look. ``details`` holds counts and reason codes only."""

    kind: str
    dag_id: str
    run_id: str
    summary: str
    count: int = 0
    details: Mapping[str, Any] = field(default_factory=dict)
    job_ids: tuple[str, ...] = ()
    links: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """One per DAG run and kind: a webhook that honours ``Idempotency-Key`` drops a repeat."""
        return f"triage-alert/{self.kind}/{self.dag_id}/{self.run_id}"

    def text(self) -> str:
        """The human line: the summary and where to look (Slack renders ``<url|label>``)."""
        where = " · ".join(f"<{url}|{name.replace('_', ' ')}>" for name, url in self.links.items())
        return f"[Triage] {self.summary}" + (f" · {where}" if where else "")

    def payload(self, fmt: str = "json") -> dict[str, Any]:
        """``{"text": …}`` (Slack's incoming-webhook form) and, unless ``fmt`` is ``text``, the
        same alert as data under ``triage_alert``."""
        body: dict[str, Any] = {"text": self.text()}
        if fmt != "text":
            body["triage_alert"] = {
                "kind": self.kind,
                "key": self.key,
                "dag_id": self.dag_id,
                "run_id": self.run_id,
                "summary": self.summary,
                "count": self.count,
                "details": dict(self.details),
                "job_ids": list(self.job_ids),
                "links": dict(self.links),
            }
        return body

    def log_line(self) -> str:
        """The alert as a log line: key=value pairs, job ids as a sample."""
        details = " ".join(f"{k}={v}" for k, v in self.details.items())
        ids = ",".join(self.job_ids[:5]) + (",…" if len(self.job_ids) > 5 else "")
        return f"ALERT kind={self.kind} dag={self.dag_id} run={self.run_id} count={self.count} {details} job_ids={ids}"


def _reasons(reasons: Mapping[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in reasons.items())


def run_alerts(
    moves: RunMoves, thresholds: Thresholds, *, dag_id: str, run_id: str, links: Mapping[str, str] | None = None
) -> list[Alert]:
    """The alerts a ``classify_documents`` run earned: review entries and terminal failures of
    its batch that it caused, each against its threshold (the batch's size is the whole)."""
    alerts = []
    for kind, status, threshold, what in (
        (REVIEW_THRESHOLD, JobStatus.MANUAL_REVIEW, thresholds.review, "entered manual review"),
        (TERMINAL_FAILURES, JobStatus.TERMINAL_FAILED, thresholds.terminal, "failed terminally"),
    ):
        entered = moves.of(status)
        if not threshold.exceeded(entered.jobs, moves.batch_jobs):
            continue
        share = entered.jobs / moves.batch_jobs if moves.batch_jobs else 1.0
        summary = (
            f"{entered.jobs} of {moves.batch_jobs} jobs ({share:.0%}) {what} in {dag_id} run {run_id} "
            f"(batch {moves.batch_key}; alert at {threshold.describe()}): {_reasons(entered.reasons)}"
        )
        details = {
            "status": status.value,
            "batch_key": moves.batch_key,
            "batch_jobs": moves.batch_jobs,
            "fraction": round(share, 4),
            "reasons": dict(entered.reasons),
            "threshold": {"min_jobs": threshold.min_jobs, "fraction": threshold.fraction},
        }
        alerts.append(Alert(kind, dag_id, run_id, summary, entered.jobs, details, entered.job_ids, dict(links or {})))
    return alerts


def orphans_of(repairs: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Jobs taken back by each orphan repair of a reconciliation summary's ``repairs``."""
    counts: dict[str, int] = {}
    for repair in repairs:
        if repair.get("action") in ORPHAN_REPAIRS and int(repair.get("count") or 0) > 0:
            counts[repair["action"]] = counts.get(repair["action"], 0) + int(repair["count"])
    return counts


def orphan_alert(
    repairs: Sequence[Mapping[str, Any]],
    threshold: Threshold,
    *,
    dag_id: str,
    run_id: str,
    reconciliation_run: int | None = None,
    links: Mapping[str, str] | None = None,
) -> Alert | None:
    """The alert of a reconciliation run that took back at least ``threshold.min_jobs`` jobs
    nobody alive held. Each repair happens once, so the next run (or a retry) repeats nothing."""
    counts = orphans_of(repairs)
    total = sum(counts.values())
    if not threshold.exceeded(total, total):
        return None
    job_ids: list[str] = []
    for repair in repairs:
        if repair.get("action") in counts:
            job_ids += [str(i) for i in repair.get("job_ids") or ()]
    summary = f"reconciliation took back {total} orphaned jobs ({_reasons(counts)}): " + "; ".join(
        f"{action}: {ORPHAN_REPAIRS[action]}" for action in counts
    )
    details = {"repairs": counts, "reconciliation_run": reconciliation_run}
    return Alert(
        ORPHANS, dag_id, run_id, summary, total, details, tuple(dict.fromkeys(job_ids))[:25], dict(links or {})
    )


def deadline_alert(
    *,
    dag_id: str,
    run_id: str,
    state: str | None,
    deadline_time: str | None,
    queued_at: str | None,
    links: Mapping[str, str] | None = None,
) -> Alert:
    """A run that had not succeeded by its deadline (it may still be running, or have failed)."""
    summary = (
        f"{dag_id} run {run_id} had not succeeded by its deadline {deadline_time or '?'} "
        f"(queued {queued_at or '?'}; state then: {state or 'unknown'})"
    )
    details = {"state": state, "deadline_time": deadline_time, "queued_at": queued_at}
    return Alert(DEADLINE_MISSED, dag_id, run_id, summary, 0, details, (), dict(links or {}))


# -- delivery -------------------------------------------------------------------------------


class AlertDelivery(Protocol):
    """Where alerts go; ``send`` raises when the destination did not take the alert."""

    where: str

    def send(self, alert: Alert) -> None: ...


class LogAlerts:
    """The default with no webhook: the alert is a WARNING line of the task's log."""

    where = "log"

    def send(self, alert: Alert) -> None:
        log.warning("%s", alert.log_line())
        log.warning("%s", alert.text())


class WebhookAlerts:
    """POST the alert's JSON to a webhook (Slack's incoming webhooks take ``{"text": …}``), with
    ``Idempotency-Key`` set to :attr:`Alert.key`. One attempt, bounded by ``timeout_s``.

    The URL may hold a secret (Slack's does), so it appears in no log line and no error."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
        fmt: str = "json",
        where: str = "webhook",
    ) -> None:
        self.url, self.headers, self.timeout_s, self.fmt, self.where = url, dict(headers or {}), timeout_s, fmt, where

    def send(self, alert: Alert) -> None:
        import httpx

        headers = {**self.headers, "Idempotency-Key": alert.key}
        response = httpx.post(self.url, json=alert.payload(self.fmt), headers=headers, timeout=self.timeout_s)
        if response.status_code >= 300:
            raise AlertNotDelivered(f"HTTP {response.status_code}")


class AlertNotDelivered(RuntimeError):
    """The destination answered, and not with success."""


def deliver(alert: Alert, delivery: AlertDelivery) -> str:
    """Send ``alert``; ``"sent"`` (``"logged"`` for the log), or ``"failed: <what>"``.

    The one broad ``except`` of the alerts, and a named degraded path: an alert that cannot be
    delivered must never fail the run it reports on, and is not lost either: it is logged as a
    WARNING, with what went wrong by class only (an error's text could hold the webhook's URL).
    """
    try:
        delivery.send(alert)
    except Exception as exc:  # noqa: BLE001 - see the docstring: the alert degrades to the log
        what = str(exc) if isinstance(exc, AlertNotDelivered) else type(exc).__name__
        log.warning(
            "alert %s not delivered to the %s (%s); here it is: %s", alert.key, delivery.where, what, alert.log_line()
        )
        return f"failed: {what}"
    return "logged" if delivery.where == "log" else "sent"
