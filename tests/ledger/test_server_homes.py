"""A PostgreSQL that a test keeps in ``server_home`` survives what a concurrent pytest run does.

Every pytest run, as it starts, sets its user's tmp root (``/tmp/pytest-of-root``) back to 0700.
Under root, pgserver runs the server as the user ``pgserver``; a server whose data lived under
that root could no longer be reached by its own user, and ``pg_ctl restart`` (what the failure
drill does mid-run) failed with "Permission denied". ``server_home`` lives elsewhere.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ServerHomes
from triage_tools import embedded

SERVER_USER = "pgserver"  # pgserver's own choice under root (postgres_server.py)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the server runs as another user only when the tests run as root"
)


def _reachable_by_server_user(path: Path) -> bool:
    """Whether the server's user may enter ``path`` (search permission on it and every ancestor)."""
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        pytest.skip(f"no user {SERVER_USER} yet (pgserver makes it at the first start)")
    return subprocess.run(["test", "-x", str(path)], user=SERVER_USER, check=False).returncode == 0


def test_a_server_restarts_after_another_pytest_run_closes_the_tmp_root(
    server_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    url = embedded.start(server_home, databases=())
    # What any pytest run started now does to the shared tmp root of this user.
    tmp_root = tmp_path_factory.getbasetemp().parent
    tmp_root.chmod(0o700)

    assert embedded.restart(server_home)  # pg_ctl restart as the server's user
    with psycopg.connect(url.libpq(), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert _reachable_by_server_user(server_home / "pgdata")
    assert not server_home.resolve().is_relative_to(tmp_root.resolve())


@pytest.mark.parametrize("where", [pytest.param(".", id="in-the-home"), pytest.param("drill", id="in-a-drill-home")])
def test_removing_a_home_stops_the_server_left_in_it(server_homes: ServerHomes, where: str) -> None:
    home = server_homes.make("left-running")
    server = (home / where).resolve()
    embedded.start(server, databases=())

    server_homes.remove(home)

    assert not home.exists()
    assert not _postmasters(server / "pgdata")


def _postmasters(pgdata: Path) -> list[str]:
    """Processes whose command line names ``pgdata`` (a server still running on deleted files)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if str(pgdata).encode() in argv:
            found.append(cmdline.parent.name)
    return found
