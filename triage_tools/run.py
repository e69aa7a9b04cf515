"""``make run``: one day through ``classify_documents`` on the local deployment, then
``reconcile_jobs``, then a summary; exits non-zero if a run failed.

    triage run [--date YYYY-MM-DD] [--conf '{"documents": 5000}'] [--verbose]

Quiet by default: a live line of the batch's jobs by state (:mod:`triage_tools.progress`) and
the summary on screen, Airflow's own output (some 600 lines for a day) in a log file whose path
is printed first; ``--verbose`` (``make run VERBOSE=1``) shows Airflow's output instead.

``--date`` names the day whose documents are processed (default: yesterday, UTC). Airflow's
``dags test`` runs a manual run whose data interval ends at its logical date, so the run is
started at DATE + 1 day to cover [DATE, DATE + 1 day).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from triage.database import DatabaseUrl, create_engine
from triage.jobs.sql.reads.batch_summary import batch_counts, batch_summary, format_summary
from triage.jobs.vocabulary.models import batch_key_for
from triage.reconciliation.runner import latest_run
from triage.settings import project_root
from triage_tools import local
from triage_tools.deploy.fernet import FernetKeyMismatch
from triage_tools.deployment import prepare
from triage_tools.progress import Counts, Progress
from triage_tools.warm import WarmAirflow


def day_interval(day: date) -> tuple[datetime, datetime]:
    """The data interval of ``classify_documents`` for ``day``: [00:00, 24:00) UTC."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start, start + timedelta(days=1)


def batch_key_of(day: date) -> str:
    return batch_key_for(*day_interval(day))


def day_run(run_id: str, day: date, conf: Mapping[str, Any]) -> dict[str, Any]:
    """The REST body (``POST /api/v2/dags/classify_documents/dagRuns``) of a run for ``day``."""
    start, end = day_interval(day)
    return {
        "dag_run_id": run_id,
        "logical_date": end.isoformat(),
        "data_interval_start": start.isoformat(),
        "data_interval_end": end.isoformat(),
        "conf": dict(conf),
    }


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

DATE's documents are the data interval [DATE, DATE + 1 day), UTC. While the runs
go, a line shows the batch's jobs by state; Airflow's own output goes to a log
file under $TRIAGE_HOME/logs, whose path is printed (--verbose: on screen instead).
"""

TICK = 1.0
"""Seconds between two looks at the ledger while a run goes."""
FAILURE_TAIL = 30
"""Lines of Airflow's log shown when a run failed."""


def run_log(home: Path, day: date) -> Path:
    """Where a ``make run`` keeps Airflow's output: one file per run, under ``$TRIAGE_HOME/logs``."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return home / "logs" / f"run-{day.isoformat()}-{stamp}.log"


def _ledger_counts(engine: sa.Engine, batch_key: str) -> Callable[[], Counts | None]:
    def counts() -> Counts | None:
        try:
            with engine.connect() as conn:
                return batch_counts(conn, batch_key)
        except sa.exc.OperationalError:  # the server restarts, or is busy: skip this look
            return None

    return counts


def _wait(airflow: WarmAirflow, progress: Progress | None) -> int:
    while True:
        code = airflow.wait(timeout=TICK)
        if code is not None:
            return code
        if progress is not None:
            progress.tick()


def main(argv: Sequence[str] | None = None, prog: str = "python -m triage_tools.run") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--date", default="", help="the day to process (default: yesterday, UTC)")
    parser.add_argument("--conf", default="{}", help="the run conf of classify_documents, as JSON")
    parser.add_argument("--verbose", action="store_true", help="Airflow's output on screen, not in a log file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        day, conf = day_and_conf(args.date, args.conf)
    except ValueError as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 2

    try:
        env = prepare()
    except FernetKeyMismatch as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 1
    engine = create_engine(DatabaseUrl.parse(env["TRIAGE_DATABASE_URL"]), poolclass=sa.NullPool)
    try:
        return _run(day, conf, env, engine, verbose=args.verbose)
    finally:
        engine.dispose()


def _run(day: date, conf: dict[str, Any], env: dict[str, str], engine: sa.Engine, *, verbose: bool) -> int:
    reconcile = (project_root() / "dags" / "reconcile_jobs.py").exists()
    runs = [("classify_documents", (day + timedelta(days=1)).isoformat(), conf)]
    if reconcile:
        runs.append(("reconcile_jobs", datetime.now(UTC).isoformat(timespec="seconds"), {}))
    log_path = None if verbose else run_log(Path(env["TRIAGE_HOME"]), day)
    progress = None if verbose else Progress(_ledger_counts(engine, batch_key_of(day)), sys.stdout)
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        print(f"Airflow's output: {log_path}", flush=True)

    started = datetime.now(UTC)
    failed = []
    # One Airflow start for both runs: each `airflow dags test` is a fork of a process that
    # imported Airflow and built the in-process Execution API once (triage_tools.warm).
    with WarmAirflow(env, log_path) as airflow:
        for dag_id, logical_date, run_conf in runs:
            if progress is not None:
                progress.start(dag_id)
            args = local.dags_test_args(dag_id, logical_date, run_conf)
            if log_path is None:
                print(f"triage: airflow {shlex.join(args)}", file=sys.stderr, flush=True)
            else:
                with open(log_path, "ab") as log:
                    log.write(f"==> airflow {shlex.join(args)} <==\n".encode())
            airflow.start(args, stdout=log_path, stderr=log_path, append=True)
            if _wait(airflow, progress) != 0:
                failed.append(dag_id)
        if progress is not None:
            progress.finish()

    with engine.connect() as conn:
        summary = batch_summary(conn, batch_key_of(day), since=started)
        report = conn.execute(latest_run()).first() if reconcile else None
    print()
    print(f"classify_documents for {day.isoformat()}: {'FAILED' if failed else 'succeeded'}")
    print(format_summary(summary))
    if report is not None and report.finished_at >= started:
        print(f"reconciliation report: {report.report_path}")
    if not failed:
        return 0
    if log_path is not None:
        tail = log_path.read_text(errors="replace").splitlines()[-FAILURE_TAIL:]
        print(f"\nthe last {len(tail)} lines of {log_path}:", *tail, sep="\n", file=sys.stderr)
    where = f"Airflow's output in {log_path}" if log_path is not None else "the task logs above"
    print(f"failed runs: {', '.join(failed)} (see {where})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
