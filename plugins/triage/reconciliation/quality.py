"""The Quality section of the reconciliation report: how well each classifier version labels, per
day, as far as the ledger can tell (issue #27, "quality in production"). Reads only.

- **coverage**: of the jobs a version classified, the share it auto-accepted;
- **audited precision**: of the audit samples reviewers decided (:mod:`triage.jobs.audit_samples`),
  the share they confirmed, with its 95 % Wilson score interval. Audit samples are a uniform
  sample of the accepted jobs, so this estimates the precision of every accepted label;
- **inconclusive agreement**: of the inconclusive jobs a reviewer resolved with a label, the share
  whose label was the model's proposal;
- **reviewers per day**: decisions, reviewers, and their agreement with the model's proposal on
  every label decision that had one (inconclusive jobs and audit samples).

Figures are JSON-ready (fractions in [0, 1], None where nothing was decided) and go into the
run's summary (:func:`triage.reconciliation.reporting.ledger_view`), so the Markdown, the HTML
page and the JSON never disagree; the trend over runs reads the quality totals earlier runs stored.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import cache
from typing import Any

import sqlalchemy as sa

from triage.jobs import quality_reads as Q
from triage.jobs.schema import reconciliation_runs as runs

WINDOW_DAYS = 14
"""Days back the figures cover (each run reads only these: the indexes of migration 0026)."""
TREND_RUNS = 30
"""Earlier runs the trend shows."""
Z_95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion ``successes / n`` (95 % by default): unlike
    p ± z·se, it stays within [0, 1] and is honest for small samples and proportions near 1,
    which is what audit samples of a good classifier are. None when ``n`` is 0."""
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within [0, {n}], got {successes}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _figures(counts: dict[str, int]) -> dict[str, Any]:
    """The shares and the interval of one row of counts."""
    decided = counts["confirmed"] + counts["corrected"]
    interval = wilson_interval(counts["confirmed"], decided)
    return {
        **counts,
        "coverage": _share(counts["accepted"], counts["classified"]),
        "audited": decided,
        "precision": _share(counts["confirmed"], decided),
        "precision_low": None if interval is None else round(interval[0], 6),
        "precision_high": None if interval is None else round(interval[1], 6),
        "inconclusive_agreement": _share(counts["inconclusive_agreed"], counts["inconclusive_labelled"]),
    }


COUNTS = ("classified", "accepted", "confirmed", "corrected", "inconclusive_labelled", "inconclusive_agreed")


@cache
def earlier_totals() -> sa.Select[Any]:
    """The quality totals of the latest ``:limit`` finished runs that stored them, oldest first."""
    totals = runs.c.summary["quality"]["totals"]
    newest = (
        sa.select(runs.c.id, runs.c.started_at, totals.label("totals"))
        .where(runs.c.finished_at.is_not(None), totals.is_not(None))
        .order_by(runs.c.id.desc())
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .subquery()
    )
    return sa.select(newest).order_by(newest.c.id)


def trend_point(run_id: Any, started_at: str, totals: dict[str, Any]) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "started_at": started_at,
        "coverage": totals.get("coverage"),
        "precision": totals.get("precision"),
        "inconclusive_agreement": totals.get("inconclusive_agreement"),
    }


def figures(conn: sa.Connection, *, days: int = WINDOW_DAYS, trend_runs: int = TREND_RUNS) -> dict[str, Any]:
    """The Quality section over the last ``days`` days, and the trend of earlier runs' totals."""
    params = {"days": days}
    rows: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: dict.fromkeys(COUNTS, 0))
    for r in conn.execute(Q.classified_by_version_day(), params):
        row = rows[r.version, r.day.isoformat()]
        row["classified"], row["accepted"] = int(r.classified), int(r.accepted)
    for r in conn.execute(Q.decisions_by_version_day(), params):
        row = rows[r.version, r.day.isoformat()]
        for name in ("confirmed", "corrected", "inconclusive_labelled", "inconclusive_agreed"):
            row[name] = int(getattr(r, name))
    versions: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COUNTS, 0))
    totals = dict.fromkeys(COUNTS, 0)
    for (version, _), counts in rows.items():
        for name, n in counts.items():
            versions[version][name] += n
            totals[name] += n
    open_samples = {r.version: int(r.open) for r in conn.execute(Q.open_audit_samples_by_version())}
    reviewers = [
        {
            "day": r.day.isoformat(),
            "decisions": int(r.decisions),
            "reviewers": int(r.reviewers),
            "decisions_per_reviewer": round(int(r.decisions) / int(r.reviewers), 1) if r.reviewers else None,
            "with_proposal": int(r.with_proposal),
            "agreed": int(r.agreed),
            "agreement": _share(int(r.agreed), int(r.with_proposal)),
        }
        for r in conn.execute(Q.reviewers_by_day(), params)
    ]
    trend = [
        trend_point(r.id, r.started_at.isoformat(), dict(r.totals))
        for r in conn.execute(earlier_totals(), {"limit": trend_runs})
    ]
    return {
        "window_days": days,
        "totals": {**_figures(totals), "audit_open": sum(open_samples.values())},
        "by_version": [
            {"version": v, **_figures(versions[v]), "audit_open": open_samples.get(v, 0)}
            for v in sorted(set(versions) | set(open_samples))
        ],
        "by_version_day": [
            {"version": version, "day": day, **_figures(counts)} for (version, day), counts in sorted(rows.items())
        ],
        "reviewers_by_day": reviewers,
        "trend": trend,
    }
