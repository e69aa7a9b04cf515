"""``airflow_settings.yaml``: the connections, pools and variables Triage needs from Airflow.

The file uses Astronomer's format (``airflow: {connections, pools, variables}``). This module
loads it into frozen pydantic models, refusing anything malformed with a :class:`SettingsError`
that names the offending entry, and turns it into Airflow CLI invocations:

- connections: one ``airflow connections import FILE --overwrite``. ``connections add`` has no
  overwrite option in Airflow 3.3 and ``connections delete`` exits non-zero when the connection is
  missing, so import is the only idempotent form; it also keeps passwords out of argv (visible
  to every user through ``ps``). :func:`connections_import_json` is that file's content.
- pools: ``airflow pools set NAME SLOTS DESCRIPTION`` (creates or updates).
- variables: ``airflow variables set KEY VALUE`` (creates or updates).

``${NAME}`` and ``${NAME:-default}`` in string values are replaced from the environment at load
time; ``$$`` is a literal ``$``. Entries that an ``AIRFLOW_CONN_*`` / ``AIRFLOW_VAR_*``
environment variable shadows (Airflow reads the environment before its metadata DB) can be
dropped with :func:`without_environment_overrides`, so the metadata DB never holds a copy that
is not the one in use.

Run as ``python -m triage_tools.deploy.airflow_settings FILE [--dry-run]``. It drives the ``airflow``
command; when that command is this interpreter's (``python -m airflow``, as ``make up`` and ``make
run`` pass it), the same CLI commands run one after another in this process (:func:`in_process`):
one start of Airflow instead of one per command, which is most of what a command costs (~3 CPU-s
here, importing Airflow). Otherwise (``airflow``, ``./airflow.sh``) each is a process of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

DEFAULT_AIRFLOW_COMMAND: tuple[str, ...] = ("airflow",)

# Airflow's own rule for connection ids and variable keys (airflow.utils.helpers.validate_key).
_KEY_PATTERN = r"^[\w.-]+$"


class SettingsError(ValueError):
    """The settings file cannot be read, or does not describe valid Airflow objects."""


def _reject_bool(value: Any) -> Any:
    # YAML `yes`/`true` would otherwise pass as the integer 1.
    if isinstance(value, bool):
        raise ValueError("expected an integer, not a boolean")
    return value


def _none_as_empty(value: Any) -> Any:
    # `connections:` with nothing under it loads as None.
    return () if value is None else value


_Key = Annotated[str, StringConstraints(pattern=_KEY_PATTERN, max_length=200)]
_NonEmpty = Annotated[str, StringConstraints(min_length=1)]
_Int = Annotated[int, BeforeValidator(_reject_bool)]


class _Setting(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConnectionSetting(_Setting):
    """One Airflow connection; ``conn_schema`` is the database name for ``postgres``."""

    conn_id: _Key
    conn_type: _NonEmpty
    conn_host: str | None = None
    conn_schema: str | None = None
    conn_login: str | None = None
    conn_password: SecretStr | None = None
    conn_port: Annotated[_Int, Field(ge=1, le=65535)] | None = None
    conn_extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("conn_extra", mode="before")
    @classmethod
    def _extra_from_json(cls, value: Any) -> Any:
        """Accept the JSON-string form Airflow itself uses for ``extra``."""
        if value is None:
            return {}
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f"not valid JSON: {exc.msg}") from None
        return value

    def env_var(self) -> str:
        """The environment variable that overrides this connection."""
        return f"AIRFLOW_CONN_{self.conn_id.upper()}"


class PoolSetting(_Setting):
    """One Airflow pool; ``-1`` slots is Airflow's unlimited pool."""

    pool_name: _NonEmpty
    pool_slot: Annotated[_Int, Field(ge=-1)]
    pool_description: str = ""


class VariableSetting(_Setting):
    """One Airflow variable, stored as the string given (quote numbers in YAML)."""

    variable_name: _Key
    variable_value: str

    def env_var(self) -> str:
        """The environment variable that overrides this variable."""
        return f"AIRFLOW_VAR_{self.variable_name.upper()}"


