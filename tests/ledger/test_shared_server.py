"""The embedded test server that ``make test``'s xdist workers share (``tests/conftest.py``).

Each worker is a pytest session of its own. Before, each session stopped the server at its end
if the server had not been running when it began: under xdist the first worker to finish would
have stopped it under the others. Now every process that uses it holds ``server.users`` shared,
starting is serialised by ``server.lock``, and the server is stopped only when nobody holds it.
Real servers, real processes (each stands for a worker), on a home of the test's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.conftest import SharedServer

ROOT = Path(__file__).resolve().parents[2]

# A worker: uses the server, prints its URL, keeps using it until its standard input closes.
WORKER = """
import sys
from pathlib import Path
from tests.conftest import SharedServer
print(SharedServer(Path(sys.argv[1])).start().libpq(), flush=True)
sys.stdin.read()
"""


def worker(home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT / "plugins"), str(ROOT)))}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(home)],
        cwd=ROOT,
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0


def test_workers_starting_at_once_share_one_server_stopped_after_the_last(server_home: Path) -> None:
    procs = [worker(server_home) for _ in range(3)]  # all at once, on a server nobody started yet
    urls = {proc.stdout.readline().strip() for proc in procs if proc.stdout is not None}
    assert len(urls) == 1
    [url] = urls

    for proc in procs[:-1]:  # two workers are done; the last one still uses the server
        finish(proc)
    assert not SharedServer(server_home).stop_if_unused()
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)

    finish(procs[-1])
    run = SharedServer(server_home)  # the run that started it, at its end
    assert run.stop_if_unused()
    assert not run.is_running()
