"""The ``triage`` command of a checkout (``make setup`` installs it into ``.venv/bin``).

The product's commands (``status``, ``db url``, ``payload``, ``replay``, ``migrate``: :mod:`triage.cli`) run
unchanged, after an unset ``TRIAGE_DATABASE_URL`` has been resolved to the embedded PostgreSQL
and exported; the developer verbs (``run``, ``up``, ``stop``, ``chaos``, ...) are handed to the
tool module that implements them, with the rest of the command line. Where only the product is
installed (the image), ``python -m triage`` runs the product's commands and names these.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from collections.abc import Sequence

import argcomplete
from rich_argparse import RawDescriptionRichHelpFormatter

from triage import cli as product
from triage_tools.embedded import EmbeddedDatabaseError

DESCRIPTION = """\
Triage: AI classification work on Apache Airflow 3, with a PostgreSQL job ledger.

The job database is TRIAGE_DATABASE_URL; unset, it is the embedded PostgreSQL under
.triage/ (or $TRIAGE_HOME), started on first use. Every command honours both.
"""

EPILOG = """\
examples:
  triage status                                  jobs by state, open reviews by reason
  triage run --date 2026-11-01 --conf '{"documents": 5000}'
  triage up                                      Airflow with its UI on localhost:8080
  triage airflow dags list                       the Airflow CLI on this deployment
  triage payload 0b7c...                         a job's document, verified by its hash
  triage replay --reason retries_exhausted --since 2026-11-01   which failed jobs a replay takes
  triage replay --reason retries_exhausted --since 2026-11-01 --apply --note "model API back"
  triage chaos --help                            each command has its own help
"""

LOCAL_VERBS = ("up", "stop", "airflow", "prepare", "dags-test", "reset-secrets")
"""Verbs of :mod:`triage_tools.local`."""

DEVELOPER_VERBS: dict[str, tuple[str, str]] = {
    # verb: (the module whose main() takes the rest of the command line, its help line)
    "run": ("triage_tools.run", "classify one day, reconcile, print a summary (make run)"),
    "up": ("triage_tools.local", "Airflow in the background, UI on localhost:8080 (make up)"),
    "stop": ("triage_tools.local", "stop what up started and the embedded PostgreSQL"),
    "airflow": ("triage_tools.local", "the Airflow CLI on this deployment (./airflow.sh)"),
    "chaos": ("triage_tools.drill.chaos", "the failure drill, on a deployment of its own (make chaos)"),
    "distributed": ("triage_tools.distributed", "one day under CeleryExecutor (make distributed)"),
    "prepare": ("triage_tools.local", "migrations, Airflow's metadata DB, settings, if changed"),
    "dags-test": ("triage_tools.local", "one in-process DAG run (airflow dags test)"),
    "reset-secrets": ("triage_tools.local", "delete secrets that another Fernet key encrypted"),
    "schemas": ("triage_tools.schemas", "write the event schemas into include/schemas/ (make schemas); --check"),
}
"""Handed over whole (options included) to their module; ``env`` and ``db start|stop`` are here."""


class HelpFormatter(RawDescriptionRichHelpFormatter):
    """Airflow's own help formatter (rich-argparse, which the ``airflow`` command uses too), keeping
    the descriptions' line breaks and argparse's lower-case headings (``usage:``, ``options:``)."""

    group_name_formatter = str


def _richly(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` and every sub-command under it with :class:`HelpFormatter`: the sub-commands
    are built by the product (:func:`triage.cli.add_commands`), which carries no rich-argparse."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _richly(sub)
    return parser


def _parser() -> argparse.ArgumentParser:
    top = product.parser(description=DESCRIPTION, epilog=EPILOG)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    db_actions = product.add_commands(commands)
    db_actions.add_parser("start", help="start the embedded PostgreSQL and print its URL")
    db_actions.add_parser("stop", help="stop the embedded PostgreSQL")
    for verb, (_, help_line) in DEVELOPER_VERBS.items():
        commands.add_parser(verb, help=help_line, add_help=False)  # parsed by its own module
    commands.add_parser("env", help="shell exports to run Airflow on this deployment")
    return _richly(top)


def main(argv: Sequence[str] | None = None) -> int:
    """The console script ``triage``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in DEVELOPER_VERBS:
            module = importlib.import_module(DEVELOPER_VERBS[argv[0]][0])
            if argv[0] in LOCAL_VERBS:
                code: int = module.main(argv, prog="triage")
            else:
                code = module.main(argv[1:], prog=f"triage {argv[0]}")
            return code
        top = _parser()
        # Shell completion (``eval "$(register-python-argcomplete triage)"``): when the shell asks,
        # this prints the candidates and exits; otherwise it returns at once.
        argcomplete.autocomplete(top)
        args = top.parse_args(argv)
        if args.command == "db" and args.db_action in ("start", "stop"):
            return _db(args.db_action)
        if args.command == "env":
            return _env()
        return _product(args)
    except (ModuleNotFoundError, EmbeddedDatabaseError) as exc:  # the embedded server is a dev requirement
        cause = exc if isinstance(exc, ModuleNotFoundError) else exc.__cause__
        if not isinstance(cause, ModuleNotFoundError):  # data of another major version, say
            print(f"triage: {exc}", file=sys.stderr)
            return 2
        missing = cause.name or str(cause)
        print(
            f"triage: the Python package {missing} is missing here: run make setup in the checkout "
            "(or export TRIAGE_DATABASE_URL to use a database of your own)",
            file=sys.stderr,
        )
        return 2


def _product(args: argparse.Namespace) -> int:
    from triage_tools.deployment import ensure_worker_login, export_job_database, is_embedded

    embedded = is_embedded()
    url = export_job_database()
    code = product.run_command(args)
    if code == 0 and args.command == "migrate" and embedded:
        ensure_worker_login(url)
    return code


def _db(action: str) -> int:
    from triage.database import TRIAGE_DATABASE
    from triage_tools import embedded
    from triage_tools.deployment import is_embedded

    if not is_embedded():
        print("TRIAGE_DATABASE_URL is set: nothing embedded to start or stop")
        return 0
    if action == "start":
        print(embedded.start().with_database(TRIAGE_DATABASE).libpq())
        return 0
    print("embedded PostgreSQL stopped" if embedded.stop() else "embedded PostgreSQL was not running")
    return 0


def _env() -> int:
    from triage_tools.deployment import airflow_environment

    for key, value in airflow_environment().items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
