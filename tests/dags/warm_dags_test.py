"""``airflow dags test`` without paying Airflow's start-up each time: one warm process per test
deployment forks a child per run, and the child runs Airflow's own command line.

A cold ``airflow dags test`` costs some 12 s of CPU before and around a run of a few hundred
documents: importing Airflow and its CLI (~3 s), and building the in-process Execution API the
run's tasks talk to, whose Cadwyn app generates a router for every API version on its first
request (~4 s). The suite runs about twenty of them. The warm process does that work once; each
child is a fork of it that sets its environment and ``sys.argv`` and calls ``airflow.__main__``'s
``main()``, so the run is the CLI's, in a process of its own, with its exit code and output.

One thing differs from a cold process: the child's tasks share the warm Execution API app (one
app, as the tasks of a deployment share its API server) instead of building one per task.
Anything Airflow reads when it is imported comes from the warm process's environment, so a run
whose environment differs from it in anything else than what is read at run time
(:data:`READ_AT_RUN_TIME`: connections, Triage's variables, the REST API's URL) is a cold
subprocess, as before.

Protocol (``python -m tests.dags.warm_dags_test`` in the deployment's environment): a JSON line
per run on stdin, ``{"args": [...], "env": {...}, "stdout": path, "stderr": path}``; the answer
on stdout, ``{"pid": n}`` when the child starts and ``{"returncode": n}`` when it ended.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

# Keys of the environment Airflow and Triage read when a run needs them, not when they are imported.
READ_AT_RUN_TIME = ("AIRFLOW_CONN_", "AIRFLOW_VAR_", "TRIAGE_", "AIRFLOW__API__BASE_URL")


class WarmDagsTest:
    """Runs ``airflow dags test ARGS`` for one deployment environment, forked from a warm process.

    :meth:`run` answers as ``subprocess.run(..., capture_output=True, text=True)`` does."""

    def __init__(self, env: Mapping[str, str], log: Path) -> None:
        self.env = dict(env)
        self._log = log.open("ab")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.dags.warm_dags_test"],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def run(self, args: Sequence[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "airflow", *args]
        if not self._warm_for(env) or self._process.poll() is not None:
            return subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
        with tempfile.TemporaryDirectory(prefix="dags-test-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"args": list(args), "env": dict(env), "stdout": str(out), "stderr": str(err)}
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            deadline = time.monotonic() + timeout
            pid = self._answer(deadline, argv, timeout)["pid"]
            try:
                returncode = self._answer(deadline, argv, timeout)["returncode"]
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.close()  # its answer would come after the next request's
                raise
            return subprocess.CompletedProcess(
                argv, returncode, out.read_text(errors="replace"), err.read_text(errors="replace")
            )

    def _warm_for(self, env: Mapping[str, str]) -> bool:
        differing = {k for k in self.env.keys() | env.keys() if self.env.get(k) != env.get(k)}
        return all(k.startswith(READ_AT_RUN_TIME) for k in differing)

    def _answer(self, deadline: float, argv: list[str], timeout: float) -> dict[str, Any]:
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise subprocess.TimeoutExpired(argv, timeout)
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm dags test process exited {self._process.wait()}")
        return dict(json.loads(line))

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()


# -- the warm process ---------------------------------------------------------------------------


def _warm_up() -> None:
    """Import what ``dags test`` imports and build the Execution API app, without starting a
    thread (a fork keeps only the thread that forks)."""
    from airflow.__main__ import main  # noqa: F401  (configuration first, as airflow's __main__)
    from airflow.api_fastapi.execution_api.app import InProcessExecutionAPI
    from airflow.cli.commands import dag_command  # noqa: F401
    from airflow.sdk.execution_time import supervisor, task_runner  # noqa: F401

    app = InProcessExecutionAPI().app
    app._cadwyn_initialize()  # what its first request would do, in every child
    # Every task of a child's run talks to one in-process API around the warm app; its event
    # loop thread starts in the child, on the first task's first request.
    supervisor.in_process_api_server = functools.cache(lambda: InProcessExecutionAPI(app=app))


def _child(request: dict[str, Any]) -> int:
    from airflow.__main__ import main

    with open(os.devnull, "rb") as devnull:
        os.dup2(devnull.fileno(), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        with open(path, "wb") as file:
            os.dup2(file.fileno(), fd)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["airflow", *request["args"]]
    try:
        main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _serve(requests: IO[str], answers: IO[str]) -> None:
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(request)
            except BaseException:  # noqa: BLE001  (as a cold process: the traceback, exit 1; never the loop)
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


def main() -> None:
    # The answers on a descriptor of their own: whatever Airflow prints goes to stderr (the log).
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _warm_up()
    _serve(sys.stdin, answers)


if __name__ == "__main__":
    main()
