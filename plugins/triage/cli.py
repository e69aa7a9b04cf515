"""``python -m triage``: the job database from the shell, without Airflow.

    python -m triage db start|stop|url      the embedded PostgreSQL (or TRIAGE_DATABASE_URL)
    python -m triage migrate [--to REV]     apply the job-table migrations (or downgrade)
    python -m triage status                 the ledger: jobs by state, open reviews by reason
    python -m triage env                    shell exports for running Airflow on this deployment
    python -m triage payload JOB_ID         a job's document, read through its payload_ref from
                                            the payload base only (--payload-base, else
                                            TRIAGE_PAYLOAD_BASE, else $TRIAGE_HOME/payloads) and
                                            verified by its hash (for reviewers; never logged)

Every command honours ``TRIAGE_DATABASE_URL``; unset means the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from triage import embedded
from triage.database import AIRFLOW_DATABASE, TRIAGE_DATABASE, DatabaseUrl, configured_url, create_engine

log = logging.getLogger("triage.cli")


def job_database() -> DatabaseUrl:
    """The job database: ``TRIAGE_DATABASE_URL`` as given, else the embedded server's ``triage``."""
    configured = configured_url()
    if configured is not None:
        return configured
    return embedded.start().with_database(TRIAGE_DATABASE)


def migrate_job_database(url: DatabaseUrl, to: str = "head") -> None:
    """Apply the job-table migrations; on the embedded server also make the DAGs' login role."""
    from triage import migrations

    migrations.upgrade(url, to)
    if configured_url() is None:
        from triage.roles import ensure_worker_role

        ensure_worker_role(url)


