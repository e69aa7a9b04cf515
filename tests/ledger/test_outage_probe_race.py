"""One prober at a time, with two workers at once (issue #25, finding 6): two threads, each with
its own connection on the real PostgreSQL, both find nothing due but work parked on an outage
and both ask for a probe while the first one's probe is taken but not yet committed. Exactly one
gets a probe. The interleaving is forced, not hoped for: the first worker holds its transaction
open (a seam subclass of the store) until the second is either done or waiting on a lock in
PostgreSQL (``pg_stat_activity``), so without the fence's lock the second worker would see the
first one's probe job still parked and take a second one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.openai_server import FakeOpenAIServer
from tests.ledger.helpers import counts
from tests.ledger.test_outage import Switch, classify, llm, register
from tests.ledger.test_outage_probe import BATCH, PARK
from triage.jobs.store import JobStore
from triage.jobs.store.ledger import DEFAULT_ACTOR
from triage.payloads import PayloadStore
from triage.pipeline.steps import CircuitOpen

# Two workers race in threads, each on connections of its own.
pytestmark = pytest.mark.own_database

BLOCKED_BY_LOCK = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :pid"


class HookedStore(JobStore):
    """The store with two seams in every transaction: ``on_begin(conn)`` once it is open and
    ``before_commit(conn)`` after its statements, before it commits."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        on_begin: Callable[[sa.Connection], None] = lambda conn: None,
        before_commit: Callable[[sa.Connection], None] = lambda conn: None,
    ) -> None:
        super().__init__(engine)
        self.on_begin, self.before_commit = on_begin, before_commit

    @contextmanager
    def transaction(self, actor: str | None = DEFAULT_ACTOR) -> Iterator[sa.Connection]:
        with super().transaction(actor) as conn:
            self.on_begin(conn)
            yield conn
            self.before_commit(conn)


def test_two_workers_at_once_take_exactly_one_probe(store: JobStore, payloads: PayloadStore) -> None:
    with FakeOpenAIServer(responder=Switch(PARK)) as fake:
        version = llm(fake).version
        register(store, payloads, 6, version)
        with pytest.raises(CircuitOpen):
            classify(store, llm(fake), payloads, try_number=1)
    assert counts(store, "SELECT status, count(*) FROM triage.jobs GROUP BY 1") == {("waiting",): 6}

    first_updated, second_done, second_began = threading.Event(), threading.Event(), threading.Event()
    second_pid: list[int] = []
    errors: list[BaseException] = []
    taken: dict[str, Any] = {}

    def hold_until_second_is_done_or_blocked(conn: sa.Connection) -> None:
        """The first worker's probe is written, not committed: let the second worker run into it."""
        first_updated.set()
        assert second_began.wait(30), "the second worker never began"
        with store.engine.connect() as watcher:
            while not second_done.wait(0.005):
                if watcher.execute(sa.text(BLOCKED_BY_LOCK), {"pid": second_pid[0]}).scalar():
                    return  # it waits for this transaction: commit and let it go on
                watcher.rollback()  # a fresh snapshot of pg_stat_activity next time
        # The second worker finished while this probe was uncommitted: nothing fenced it.

    def second_begins(conn: sa.Connection) -> None:
        second_pid.append(int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()))
        second_began.set()

    first = HookedStore(store.engine, before_commit=hold_until_second_is_done_or_blocked)
    second = HookedStore(store.engine, on_begin=second_begins)

    def worker(name: str, ledger: JobStore, after: threading.Event | None) -> None:
        try:
            if after is not None:
                assert after.wait(30), "the first worker never wrote its probe"
            taken[name] = ledger.probes.probe_parked(
                BATCH, "classify", actor=f"{name}/try2", classifier_version=version
            )
        except BaseException as exc:  # noqa: BLE001 (handed to the test thread, asserted empty)
            errors.append(exc)
        finally:
            if name == "w2":
                second_done.set()

    threads = [
        threading.Thread(target=worker, args=("w1", first, None)),
        threading.Thread(target=worker, args=("w2", second, first_updated)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert taken["w1"] is not None
    assert taken["w2"] is None, "a second worker took a probe while the first one's was in flight"
    assert counts(store, "SELECT status, status_reason, count(*) FROM triage.jobs GROUP BY 1, 2") == {
        ("queued", "outage_probe"): 1,
        ("waiting", "outage:model"): 5,
    }
    with store.engine.connect() as conn:
        probes = conn.execute(sa.text("SELECT count(*) FROM triage.job_events WHERE reason = 'outage_probe'"))
        assert probes.scalar_one() == 1
