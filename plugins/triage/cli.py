"""The product's commands: the job ledger from a shell, without Airflow and without the tools.

``python -m triage`` runs them wherever the package is (the image included); in a checkout, the
``triage`` command (:mod:`triage_tools.cli`, installed by ``make setup``) runs the same ones after
it has resolved the embedded database, plus the developer verbs. This module never starts a
database: the job database is ``TRIAGE_DATABASE_URL``, nothing else.
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from triage.database import DatabaseUrl, configured_url, create_engine

log = logging.getLogger("triage.cli")

PROG = "triage"
DISTRIBUTION = "triage"

DESCRIPTION = """\
The Triage job ledger from a shell: where its database is, what state its jobs are
in, a job's document, replaying failed jobs by filter, and the job-table migrations.

The job database is TRIAGE_DATABASE_URL, a libpq URL such as
  postgresql://user:password@host:5432/triage
  postgresql://postgres@/triage?host=/path/to/socket/dir
"""

EPILOG = """\
In a checkout, make setup installs the triage command with the developer verbs too
(run, up, stop, chaos, ...); there an unset TRIAGE_DATABASE_URL means the embedded
PostgreSQL under .triage/.
"""

PRODUCT_COMMANDS = frozenset({"status", "db", "payload", "replay", "migrate", "labels", "train", "models", "evaluate"})
"""What this module runs; :mod:`triage_tools.cli` hands these over unchanged."""

DEVELOPER_COMMANDS = frozenset(
    {"run", "up", "stop", "env", "airflow", "chaos", "distributed", "prepare", "dags-test", "reset-secrets"}
)
"""The verbs of a checkout's ``triage`` command, named here only to say where they are."""


class NoJobDatabase(RuntimeError):
    """TRIAGE_DATABASE_URL is not set, and this command never starts a database itself."""


def version() -> str:
    """The installed distribution's version; the package's own when it is not installed (the
    image puts ``plugins/`` on ``PYTHONPATH`` instead of installing it)."""
    from importlib import metadata

    from triage import __version__

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return __version__


def job_database() -> DatabaseUrl:
    """The job database: ``TRIAGE_DATABASE_URL``.

    :raises NoJobDatabase: it is not set.
    """
    configured = configured_url()
    if configured is None:
        raise NoJobDatabase(
            "TRIAGE_DATABASE_URL is not set: export the job database's URL "
            "(in a checkout, .venv/bin/triage starts the embedded PostgreSQL instead)"
        )
    return configured


def migrate_job_database(url: DatabaseUrl, to: str = "head") -> tuple[str | None, str | None]:
    """Move the job tables to revision ``to`` (``head``, ``base`` or an id): upgrade, or
    downgrade when ``to`` is older than the current one. Returns (before, after)."""
    from triage import migrations

    before = migrations.current_revision(url)
    if to == "base" or (before is not None and to not in ("head", before) and to < before):
        migrations.downgrade(url, to)
    else:
        migrations.upgrade(url, to)
    return before, migrations.current_revision(url)


def status_report(url: DatabaseUrl) -> str:
    """Jobs by state and open reviews by reason, as a small table."""
    from triage.jobs.store import JobStore
    from triage.jobs.vocabulary.states import JobStatus

    engine = create_engine(url, poolclass=sa.NullPool)
    try:
        store = JobStore(engine)
        by_state = {status.value: n for status, n in store.status_counts().items()}
        reasons = store.open_review_reasons()
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
    from triage.jobs.store import JobStore
    from triage.payloads import read_payload

    try:
        wanted = uuid.UUID(job_id)
    except ValueError:
        raise LookupError(f"{job_id!r} is not a job id (a UUID)") from None
    engine = create_engine(url, pool_size=1)
    try:
        found = JobStore(engine).payload_of(wanted)
    finally:
        engine.dispose()
    if found is None:
        raise LookupError(f"no job {job_id}")
    payload_ref, content_sha256 = found
    return read_payload(payload_ref, content_sha256, settings.payload_base(payload_base))


