"""The shared model budget (#17 item 2): completed documents per second under a 50/s requests
budget against a fake provider answering 429 above 50/s, with two worker processes drawing from
the one budget; and what one reservation of the budget costs, beside a model call."""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import Figure, scratch_database, server_cpu_seconds
from tests.fakes.server_process import ServerProcess
from triage.classifiers import Taxonomy, build_classifier
from triage.classifiers.budgets import BudgetSettings, ModelBudget
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.states import JobStatus
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.retrieve import retrieve
from triage.pipeline.steps import RunSettings, claim_size, run_step
from triage.sources.synthetic import SyntheticSource

RATE = 50.0  # requests per second: the budget, and the provider's limit
N = 1_000
WORKERS = 2
CONCURRENCY = 16  # per worker: 32 calls in flight could do 320/s at 100 ms, the budget binds
LATENCY_MS = 100.0
TAKES = 2_000
DAY = datetime(2026, 11, 1, tzinfo=UTC)


def _settings(base_url: str) -> dict[str, Any]:
    return {"base_url": base_url, "api_key": "bench", "model": "fake", "max_connections": CONCURRENCY}


def _worker(url: DatabaseUrl, base_url: str, payload_base: str, batch: str, worker: int, out: Any) -> None:
    """One classify task instance within the shared budget; reports when it started and ended."""
    engine = create_engine(url, pool_size=4)
    budget = ModelBudget(JobStore(engine).budgets, "triage_llm", BudgetSettings(requests_per_minute=RATE * 60))
    classifier = build_classifier(
        "llm", taxonomy=Taxonomy.load(), llm_settings={**_settings(base_url), "budget": budget}
    )
    handler = ClassifyHandler(classifier, PayloadStore(payload_base), ClassifySettings(0.7, CONCURRENCY))
    began = time.time()
    try:
        run_step(
            JobStore(engine),
            handler,
            batch_key=batch,
            settings=RunSettings(owner=f"bench/budget/{worker}", batch_size=claim_size(100, CONCURRENCY)),
        )
    finally:
        handler.close()
        engine.dispose()
    out.put((began, time.time(), budget.reservations))


def bench_budgeted_throughput() -> Figure:
    with (
        ServerProcess(label="billing", latency_ms=LATENCY_MS, requests_per_second=RATE) as server,
        scratch_database() as url,
        tempfile.TemporaryDirectory() as tmp,
    ):
        engine = create_engine(url, pool_size=2)
        store = JobStore(engine)
        version = build_classifier("llm", taxonomy=Taxonomy.load(), llm_settings=_settings(server.base_url)).version
        retrieve(
            store,
            SyntheticSource(N, seed=4),
            PayloadStore(f"{tmp}/payloads"),
            start=DAY,
            end=DAY + timedelta(days=1),
            batch_key="budget",
            classifier_version=version,
            max_attempts=3,
        )
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        procs = [
            context.Process(target=_worker, args=(url, server.base_url, f"{tmp}/payloads", "budget", i, out))
            for i in range(WORKERS)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
            if proc.exitcode != 0:
                raise RuntimeError(f"budget worker exited {proc.exitcode}")
        spans = [out.get(timeout=5) for _ in procs]
        states = store.status_counts()
        engine.dispose()
        calls, rate_limited = server.request_count, server.rate_limited
    seconds = max(end for _, end, _ in spans) - min(began for began, _, _ in spans)
    completed = states[JobStatus.COMPLETED]
    return Figure(
        f"llm under a {RATE:.0f}/s budget, 429 above it",
        "docs/s",
        completed / seconds,
        "the budget",
        RATE,
        target_ratio=0.9,
        details={
            "documents": N,
            "completed": completed,
            "manual_review": states[JobStatus.MANUAL_REVIEW],
            "other": {s.value: n for s, n in states.items() if n and s not in (JobStatus.COMPLETED,)},
            "workers": WORKERS,
            "concurrency_per_worker": CONCURRENCY,
            "calls": calls,
            "answered_429": rate_limited,
            "budget_round_trips": sum(trips for _, _, trips in spans),
            "seconds": round(seconds, 2),
        },
    )


def bench_take_cost() -> Figure:
    """One reservation's round trip (one slot each: a rate of 10/s, whose slots are reserved ahead
    without sleeping), from one thread: wall time and the CPU it costs, beside a model call. A
    worker reserves 0.1 s of the rate at once (:class:`~triage.classifiers.budgets.ModelBudget`), so a
    call pays this once per block: every call at 10/s or less, one in 5 at 50/s, one in 64 at
    640/s or more; ``blocks_per_second_capacity`` is what one worker could reserve."""
    with scratch_database() as url:
        engine = create_engine(url, pool_size=2)
        budget = ModelBudget(JobStore(engine).budgets, "triage_llm", BudgetSettings(requests_per_minute=600))
        budget.take(100, patience=1e7)
        latencies: list[float] = []
        cpu, server_cpu, began = time.process_time(), server_cpu_seconds(), time.perf_counter()
        for _ in range(TAKES):
            start = time.perf_counter()
            budget.take(100, patience=1e7)
            latencies.append(time.perf_counter() - start)
        seconds = time.perf_counter() - began
        cpu = time.process_time() - cpu
        server_after = server_cpu_seconds()
        engine.dispose()
    latencies.sort()
    return Figure(
        "shared budget: one reservation (median)",
        "ms",
        latencies[len(latencies) // 2] * 1000,
        "a 200 ms model call",
        200.0,
        details={
            "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
            "blocks_per_second_capacity": round(TAKES / seconds),
            "client_cpu_ms": round(cpu / TAKES * 1000, 3),
            "postgres_cpu_ms": None
            if server_cpu is None or server_after is None
            else round((server_after - server_cpu) / TAKES * 1000, 3),
        },
    )


def run() -> list[Figure]:
    return [bench_budgeted_throughput(), bench_take_cost()]
