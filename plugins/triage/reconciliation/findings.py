"""What a rule returns: findings (observed), repairs (done), conflicts (for a human), or a
reason it was skipped. Frozen, and JSON-ready through :meth:`RuleResult.as_dict`."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from triage.jobs.sql.reads.checks import SAMPLE


def sample(ids: Iterable[uuid.UUID | str]) -> tuple[str, ...]:
    return tuple(str(i) for i in list(ids)[:SAMPLE])


@dataclass(frozen=True, slots=True)
class Finding:
    """Something the rule saw: ``count`` jobs (or events) in the condition ``check``.

    :param repair: the repair that applies to it, or None when it is only reported.
    """

    check: str
    count: int
    detail: str
    job_ids: tuple[str, ...] = ()
    repair: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Repair:
    """A change the rule made, through allowed transitions and fenced statements."""

    action: str
    count: int
    detail: str
    job_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Conflict:
    """A disagreement no rule can settle with certainty: a human decides."""

    check: str
    count: int
    detail: str
    job_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RuleResult:
    rule: str
    findings: tuple[Finding, ...] = ()
    repairs: tuple[Repair, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    skipped: str | None = None  # why the rule did not run (a degraded path), or None

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "skipped": self.skipped,
            "findings": [_entry(f) for f in self.findings],
            "repairs": [_entry(r) for r in self.repairs],
            "conflicts": [_entry(c) for c in self.conflicts],
        }


def _entry(item: Finding | Repair | Conflict) -> dict[str, Any]:
    out = {f.name: getattr(item, f.name) for f in fields(item)}
    out["job_ids"] = list(out["job_ids"])
    if "data" in out:
        out["data"] = dict(out["data"])
    return out
