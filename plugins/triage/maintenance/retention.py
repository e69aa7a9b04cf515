"""Apply a deployment's retention once: what ``triage_maintenance`` runs.

In order: the day partitions ahead are made (so no transition ever waits on this run), the
event sink's live file is rotated, then each kind is removed by its own rule and the result
says per kind how many rows or files went and how many bytes (the bytes of a dropped partition
are its table and indexes; of classifications none are claimed: vacuum hands their room to new
rows, the file does not shrink). Nothing open is removed: the database functions check
it for the ledger's rows, :func:`open_payload_names` for the payloads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from triage.jobs.store import JobStore
from triage.jobs.store.retention import PARTITIONED, LedgerRetention
from triage.maintenance import files
from triage.payload_refs import PayloadRefInvalid, parse_ref
from triage.payloads import PayloadStore
from triage.settings import Retention

log = logging.getLogger(__name__)


@dataclass
class KindResult:
    """One kind's removals: rows (or files), bytes, what was kept because open, and notes."""

    removed: int = 0
    bytes: int = 0
    kept_open: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class MaintenanceReport:
    started_at: str
    seconds: float = 0.0
    partitions_made: list[str] = field(default_factory=list)
    rows_in_default_partitions: int = 0
    rotated_event_file: str | None = None
    kinds: dict[str, KindResult] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """One line per kind, for the task log (ids and counts only)."""
        out = [
            f"partitions made: {len(self.partitions_made)}; rows in default partitions: {self.rows_in_default_partitions}"
        ]
        for kind, r in self.kinds.items():
            note = f" ({'; '.join(r.notes)})" if r.notes else ""
            out.append(f"{kind}: removed {r.removed}, {r.bytes} bytes, kept open {r.kept_open}{note}")
        return out


def _cutoff(now: datetime, days: float | None) -> datetime | None:
    return None if days is None else now - timedelta(days=days)


def open_payload_names(ledger: LedgerRetention, store: PayloadStore) -> set[str]:
    """The objects (packs) the open jobs' payloads live in."""
    names = set()
    for ref in ledger.open_payload_refs():
        try:
            names.add(parse_ref(ref, store.prefix).name)
        except PayloadRefInvalid:
            continue  # not this store's: nothing of ours to keep for it
    return names


def _partitions(ledger: LedgerRetention, table: str, before: datetime) -> KindResult:
    """``kept_open``: the day partitions kept whole because they hold open work."""
    result = KindResult()
    for outcome in ledger.drop_expired_partitions(table, before):
        result.removed += outcome.rows
        result.bytes += outcome.bytes
        if outcome.action == "kept_open":
            result.kept_open += 1
            result.notes.append(f"{outcome.partition} kept whole (open work)")
        elif outcome.dropped:
            result.notes.append(f"{outcome.partition} dropped")
    return result


def _classifications(ledger: LedgerRetention, before: datetime) -> KindResult:
    # Deleted rows leave room that vacuum hands to new rows; the file does not shrink, so no
    # bytes are claimed.
    return KindResult(removed=ledger.purge_classifications(before))


def _payloads(ledger: LedgerRetention, payload_base: str, before: datetime) -> KindResult:
    store = PayloadStore(payload_base)
    if not isinstance(store.base, Path):
        return KindResult(notes=[f"payload base {payload_base} is not local: leave it to the bucket's lifecycle rules"])
    threshold = before.timestamp()
    old = files.old_payload_packs(store.base, threshold)  # listed first, then the open refs read
    removed = files.remove_payload_packs(old, open_payload_names(ledger, store), threshold)
    return KindResult(removed.files, removed.bytes, removed.kept_open)


# The setting's name of each kind the database's policy governs (``triage.retention_policy``).
POLICY_KINDS = {
    "outbox": "outbox",
    "job_events": "job_events",
    "classifications": "classifications",
    "reports": "reconciliation_runs",
}


def _note_policy(report: MaintenanceReport, retention: Retention, policy: dict[str, float | None]) -> None:
    """Say so where the setting asked for less than the owner's policy keeps: the policy won."""
    for setting, kind in POLICY_KINDS.items():
        asked, kept = getattr(retention, setting), policy.get(kind)
        result = report.kinds.get(setting)
        if result is not None and asked is not None and (kept is None or kept > asked):
            keeps = "forever" if kept is None else f"{kept:g} days"
            result.notes.append(f"the database's retention policy keeps {kind} {keeps}, not {asked:g}")


def apply_retention(
    engine: sa.Engine,
    retention: Retention,
    *,
    payload_base: str,
    event_log: str,
    reports_dir: str,
    now: datetime | None = None,
) -> MaintenanceReport:
    """Apply ``retention`` once, as of ``now`` (the database's own clock floors what it drops)."""
    now = now or datetime.now(UTC)
    started = time.perf_counter()
    ledger = JobStore(engine).retention
    report = MaintenanceReport(started_at=now.isoformat(timespec="seconds"))
    report.partitions_made = ledger.ensure_partitions(retention.partitions_ahead)
    report.rows_in_default_partitions = ledger.rows_in_default_partitions()
    rotated = files.rotate_event_log(Path(event_log), now)
    report.rotated_event_file = str(rotated) if rotated else None

    for table in PARTITIONED:
        before = _cutoff(now, getattr(retention, table))
        if before is not None:
            report.kinds[table] = _partitions(ledger, table, before)
    if (before := _cutoff(now, retention.classifications)) is not None:
        report.kinds["classifications"] = _classifications(ledger, before)
    if (before := _cutoff(now, retention.payloads)) is not None:
        report.kinds["payloads"] = _payloads(ledger, payload_base, before)
    if (before := _cutoff(now, retention.event_files)) is not None:
        removed = files.remove_event_files(Path(event_log), before.timestamp())
        report.kinds["event_files"] = KindResult(removed.files, removed.bytes)
    if (before := _cutoff(now, retention.reports)) is not None:
        runs = ledger.purge_reconciliation_runs(before)
        pages = files.remove_reports(Path(reports_dir), before.timestamp())
        report.kinds["reports"] = KindResult(
            runs + pages.files, pages.bytes, notes=[f"{runs} runs, {pages.files} pages"]
        )
    _note_policy(report, retention, ledger.policy())
    report.seconds = round(time.perf_counter() - started, 3)
    for line in report.lines():
        log.info("retention: %s", line)
    return report