class AirflowSettings(_Setting):
    """The ``airflow:`` section: each id, pool name and variable key at most once."""

    connections: Annotated[tuple[ConnectionSetting, ...], BeforeValidator(_none_as_empty)] = ()
    pools: Annotated[tuple[PoolSetting, ...], BeforeValidator(_none_as_empty)] = ()
    variables: Annotated[tuple[VariableSetting, ...], BeforeValidator(_none_as_empty)] = ()

    @model_validator(mode="after")
    def _unique_names(self) -> AirflowSettings:
        for section, names in (
            ("connections", [c.conn_id for c in self.connections]),
            ("pools", [p.pool_name for p in self.pools]),
            ("variables", [v.variable_name for v in self.variables]),
        ):
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise ValueError(f"{section}: duplicate names {duplicates}")
        return self

    def connection(self, conn_id: str) -> ConnectionSetting:
        """The connection ``conn_id``; :class:`KeyError` if the file has none."""
        for conn in self.connections:
            if conn.conn_id == conn_id:
                return conn
        raise KeyError(conn_id)


class _SettingsFile(_Setting):
    airflow: AirflowSettings


# `$$`, `${NAME}`, `${NAME:-default}`; any other `${` is an error rather than left as text.
_PLACEHOLDER = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_]\w*)(?::-(?P<default>[^}]*))?\}|(?P<bad>\{))")


