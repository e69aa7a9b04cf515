"""``make run``: one day through ``classify_documents`` on the local deployment, then
``reconcile_jobs``, then a summary; exits non-zero if a run failed.

    python -m triage_tools.run [--date YYYY-MM-DD] [--conf '{"documents": 5000}']

``--date`` names the day whose documents are processed (default: yesterday, UTC). Airflow's
``dags test`` runs a manual run whose data interval ends at its logical date, so the run is
started at DATE + 1 day to cover [DATE, DATE + 1 day).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from triage.database import DatabaseUrl, create_engine
from triage.jobs.models import batch_key_for
from triage.jobs.reads import batch_summary, format_summary
from triage.reconciliation.runner import latest_run
from triage.settings import project_root
from triage_tools import local
from triage_tools.deploy.fernet import FernetKeyMismatch


def day_interval(day: date) -> tuple[datetime, datetime]:
    """The data interval of ``classify_documents`` for ``day``: [00:00, 24:00) UTC."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start, start + timedelta(days=1)


def batch_key_of(day: date) -> str:
    return batch_key_for(*day_interval(day))


def day_run(run_id: str, day: date, conf: Mapping[str, Any]) -> dict[str, Any]:
    """The REST body (``POST /api/v2/dags/classify_documents/dagRuns``) of a run for ``day``."""
    start, end = day_interval(day)
    return {"dag_run_id": run_id, "logical_date": end.isoformat(), "data_interval_start": start.isoformat(),
            "data_interval_end": end.isoformat(), "conf": dict(conf)}  # fmt: skip


def day_and_conf(day_arg: str, conf_arg: str) -> tuple[date, dict[str, Any]]:
    """``DATE`` (default yesterday, UTC) and ``CONF`` (a JSON object) of a make target.

    :raises ValueError: a malformed date or JSON, or JSON that is not an object.
    """
    day = date.fromisoformat(day_arg) if day_arg else datetime.now(UTC).date() - timedelta(days=1)
    conf = json.loads(conf_arg or "{}")
    if not isinstance(conf, dict):
        raise ValueError("CONF must be a JSON object")
    return day, conf


DESCRIPTION = """\
One day through classify_documents on the local deployment, then reconcile_jobs,
then a summary; the exit code is 1 if a run failed (make run).

DATE's documents are the data interval [DATE, DATE + 1 day), UTC.
"""


def main(argv: Sequence[str] | None = None, prog: str = "python -m triage_tools.run") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--date", default="", help="the day to process (default: yesterday, UTC)")
    parser.add_argument("--conf", default="{}", help="the run conf of classify_documents, as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        day, conf = day_and_conf(args.date, args.conf)
    except ValueError as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 2

    failed = []
    try:
        env = local.prepare()
    except FernetKeyMismatch as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 1
    started = datetime.now(UTC)
    code = local.dags_test("classify_documents", (day + timedelta(days=1)).isoformat(), conf, env=env)
    if code != 0:
        failed.append("classify_documents")
    reconcile = (project_root() / "dags" / "reconcile_jobs.py").exists()
    if reconcile and local.dags_test("reconcile_jobs", datetime.now(UTC).isoformat(timespec="seconds"),
                                     env=env) != 0:  # fmt: skip
        failed.append("reconcile_jobs")

    engine = create_engine(DatabaseUrl.parse(env["TRIAGE_DATABASE_URL"]), poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            summary = batch_summary(conn, batch_key_of(day), since=started)
            report = conn.execute(latest_run()).first() if reconcile else None
    finally:
        engine.dispose()
    print()
    print(f"classify_documents for {day.isoformat()}: {'FAILED' if failed else 'succeeded'}")
    print(format_summary(summary))
    if report is not None and report.finished_at >= started:
        print(f"reconciliation report: {report.report_path}")
    if failed:
        print(f"failed runs: {', '.join(failed)} (see the task logs above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
