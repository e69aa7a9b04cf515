"""The README cannot lie about its shell lines (issue #12, item 2): every line of its ``sh`` blocks
is a command this checkout has, and those safe to run here run, against a test database. The
same holds for the pages the README's commands moved to (issue #26 item 5): docs/running.md
(make targets, the ``triage`` command) and docs/intake.md (the ``curl`` calls).

- ``.venv/bin/triage ...``: ``--help``, ``--version`` and the product's commands (``status``,
  ``db url``, ``payload``, ``replay`` as a dry run) run for real, on a migrated job database of this test; the other verbs
  (``run``, ``up``, ...) start Airflow, so their ``--help`` runs instead (the command exists and
  parses). The console script is ``triage_tools.cli:main`` (pyproject.toml, checked here), run
  as ``python -m triage_tools`` because the test's interpreter need not have the checkout installed.
- ``make TARGET VAR=...``: ``make -n`` accepts it (the target exists; nothing is run).
- ``./airflow.sh ...``: the script exists, is executable and parses (``bash -n``).
- ``curl ...``: a call of ``make up``'s API server (localhost:8080) at a path it serves (Airflow's
  token, intake); a document it posts is one intake accepts (:func:`parse_documents`).

A README line of any other form fails the test: add it here with how it is checked.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

from triage.database import DatabaseUrl

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHELL_DOCUMENTS = (README, ROOT / "docs" / "running.md", ROOT / "docs" / "intake.md")
TRIAGE = ".venv/bin/triage"
RUN_HERE = {"--help", "--version", "status", "db", "payload", "replay"}  # the rest starts Airflow or a server


def readme_shell_lines(documents: tuple[Path, ...] = SHELL_DOCUMENTS) -> list[str]:
    """The command lines of the documents' ``sh`` blocks, without their comments."""
    lines, inside = [], False
    for document in documents:
        for line in document.read_text(encoding="utf-8").splitlines():
            if line.startswith("```"):
                inside = line.strip() == "```sh"
                continue
            command = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if inside and command and not command.startswith("#") and command not in lines:
                lines.append(command)
    return lines


def triage(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "triage_tools", *args]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def checkout_env(db_url: DatabaseUrl, tmp_path: Path) -> dict[str, str]:
    """A user's shell with TRIAGE_DATABASE_URL on this test's migrated database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRIAGE_"))}
    env.update(PYTHONPATH=str(ROOT / "plugins"), TRIAGE_DATABASE_URL=db_url.libpq(), TRIAGE_HOME=str(tmp_path))
    return env


def test_the_readme_shows_the_triage_command() -> None:
    lines = readme_shell_lines((README,))
    assert not [line for line in lines if "python -m triage" in line], "the README shows `triage`, not python -m"
    assert {f"{TRIAGE} --help", f"{TRIAGE} --version", f"{TRIAGE} status", f"{TRIAGE} db url"} <= set(lines)
    assert {"make run", "make test"} <= set(lines), "the README's two commands"
    assert [line for line in readme_shell_lines() if line.startswith("curl ")], "intake's calls are checked too"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"triage": "triage_tools.cli:main"}  # what `python -m triage_tools` runs


@pytest.mark.parametrize("line", readme_shell_lines())
def test_readme_shell_line(line: str, checkout_env: dict[str, str], db_url: DatabaseUrl) -> None:
    words = shlex.split(line)
    if words[0] == TRIAGE:
        args = words[1:]
        if args[0] not in RUN_HERE:
            done = triage([args[0], "--help"], checkout_env)
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith(f"usage: triage {args[0]}"), done.stdout
            return
        job_id = str(uuid.uuid4())
        done = triage([job_id if a == "JOB_ID" else a for a in args], checkout_env)
        if args[0] == "payload":  # no such job in a fresh database: the command runs and says so
            assert (done.returncode, done.stderr.strip()) == (1, f"triage payload: no job {job_id}")
            return
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        given = DatabaseUrl.parse(checkout_env["TRIAGE_DATABASE_URL"])  # as the command parses it
        expected = {
            "--help": lambda out: out.startswith("usage: triage ") and "status" in out and "chaos" in out,
            "--version": lambda out: re.fullmatch(r"triage \d+\.\d+\.\d+\S*\n", out) is not None,
            "status": lambda out: out.startswith(f"job ledger at {given.libpq_redacted()}\n") and "completed" in out,
            "db": lambda out: DatabaseUrl.parse(out.strip()) == given == DatabaseUrl.parse(db_url.libpq()),
            "replay": lambda out: "**dry run**: 0 jobs match" in out,  # a fresh database has no failed job
        }[args[0]]
        assert expected(done.stdout), done.stdout
    elif words[0] == "make":
        done = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
    elif words[0] == "./airflow.sh":
        script = ROOT / "airflow.sh"
        assert os.access(script, os.X_OK)
        assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    elif words[0] == "curl":
        check_curl(words)
    else:
        pytest.fail(f"README line of a form no test checks: {line!r}")


CURL_PATHS = {"/auth/token", "/triage/api/documents", "/triage/api/documents/JOB_ID"}


def check_curl(words: list[str]) -> None:
    import json

    from triage.contracts.intake import parse_documents

    [url] = [w for w in words if w.startswith("http")]
    assert url.startswith("http://localhost:8080/"), url
    path = url.removeprefix("http://localhost:8080")
    assert path in CURL_PATHS, path
    if "-d" in words and path == "/triage/api/documents":
        body = json.loads(words[words.index("-d") + 1])
        valid, problems = parse_documents(body.get("documents", [body]))
        assert valid, body
        assert problems == [], problems
