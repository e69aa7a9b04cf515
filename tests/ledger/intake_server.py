"""The Triage app, mounted at ``/triage`` as Airflow's API server mounts it, served over real
HTTP by uvicorn: in a thread of the test (:class:`ThreadServer`) or as a process of its own, the
one the kill test SIGKILLs between the commit and the answer.

    python -m tests.ledger.intake_server PORT PAYLOADS ANNOUNCED [--die-after-commit] [--workers N]
    (TRIAGE_DATABASE_URL set; Airflow's auth configured in the environment)

``ANNOUNCED`` is a file that gets one line per announcement (the asset event's stand-in).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from triage.jobs.store import JobStore
from triage.jobs.store.intake import Accepted
from triage.web.intake_service import IntakeService
from triage.web.service import POOL_SIZE, TriageService

ROOT_PATH = "/triage"
VERSION = "keyword-test-v1"
LABELS = ["billing", "shipping", "refund_request"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def root_app(
    store: JobStore,
    payloads: str,
    announce: Callable[[int], bool],
    after_commit: Callable[[Sequence[Accepted]], None] | None = None,
) -> FastAPI:
    from triage.web.app import create_app

    triage = TriageService(store, payload_base=payloads, taxonomy_names=LABELS)
    intake = IntakeService(triage, announce=announce, classifier_version=VERSION, after_commit=after_commit)
    root = FastAPI()
    root.mount(ROOT_PATH, create_app(triage, intake))
    return root


class ThreadServer:
    """uvicorn serving ``app`` on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        wait_listening(self.port)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def wait_listening(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


def served_app() -> FastAPI:
    """The app one server process serves, from the environment :func:`main` sets (each worker
    process of ``--workers N`` builds its own, as each of Airflow's API server workers does)."""
    from airflow.api_fastapi import app as airflow_app

    from triage.database import configured_url, create_engine

    airflow_app.init_auth_manager()
    url = configured_url()
    assert url is not None, "TRIAGE_DATABASE_URL is not set"
    store = JobStore(create_engine(url, pool_size=POOL_SIZE))  # the API server's (TriageService.store)
    announced = os.environ["INTAKE_SERVER_ANNOUNCED"]

    def announce(n: int) -> bool:
        with Path(announced).open("a") as f:
            f.write(f"{n}\n")
        return True

    def die(accepted: Sequence[Accepted]) -> None:
        os.kill(os.getpid(), signal.SIGKILL)  # committed; the answer never leaves

    dies = os.environ.get("INTAKE_SERVER_DIE_AFTER_COMMIT") == "1"
    return root_app(store, os.environ["INTAKE_SERVER_PAYLOADS"], announce, die if dies else None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("payloads")
    parser.add_argument("announced")
    parser.add_argument("--die-after-commit", action="store_true")
    parser.add_argument("--workers", type=int, default=1, help="server processes, as `airflow api-server --workers`")
    args = parser.parse_args()
    os.environ["INTAKE_SERVER_PAYLOADS"] = args.payloads
    os.environ["INTAKE_SERVER_ANNOUNCED"] = args.announced
    os.environ["INTAKE_SERVER_DIE_AFTER_COMMIT"] = "1" if args.die_after_commit else "0"
    if args.workers == 1:
        app: Any = served_app()
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="off")
    else:  # uvicorn's multiprocess mode, as Airflow runs it: each worker imports the app itself
        uvicorn.run(
            "tests.ledger.intake_server:served_app",
            factory=True,
            workers=args.workers,
            host="127.0.0.1",
            port=args.port,
            log_level="warning",
            lifespan="off",
        )


if __name__ == "__main__":
    main()