def airflow_environment() -> dict[str, str]:
    """What Airflow needs to run on this deployment: its home, its metadata DB, ``triage_db``.

    With ``TRIAGE_DATABASE_URL`` set, Airflow's metadata DB is taken from
    ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` if given, else the ``airflow`` database on the same
    server; otherwise both live in the embedded server.
    """
    import os

    from triage.roles import worker_url

    home = embedded.triage_home()
    jobs_db = job_database()
    # Embedded: the DAGs connect as the least-privilege role (rows only; see triage.roles).
    # With TRIAGE_DATABASE_URL the connection is taken as given: point AIRFLOW_CONN_TRIAGE_DB
    # at a member of triage_app yourself (docker-compose does).
    dags_db = worker_url(jobs_db) if configured_url() is None else jobs_db
    env = {
        "TRIAGE_HOME": str(home),
        "AIRFLOW_HOME": str(home / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(embedded.project_root() / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(embedded.project_root() / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_TRIAGE_DB": dags_db.airflow_connection_json(),
        "TRIAGE_DATABASE_URL": jobs_db.libpq(),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(embedded.project_root() / "plugins"), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    metadata = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
    if not metadata:
        if configured_url() is not None:  # the embedded server made the airflow database already
            embedded.ensure_databases(jobs_db.with_database("postgres"), (AIRFLOW_DATABASE,))
        metadata = jobs_db.with_database(AIRFLOW_DATABASE).airflow_metadata_url()
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = metadata
    return env


def status_report(url: DatabaseUrl) -> str:
    """Jobs by state and open reviews by reason, as a small table."""
    from triage.jobs.schema import jobs, manual_review
    from triage.jobs.states import JobStatus

    engine = create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            by_state: dict[str, int] = dict(
                conn.execute(sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status)).tuples().all()
            )
            reasons = conn.execute(
                sa.select(manual_review.c.reason, sa.func.count())
                .where(manual_review.c.resolved_at.is_(None))
                .group_by(manual_review.c.reason)
                .order_by(sa.func.count().desc())
            ).all()
    finally:
        engine.dispose()
    lines = [f"job ledger at {url.libpq_redacted()}", "", f"{'state':<18}{'jobs':>10}"]
    lines += [f"{s.value:<18}{by_state.get(s.value, 0):>10}" for s in JobStatus]
    lines.append(f"{'total':<18}{sum(by_state.values()):>10}")
    if reasons:
        lines += ["", f"{'open review reason':<28}{'jobs':>10}"]
        lines += [f"{reason:<28}{n:>10}" for reason, n in reasons]
    return "\n".join(lines)


def job_payload(url: DatabaseUrl, job_id: str, payload_base: str | None = None) -> bytes:
    """The document of job ``job_id``, read from the payload base (``payload_base``, else the
    deployment's: :func:`triage.settings.payload_base`) and verified against its content hash.
    A ``payload_ref`` outside that base is refused, never followed: the row is data.

    :raises LookupError: no such job.
    :raises triage.payloads.PayloadError: the reference is not the store's, or the payload is
        missing or does not match its hash.
    """
    from triage import settings
    from triage.jobs.schema import jobs
    from triage.payloads import read_payload

    try:
        wanted = uuid.UUID(job_id)
    except ValueError:
        raise LookupError(f"{job_id!r} is not a job id (a UUID)") from None
    engine = create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            row = conn.execute(sa.select(jobs.c.payload_ref, jobs.c.content_sha256).where(jobs.c.id == wanted)).first()
    finally:
        engine.dispose()
    if row is None:
        raise LookupError(f"no job {job_id}")
    return read_payload(row.payload_ref, row.content_sha256, settings.payload_base(payload_base))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    db = commands.add_parser("db", help="the embedded PostgreSQL")
    db.add_argument("action", choices=["start", "stop", "url"])
    db.add_argument("--form", choices=["libpq", "sqlalchemy", "airflow-conn"], default="libpq")
    migrate = commands.add_parser("migrate", help="apply the job-table migrations")
    migrate.add_argument("--to", default="head", help="target revision (head, base, or an id)")
    commands.add_parser("status", help="jobs by state and open reviews")
    commands.add_parser("env", help="shell exports for Airflow on this deployment")
    payload = commands.add_parser("payload", help="print a job's document, verified by its hash")
    payload.add_argument("job_id")
    payload.add_argument("--payload-base", help="the payload store (default: TRIAGE_PAYLOAD_BASE, "
                         "else $TRIAGE_HOME/payloads); references outside it are refused")  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for chatty in ("pgserver", "alembic.runtime.plugins", "alembic.runtime.migration"):
        logging.getLogger(chatty).setLevel(logging.WARNING)

    if args.command == "db":
        if args.action == "stop":
            if configured_url() is not None:
                print("TRIAGE_DATABASE_URL is set: nothing embedded to stop")
                return 0
            print("embedded PostgreSQL stopped" if embedded.stop() else "embedded PostgreSQL was not running")
            return 0
        url = job_database()
        form = {"libpq": url.libpq, "sqlalchemy": url.airflow_metadata_url,
                "airflow-conn": url.airflow_connection_json}[args.form]  # fmt: skip
        print(form())
        return 0
    if args.command == "migrate":
        from triage import migrations

        url = job_database()
        before = migrations.current_revision(url)
        if args.to == "base" or (before is not None and args.to not in ("head", before) and args.to < before):
            migrations.downgrade(url, args.to)
        else:
            migrate_job_database(url, args.to)
        print(f"job tables at revision {migrations.current_revision(url)} (was {before}) in {url.libpq_redacted()}")
        return 0
    if args.command == "status":
        print(status_report(job_database()))
        return 0
    if args.command == "env":
        for key, value in airflow_environment().items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    if args.command == "payload":
        from triage.payloads import PayloadError

        try:
            document = job_payload(job_database(), args.job_id, args.payload_base)
        except (LookupError, PayloadError) as exc:
            print(f"python -m triage payload: {exc}", file=sys.stderr)
            return 1
        sys.stdout.buffer.write(document)
        sys.stdout.buffer.flush()
        return 0
    return 2  # pragma: no cover - argparse refuses unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
