"""Replay by filter for people: run a preview or an apply and say what happened, the same way
from the ``review_jobs`` form and from ``triage replay``.

The report carries ids, states, reasons, counts and who asked; never a document. Every value
that came from outside (the filter, a job's reason, the actor's name) is escaped in the
Markdown (:mod:`triage.markdown`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from triage import markdown as md
from triage.contracts.replay import ReplayFilter
from triage.jobs.store import JobStore
from triage.jobs.store.replays import ReplayApplied, ReplayPreview, ReplayRequest

LISTED_IDS = 100
"""How many of an apply's moved job ids the report lists (all of them are in ``job_events``)."""


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """A preview (``dry_run``) or an apply of one replay."""

    selection: ReplayFilter
    actor: str
    preview: ReplayPreview | None = None
    applied: ReplayApplied | None = None

    @property
    def outcome(self) -> str:
        return "dry_run" if self.applied is None else self.applied.outcome

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (XCom, ``--json``)."""
        out: dict[str, Any] = {
            "decision": "replay",
            "outcome": self.outcome,
            "actor": self.actor,
            "filter": self.selection.selection(),
            "note": self.selection.note,
            "replay_key": self.selection.replay_key(),
        }
        if self.preview is not None:
            p = self.preview
            out.update(
                matching=p.matching,
                would_replay=p.would_replay,
                at_replay_limit=p.at_replay_limit,
                jobs=[
                    {
                        "job_id": str(j.job_id),
                        "status": j.status.value,
                        "reason": j.reason,
                        "error_class": j.error_class,
                        "source": j.source,
                        "batch_key": j.batch_key,
                        "failed_at": j.failed_at.isoformat(),
                        "replays": j.replays,
                    }
                    for j in p.jobs
                ],
                submitted_before=_request_dict(p.request),
            )
        if self.applied is not None:
            a = self.applied
            out.update(
                replayed=a.replayed_now,
                request=_request_dict(a.request),
                job_ids=[str(j) for j in a.job_ids[:LISTED_IDS]],
            )
        return out

    def to_markdown(self) -> str:
        """For the task log and the terminal."""
        criteria = ", ".join(f"{k}={v}" for k, v in self.selection.selection().items() if v is not None)
        lines = [
            f"### replay {md.code(self.selection.replay_key())} by {md.text(self.actor)}",
            f"filter: {md.code(criteria)}",
        ]
        if self.preview is not None:
            p = self.preview
            lines += [
                f"**dry run**: {p.matching} jobs match, {p.would_replay} would be replayed (limit "
                f"{self.selection.limit}); {p.at_replay_limit} more match but were replayed as often as allowed. "
                "Nothing changed.",
            ]
            if p.request is not None:
                lines.append(
                    f"The same replay was submitted before: {_said(p.request)}; applying it again changes "
                    "nothing (a new note makes a new replay)."
                )
            if p.jobs:
                lines += [
                    "",
                    f"the first {len(p.jobs)}:",
                    "",
                    *md.table(
                        ["job", "state", "reason", "error class", "source", "batch", "failed at", "replays"],
                        [
                            (
                                str(j.job_id),
                                j.status.value,
                                j.reason or "-",
                                j.error_class or "-",
                                j.source,
                                j.batch_key,
                                f"{j.failed_at:%Y-%m-%d %H:%M:%S %Z}",
                                str(j.replays),
                            )
                            for j in p.jobs
                        ],
                        code_columns=frozenset({0}),
                    ),
                ]
        if self.applied is not None:
            a = self.applied
            if a.outcome == "already_applied":
                lines.append(f"**already applied**: {_said(a.request)}. Nothing changed.")
            else:
                lines.append(
                    f"**applied**: {a.replayed_now} jobs replayed now ({a.request.replayed} by this replay in "
                    f"all), back to queued with a fresh attempt budget. Note: {md.text(a.request.note)}"
                )
                lines += [f"- {md.code(str(j))}" for j in a.job_ids[:LISTED_IDS]]
                if len(a.job_ids) > LISTED_IDS:
                    lines.append(
                        f"- … and {len(a.job_ids) - LISTED_IDS} more (job_events reason "
                        f"{md.code('replayed:' + a.replay_key)})"
                    )
        return "\n".join(lines)


def _said(request: ReplayRequest) -> str:
    when = f"{request.applied_at:%Y-%m-%d %H:%M:%S %Z}" if request.applied_at else "not finished yet"
    return f"by {md.text(request.requested_by)}, {request.replayed} jobs replayed, finished {when}"


def _request_dict(request: ReplayRequest | None) -> dict[str, Any] | None:
    if request is None:
        return None
    return {
        "requested_by": request.requested_by,
        "note": request.note,
        "replayed": request.replayed,
        "requested_at": request.requested_at.isoformat(),
        "applied_at": request.applied_at.isoformat() if request.applied_at else None,
    }


def run_replay(store: JobStore, selection: ReplayFilter, *, actor: str, max_replays: int = 3) -> ReplayReport:
    """The filter's preview when it is a dry run, else its apply (as ``actor``)."""
    if selection.dry_run:
        return ReplayReport(selection, actor, preview=store.review.preview_replay(selection, max_replays=max_replays))
    return ReplayReport(selection, actor, applied=store.review.replay(selection, actor=actor, max_replays=max_replays))