def replay(url: DatabaseUrl, args: argparse.Namespace, prog: str = PROG) -> int:
    """``triage replay``: the filter of ``args`` previewed, or applied with ``--apply``, as the
    operating-system user (as ``airflow dags trigger`` names the triggering user)."""
    import getpass
    import json

    from triage.contracts.replay import InvalidReplayFilter, ReplayFilter
    from triage.jobs.store import JobStore
    from triage.review.replay import run_replay

    given = {
        "reason": args.reason,
        "error_class": args.error_class,
        "states": args.states or ["manual_review"],
        "source": args.source,
        "batch_key": args.batch,
        "since": args.since,
        "until": args.until,
        "limit": args.limit,
        "dry_run": not args.apply,
        "note": args.note,
    }
    try:
        selection = ReplayFilter.parse(given)
    except InvalidReplayFilter as exc:
        print(f"{prog} replay: {exc}", file=sys.stderr)
        return 2
    engine = create_engine(url, pool_size=1)
    try:
        report = run_replay(JobStore(engine), selection, actor=getpass.getuser(), max_replays=args.max_replays)
    finally:
        engine.dispose()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.to_markdown())
    return 0


def _add_replay(commands: Any) -> None:
    from triage.contracts.replay import DEFAULT_REPLAY_LIMIT, MAX_REPLAY_LIMIT, REPLAY_STATES

    replay_cmd = commands.add_parser(
        "replay",
        help="requeue failed jobs selected by a filter (a dry run unless --apply)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Requeue the manual_review (and, with --state terminal_failed, terminal_failed) jobs\n"
        "that the filter selects, as fresh jobs. Without --apply it only says how many match\n"
        "and which (the first 25), and changes nothing. With --apply (and a --note saying why)\n"
        "it moves them through the state machine in batches, as your user; the same filter and\n"
        "note again changes nothing and says 'already applied'.",
    )
    replay_cmd.add_argument("--reason", help="the review reason or status reason, e.g. retries_exhausted")
    replay_cmd.add_argument("--error-class", help="the last error class, e.g. ModelTimeout")
    replay_cmd.add_argument(
        "--state",
        dest="states",
        action="append",
        choices=REPLAY_STATES,
        help="a state to take jobs from (repeatable; default manual_review)",
    )
    replay_cmd.add_argument("--source", help="the jobs' source, e.g. synthetic")
    replay_cmd.add_argument("--batch", help="the jobs' batch (a run's data interval, as in the report)")
    # --from/--to and --dry-run: the spelling of DESIGN.md's command line
    replay_cmd.add_argument(
        "--since", "--from", dest="since", metavar="TIME", help="failed at or after (ISO date or time; UTC by default)"
    )
    replay_cmd.add_argument(
        "--until", "--to", dest="until", metavar="TIME", help="failed before (ISO date or time; UTC by default)"
    )
    replay_cmd.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_REPLAY_LIMIT,
        help=f"at most this many jobs (default {DEFAULT_REPLAY_LIMIT}, at most {MAX_REPLAY_LIMIT})",
    )
    replay_cmd.add_argument(
        "--max-replays",
        type=int,
        default=3,
        choices=range(1, 21),
        metavar="N",
        help="leave alone jobs already replayed N times (default 3)",
    )
    mode = replay_cmd.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run", action="store_false", dest="apply", default=False, help="only say what would happen (the default)"
    )
    mode.add_argument("--apply", action="store_true", help="replay them")
    replay_cmd.add_argument("--note", help="why (required with --apply); ids and reasons only, never document text")
    replay_cmd.add_argument("--json", action="store_true", help="print the report as JSON")


# ---------------------------------------------------------------------------------------------
# the command line


