"""Child processes of the local deployment: each the leader of its own process group, stopped
as a group; free loopback ports for an Airflow that runs beside another."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

STOP_TIMEOUT = 30.0


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def side_by_side_env(api_port: int | None = None) -> dict[str, str]:
    """Ports for an Airflow that runs beside another on this machine (``make up`` on 8080/8793):
    the API server on loopback, the Execution API URL its task processes call, and free ports
    for the worker and triggerer log servers."""
    port = api_port or free_port()
    base = f"http://127.0.0.1:{port}"
    return {
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
    }


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (our own child that exited) does not, though it still
    answers kill(0)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def group_members(pgid: int) -> list[psutil.Process]:
    """The live (not zombie) processes of process group ``pgid``."""
    members = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):  # gone meanwhile, or not ours to see
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc)
    return members


def port_in_use(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class ComponentExited(RuntimeError):
    """A component a caller started and waits on has exited."""


@dataclass
class Processes:
    """Child processes (Airflow components, Redis, Celery workers), each the leader of its own
    process group, with its output in ``<log_dir>/<name>.log``."""

    log_dir: Path
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log_dir / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.running[name] = proc
        if name not in self.started:
            self.started.append(name)
        return proc

    def check(self) -> None:
        for name, proc in self.running.items():
            if proc.poll() is not None:
                raise ComponentExited(f"{name} exited with {proc.returncode}\n{self.logs()}")

    def logs(self, tail: int = 30) -> str:
        """The last ``tail`` lines of every component started, running or stopped."""
        parts = []
        for name in self.started:
            lines = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"==> {self.log_dir / name}.log <==\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self, names: Sequence[str], timeout: float = 30.0) -> None:
        """SIGTERM the groups of ``names`` together, SIGKILL what is left after ``timeout``."""
        procs = [self.running.pop(n) for n in names if n in self.running]
        kill_groups([p.pid for p in procs], timeout)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def kill_group(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``timeout``."""
    kill_groups([pid], timeout)


def kill_groups(pids: Sequence[int], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process groups led by ``pids`` at once, then SIGKILL what is left after ``timeout``.

    Group leaders started by the caller must still be reaped by it (``Popen.wait``). A zombie
    leader keeps its group id alive, so such a group counts as gone once no other member lives.
    """
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if _group_alive(pid)]
        if left:
            time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if alive(pid):
        return True
    # The leader is gone or a zombie: the group lives on only if another member does.
    return bool(group_members(pid))