def _interpolate(value: Any, environ: Mapping[str, str], where: str) -> Any:
    """Replace placeholders in every string of a loaded YAML tree (values only, not keys)."""
    if isinstance(value, dict):
        return {key: _interpolate(item, environ, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [_interpolate(item, environ, f"{where}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        if match["bad"]:
            raise SettingsError(f"{where}: malformed placeholder; use ${{NAME}}, ${{NAME:-default}} or $$")
        name = match["name"]
        if name in environ:
            return environ[name]
        if match["default"] is not None:
            return match["default"]
        raise SettingsError(f"{where}: environment variable {name} is not set and has no default")

    return _PLACEHOLDER.sub(substitute, value)


def _describe(error: ValidationError) -> str:
    # Never include the input: it may be a password.
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in item["loc"])
        lines.append(f"{where.lstrip('.') or '(file)'}: {item['msg']}")
    return "; ".join(lines)


def load_airflow_settings(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> AirflowSettings:
    """Read and validate an ``airflow_settings.yaml``.

    :param path: the file.
    :param environ: where ``${NAME}`` placeholders are looked up; :data:`os.environ` by default.
    :raises SettingsError: unreadable file, invalid YAML, unset placeholder, or invalid content.
    """
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(document, dict):
        raise SettingsError(f"{path}: expected a mapping with an `airflow:` key")
    try:
        document = _interpolate(document, os.environ if environ is None else environ, "")
    except SettingsError as exc:
        raise SettingsError(f"{path}: {str(exc).lstrip('.')}") from None
    try:
        return _SettingsFile.model_validate(document).airflow
    except ValidationError as exc:
        raise SettingsError(f"{path}: {_describe(exc)}") from None


def without_environment_overrides(settings: AirflowSettings, environ: Mapping[str, str]) -> AirflowSettings:
    """Drop the connections and variables that ``AIRFLOW_CONN_*``/``AIRFLOW_VAR_*`` in ``environ`` shadow."""
    return settings.model_copy(
        update={
            "connections": tuple(c for c in settings.connections if c.env_var() not in environ),
            "variables": tuple(v for v in settings.variables if v.env_var() not in environ),
        }
    )


def connections_import_json(settings: AirflowSettings) -> str:
    """The ``airflow connections import`` file for the connections (contains passwords)."""
    document: dict[str, dict[str, Any]] = {}
    for conn in settings.connections:
        fields: dict[str, Any] = {
            "conn_type": conn.conn_type,
            "host": conn.conn_host,
            "schema": conn.conn_schema,
            "login": conn.conn_login,
            "password": conn.conn_password.get_secret_value() if conn.conn_password else None,
            "port": conn.conn_port,
            "extra": json.dumps(conn.conn_extra) if conn.conn_extra else None,
        }
        document[conn.conn_id] = {key: value for key, value in fields.items() if value is not None}
    return json.dumps(document, indent=2, sort_keys=True)


def apply_commands(
    settings: AirflowSettings,
    *,
    connections_file: str | os.PathLike[str],
    airflow: Sequence[str] = DEFAULT_AIRFLOW_COMMAND,
) -> list[list[str]]:
    """The Airflow CLI invocations that make the metadata DB match ``settings``; each is idempotent.

    :param connections_file: where the caller writes :func:`connections_import_json` before
        running the commands; it must end in ``.json`` (Airflow picks the parser by extension).
        Unused when there are no connections.
    :param airflow: the command that runs the Airflow CLI, e.g. ``("./airflow.sh",)``.
    """
    if settings.connections and Path(connections_file).suffix != ".json":
        raise ValueError(f"connections_file must end in .json: {connections_file}")
    base = list(airflow)
    commands: list[list[str]] = []
    if settings.connections:
        commands.append([*base, "connections", "import", os.fspath(connections_file), "--overwrite"])
    for pool in settings.pools:
        commands.append([*base, "pools", "set", pool.pool_name, str(pool.pool_slot), pool.pool_description])
    for variable in settings.variables:
        commands.append([*base, "variables", "set", variable.variable_name, variable.variable_value])
    return commands


def in_process(airflow: Sequence[str]) -> Callable[[list[str]], None] | None:
    """A runner of ``airflow ARGS`` commands in this process, with Airflow's own CLI entry point
    (``airflow.__main__.main``), when ``airflow`` is this interpreter's Airflow; else None.

    A command that exits non-zero (``SystemExit``, as Airflow's CLI does on an error) or raises
    raises :class:`subprocess.CalledProcessError` with its exit code, as ``subprocess.run(...,
    check=True)`` would; its message or traceback goes to stderr, as a process's would."""
    if list(airflow) != [sys.executable, "-m", "airflow"]:
        return None

    def run(argv: list[str]) -> None:
        import traceback

        from airflow.__main__ import main as airflow_main

        saved, sys.argv = sys.argv, ["airflow", *argv[len(airflow) :]]
        code: int = 0
        try:
            airflow_main()
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:  # noqa: BLE001  (a process would print it and exit 1)
            traceback.print_exc()
            code = 1
        finally:
            sys.argv = saved
            sys.stdout.flush()
        if code:
            raise subprocess.CalledProcessError(code, argv)

    return run


def apply(
    settings: AirflowSettings,
    *,
    airflow: Sequence[str] = DEFAULT_AIRFLOW_COMMAND,
    run: Callable[[list[str]], object] | None = None,
) -> None:
    """Run :func:`apply_commands`, with the connections file in a private temporary directory.

    :param run: runs one command and raises if it fails; by default :func:`in_process` where it
        applies, else ``subprocess.run(..., check=True)``.
    """
    runner = run or in_process(airflow) or (lambda argv: subprocess.run(argv, check=True))
    with tempfile.TemporaryDirectory(prefix="triage-settings-") as tmp:  # mode 0700
        connections_file = Path(tmp) / "connections.json"
        if settings.connections:
            connections_file.write_text(connections_import_json(settings), encoding="utf-8")
        for argv in apply_commands(settings, connections_file=connections_file, airflow=airflow):
            print("+", shlex.join(argv), flush=True)
            runner(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m triage_tools.deploy.airflow_settings",
        description="Apply an airflow_settings.yaml (connections, pools, variables) with the Airflow CLI.",
    )
    parser.add_argument("file", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument(
        "--include-shadowed",
        action="store_true",
        help="also write entries that AIRFLOW_CONN_*/AIRFLOW_VAR_* environment variables override",
    )
    parser.add_argument("--airflow", default="airflow", help="command running the Airflow CLI (default: airflow)")
    args = parser.parse_args(argv)

    try:
        settings = load_airflow_settings(args.file)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.include_shadowed:
        applied = without_environment_overrides(settings, os.environ)
        for conn in settings.connections:
            if conn not in applied.connections:
                print(f"skip connection {conn.conn_id}: {conn.env_var()} is set")
        for variable in settings.variables:
            if variable not in applied.variables:
                print(f"skip variable {variable.variable_name}: {variable.env_var()} is set")
        settings = applied
    airflow = shlex.split(args.airflow)
    if args.dry_run:
        for command in apply_commands(settings, connections_file="connections.json", airflow=airflow):
            print(shlex.join(command))
        return 0
    try:
        apply(settings, airflow=airflow)
    except subprocess.CalledProcessError as exc:
        print(f"error: {shlex.join(exc.cmd)} exited with {exc.returncode}", file=sys.stderr)
        return exc.returncode or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