def parser(prog: str = PROG, description: str = DESCRIPTION, epilog: str = EPILOG) -> argparse.ArgumentParser:
    """The top-level parser, with ``--version``; add the commands with :func:`add_commands`."""
    top = argparse.ArgumentParser(
        prog=prog, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    return top


def add_commands(commands: Any) -> Any:
    """Add the product's commands to ``commands`` (``ArgumentParser.add_subparsers()``).
    Returns the sub-commands of ``db``, where the tools add ``start`` and ``stop``."""
    raw = argparse.RawDescriptionHelpFormatter
    commands.add_parser(
        "status",
        help="jobs by state and open reviews by reason",
        formatter_class=raw,
        description="Jobs by state and open manual reviews by reason, for the whole ledger.",
    )
    db = commands.add_parser(
        "db", help="where the job database is", formatter_class=raw, description="Where the job database is."
    )
    db_actions = db.add_subparsers(dest="db_action", required=True, metavar="ACTION")
    url = db_actions.add_parser(
        "url",
        help="print its URL",
        formatter_class=raw,
        description="Print the job database's URL, in the form a tool needs.",
    )
    url.add_argument(
        "--form",
        choices=["libpq", "sqlalchemy", "airflow-conn"],
        default="libpq",
        help="libpq (psql, TRIAGE_DATABASE_URL; the default), sqlalchemy "
        "(AIRFLOW__DATABASE__SQL_ALCHEMY_CONN) or airflow-conn (AIRFLOW_CONN_TRIAGE_DB, JSON)",
    )
    payload = commands.add_parser(
        "payload",
        help="print a job's document, verified by its hash",
        formatter_class=raw,
        description="Print the document of job JOB_ID (for reviewers; it is never logged).\n\n"
        "It is read through the job's payload_ref from the payload base only, and\n"
        "checked against the job's content hash; a reference outside the base is refused.",
    )
    payload.add_argument("job_id", metavar="JOB_ID", help="the job's id (a UUID)")
    payload.add_argument(
        "--payload-base",
        metavar="DIR_OR_URL",
        help="the payload store (default: TRIAGE_PAYLOAD_BASE, else $TRIAGE_HOME/payloads)",
    )
    _add_replay(commands)
    migrate = commands.add_parser(
        "migrate",
        help="apply the job-table migrations",
        formatter_class=raw,
        description="Move the job tables to a revision: upgrade to it, or downgrade\n"
        "when it is older than the current one.",
    )
    migrate.add_argument("--to", default="head", metavar="REVISION", help="head (the default), base, or a revision id")
    from triage.learning import commands as learning

    learning.add_commands(commands)
    return db_actions


def run_command(args: argparse.Namespace, prog: str = PROG) -> int:
    """Run the product command ``args`` parsed; its exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for chatty in ("alembic.runtime.plugins", "alembic.runtime.migration"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        url = job_database()
    except NoJobDatabase as exc:
        print(f"{prog} {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.command == "db":
        form = {
            "libpq": url.libpq,
            "sqlalchemy": url.airflow_metadata_url,
            "airflow-conn": url.airflow_connection_json,
        }[args.form]
        print(form())
        return 0
    if args.command == "migrate":
        before, after = migrate_job_database(url, args.to)
        print(f"job tables at revision {after} (was {before}) in {url.libpq_redacted()}")
        return 0
    if args.command == "status":
        print(status_report(url))
        return 0
    if args.command == "replay":
        return replay(url, args, prog)
    from triage.learning import commands as learning

    if args.command in learning.COMMANDS:
        return learning.run(args, url, prog)
    if args.command == "payload":
        from triage.payloads import PayloadError

        try:
            document = job_payload(url, args.job_id, args.payload_base)
        except (LookupError, PayloadError) as exc:
            print(f"{prog} payload: {exc}", file=sys.stderr)
            return 1
        sys.stdout.buffer.write(document)
        sys.stdout.buffer.flush()
        return 0
    raise ValueError(f"not a product command: {args.command}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m triage``: the product's commands only."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "python -m triage"
    if argv and argv[0] in DEVELOPER_COMMANDS:
        print(
            f"{prog}: {argv[0]!r} is a developer command of a checkout: run it as .venv/bin/triage "
            f"{argv[0]} there (make setup installs it). Here: {', '.join(sorted(PRODUCT_COMMANDS))}.",
            file=sys.stderr,
        )
        return 2
    top = parser(prog)
    add_commands(top.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return run_command(top.parse_args(argv), prog)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
