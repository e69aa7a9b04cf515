"""Airflow's command line without paying Airflow's start-up for every command: one warm process
forks a child per command, and the child runs Airflow's own command line.

A cold ``airflow dags test`` costs some 12 s of CPU before and around a run of a few hundred
documents: importing Airflow and its CLI (~3 s), and building the in-process Execution API the
run's tasks talk to, whose Cadwyn app generates a router for every API version on its first
request (~4 s). ``make run`` runs two (``classify_documents``, then ``reconcile_jobs``), the test
suite about twenty. The warm process does that work once; each child is a fork of it that sets
its environment and ``sys.argv`` and calls ``airflow.__main__``'s ``main()``, so the run is the
CLI's, in a process of its own, with its exit code and output.

One thing differs from a cold process: the child's tasks share the warm Execution API app (one
app, as the tasks of a deployment share its API server) instead of building one per task.
Anything Airflow reads when it is imported comes from the warm process's environment, so a
command whose environment differs from it in anything else than what is read at run time
(:data:`READ_AT_RUN_TIME`: connections, Triage's variables, the REST API's URL) runs in a cold
subprocess (:meth:`WarmAirflow.run`).

Any other command (``users create``, ``connections get``, ``backfill create`` ...) runs the same
way from a process warmed for the command line only (``execution_api=False``: Airflow imported,
~2.5 CPU-s of a cold command's 3-5.5; the tests' ``AirflowCli``).

Protocol (``python -m triage_tools.warm [--cli]`` in the deployment's environment): a JSON line
per command on stdin, ``{"args": [...], "env": {...}, "stdout": path, "stderr": path, "append":
bool}`` (a null path: the warm process's stderr); the answer on stdout, ``{"pid": n}`` when the
child starts and ``{"returncode": n}`` when it ended.
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


class WarmAirflow:
    """Runs ``airflow ARGS`` for one environment, forked from a warm process (built for ``dags
    test`` by default; for any other command, ``execution_api=False`` is cheaper).

    :param log: the warm process's own output (Airflow's warnings at import), a path appended to;
        None: this process's stderr.
    """

    def __init__(self, env: Mapping[str, str], log: Path | None, *, execution_api: bool = True) -> None:
        self.env = dict(env)
        self._log = log.open("ab") if log is not None else None
        # From the folder holding triage_tools: `-m` finds this checkout's tools, installed or not.
        self._process = subprocess.Popen(
            [sys.executable, "-m", "triage_tools.warm", *([] if execution_api else ["--cli"])],
            env={**self.env, "PYTHONPATH": _with_tools(self.env.get("PYTHONPATH", ""))},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._pid: int | None = None  # the child of the command started last, until it ended

    def start(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        stdout: Path | None = None,
        stderr: Path | None = None,
        append: bool = False,
        timeout: float | None = None,
    ) -> int:
        """Start ``airflow ARGS`` in a child (one at a time); its output to the files given (None:
        the warm process's stderr). Returns its pid; :meth:`wait` for its exit code.

        :param timeout: seconds to wait for the warm process to take it (it may still be warming up).
        :raises subprocess.TimeoutExpired: it did not within ``timeout``."""
        if self._pid is not None:
            raise RuntimeError("the warm Airflow runs one command at a time")
        request = {
            "args": list(args),
            "env": dict(env if env is not None else self.env),
            "stdout": None if stdout is None else str(stdout),
            "stderr": None if stderr is None else str(stderr),
            "append": append,
        }
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        answer = self._answer(timeout)
        if not answer:
            self.close()  # its answer would come after the next request's
            raise subprocess.TimeoutExpired(["airflow", *args], timeout or 0)
        self._pid = int(answer["pid"])
        return self._pid

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code of the command started last, or None if it still runs after ``timeout``."""
        answer = self._answer(timeout)
        if not answer:
            return None
        self._pid = None
        return int(answer["returncode"])

    def run(self, args: Sequence[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        """``airflow ARGS`` with ``env``, its output captured: as ``subprocess.run(...,
        capture_output=True, text=True)`` answers; cold when ``env`` differs from the warm one
        in what Airflow reads at import, or the warm process has exited."""
        argv = [sys.executable, "-m", "airflow", *args]
        if not self._warm_for(env) or self._process.poll() is not None:
            return subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
        with tempfile.TemporaryDirectory(prefix="airflow-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            deadline = time.monotonic() + timeout
            pid = self.start(args, env, stdout=out, stderr=err, timeout=timeout)
            returncode = self.wait(max(0.0, deadline - time.monotonic()))
            if returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.close()  # its answer would come after the next request's
                raise subprocess.TimeoutExpired(argv, timeout)
            return subprocess.CompletedProcess(
                argv, returncode, out.read_text(errors="replace"), err.read_text(errors="replace")
            )

    def _warm_for(self, env: Mapping[str, str]) -> bool:
        differing = {k for k in self.env.keys() | env.keys() if self.env.get(k) != env.get(k)}
        return all(k.startswith(READ_AT_RUN_TIME) for k in differing)

    def _answer(self, timeout: float | None) -> dict[str, Any]:
        """The warm process's next answer; {} when none came within ``timeout``."""
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], timeout)
        if not ready:
            return {}
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm Airflow process exited {self._process.wait()}")
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
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> WarmAirflow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_tools(pythonpath: str) -> str:
    """``PYTHONPATH`` with the folder that holds this checkout's ``triage_tools`` first."""
    tools_root = str(Path(__file__).resolve().parents[1])
    return os.pathsep.join([tools_root, *(p for p in pythonpath.split(os.pathsep) if p and p != tools_root)])


# -- the warm process ---------------------------------------------------------------------------


def _warm_up(execution_api: bool = True) -> None:
    """Import what ``dags test`` imports and build the Execution API app, without starting a
    thread (a fork keeps only the thread that forks); without ``execution_api``, Airflow and its
    command line only."""
    from airflow.__main__ import main  # noqa: F401  (configuration first, as airflow's __main__)

    if not execution_api:
        return
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
    mode = "ab" if request.get("append") else "wb"
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        if path is not None:
            with open(path, mode) as file:
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
    _warm_up(execution_api="--cli" not in sys.argv[1:])
    _serve(sys.stdin, answers)


if __name__ == "__main__":
    main()
