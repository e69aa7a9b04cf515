"""What each guarantee of claim + complete costs (issue #16, item 6): an A/B in one scratch database.

``python -m bench guarantees`` (opt-in; ``BENCH_GUARANTEES_ROUNDS``, default 5): each round runs
five loops of :data:`bench.ledger.CLAIM_N` jobs, each on a fresh batch, in an order rotated per
round: the bare loop of :mod:`bench.ledger`; the ledger's claim and record; the same without
the transition log (the jobs update trigger disabled: no ``job_events`` row, no check against
``job_transitions``); without the completion's outbox event (the fenced ``UPDATE`` alone); and
without both. Measured: this process's CPU and the CPU of the scratch database's own backends
(other work on the server is not counted), and the wall clock. Each figure is a loop's jobs per
CPU second (median of the rounds) against the bare loop's: the ratio is the bare loop's CPU
over the loop's, as ``bench ledger``'s claim + complete ratio is of the wall clock. Guarantees are removed here only, never in the
product: this is what each one costs, not a mode.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable

import psutil
import sqlalchemy as sa

from bench import ledger as L
from bench.common import Figure, scratch_database
from bench.simulation import stripped
from tests.ledger.helpers import new_jobs
from triage.jobs.vocabulary.models import Complete
from triage_tools import embedded

LOOPS = ("bare", "ledger", "no log", "no event", "neither")


def _backends_cpu(database: str) -> dict[int, float]:
    pid = embedded.server_pid()
    if pid is None:
        return {}
    out = {}
    for proc in psutil.Process(pid).children():
        try:
            if database in " ".join(proc.cmdline()):
                times = proc.cpu_times()
                out[proc.pid] = times.user + times.system
        except psutil.Error:
            continue
    return out


def bench_guarantees(rounds: int | None = None) -> list[Figure]:
    rounds = rounds or int(os.environ.get("BENCH_GUARANTEES_ROUNDS", "5"))
    cpu: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    wall: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    with scratch_database() as url:
        database = url.libpq().split("?")[0].rsplit("/", 1)[1]
        engine, store = L._prepare(url)
        for r in range(rounds):
            for i, loop in enumerate(LOOPS):
                docs, batch = new_jobs(L.CLAIM_N, prefix=f"g{r}-{i}"), f"g{r}-{i}"
                for lo in range(0, L.CLAIM_N, L.CHUNK):
                    if loop == "bare":
                        with engine.begin() as conn:
                            conn.execute(L.PLAIN_INSERT, L._plain_params(docs[lo : lo + L.CHUNK], batch))
                    else:
                        store.register(docs[lo : lo + L.CHUNK], batch_key=batch, step="classify", max_attempts=3)
        with engine.begin() as conn:
            conn.execute(sa.text("ANALYZE"))

        def bare(batch: str) -> int:
            done = 0
            while True:
                token = uuid.uuid4()
                with engine.begin() as conn:
                    rows = conn.execute(L.PLAIN_CLAIM, {"batch": batch, "n": L.CLAIM_BATCH, "token": token}).all()
                if not rows:
                    return done
                with engine.begin() as conn:
                    conn.execute(L.PLAIN_COMPLETE, {"ids": [r.id for r in rows], "token": token})
                done += len(rows)

        def ledger(batch: str) -> int:
            done = 0
            while True:
                claim = store.claim(
                    batch_key=batch,
                    step="classify",
                    limit=L.CLAIM_BATCH,
                    lease_seconds=60,
                    owner="bench",
                    classifier_version=L.VERSION,
                )
                if not claim.jobs:
                    return done
                store.record(claim, [Complete(j.id, j.attempt) for j in claim.jobs])
                done += len(claim.jobs)

        for r in range(rounds):
            order = [*LOOPS[r % len(LOOPS) :], *LOOPS[: r % len(LOOPS)]]
            for loop in order:
                run: Callable[[str], int] = bare if loop == "bare" else ledger
                with stripped.without(
                    engine, log=loop not in ("no log", "neither"), event=loop not in ("no event", "neither")
                ):
                    before, own, started = _backends_cpu(database), time.process_time(), time.perf_counter()
                    n = run(f"g{r}-{LOOPS.index(loop)}")
                    seconds = time.perf_counter() - started
                    after = _backends_cpu(database)
                assert n == L.CLAIM_N, (loop, n)
                server = sum(v - before.get(pid, 0.0) for pid, v in after.items())
                cpu[loop].append(round(time.process_time() - own + server, 3))
                wall[loop].append(round(seconds, 3))
        engine.dispose()
    return [
        Figure(
            f"claim + complete, {loop}",
            "jobs/CPU-s",
            L.CLAIM_N / statistics.median(cpu[loop]),
            "bare SKIP LOCKED claim + complete",
            L.CLAIM_N / statistics.median(cpu["bare"]),
            target_ratio=0.6 if loop == "ledger" else None,
            details={
                "jobs": L.CLAIM_N,
                "rounds": rounds,
                "cpu_seconds": cpu[loop],
                "wall_seconds": wall[loop],
                "bare_cpu_seconds": cpu["bare"],
                "bare_wall_seconds": wall["bare"],
            },
        )
        for loop in LOOPS[1:]
    ]


def run() -> list[Figure]:
    return bench_guarantees()
