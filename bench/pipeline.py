"""classify_documents' stages end to end, against a naive script, and the llm path against its
ideal. The stages run in-process exactly as the operators call them (the operators are thin
adapters), so Airflow's start-up is excluded as the issue asks."""

from __future__ import annotations

import multiprocessing
import random
import resource
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from bench.common import Figure, scratch_database, server_cpu_seconds
from tests.fakes.openai_server import FakeOpenAIServer, keyword_responder
from tests.fakes.server_process import ServerProcess
from triage.classifiers import Taxonomy, build_classifier
from triage.classifiers.base import Classifier, ClassifyRequest, decide_outcome
from triage.classifiers.budgets import BudgetSettings, ModelBudget
from triage.contracts.documents import DocumentPayload
from triage.database import DatabaseUrl, create_engine
from triage.jobs.sql.reads.checks import in_state
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.states import SETTLED, JobStatus
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.one_transaction import run_step_in_chunks
from triage.pipeline.persist import PersistHandler
from triage.pipeline.retrieve import retrieve, to_new_jobs
from triage.pipeline.reuse import ContentCache
from triage.pipeline.steps import RunSettings, claim_size, run_step
from triage.sources.base import Shard, SourceDocument
from triage.sources.synthetic import SyntheticSource

E2E_N = 100_000
RETRIEVE_SHARDS = CLASSIFY_WORKERS = 2  # dags/classify_documents.py maps retrieve and classify over these
CLASSIFY_BATCH_SIZE = 1000  # the classify operator's batch_size (triage.operators.tasks.CLASSIFY_BATCH_SIZE)
LLM_N = 2_000
LLM_CONCURRENCY = 32
LLM_LATENCY_MS = 200.0
CLAIM_AHEAD = True
"""As the classify operator runs the llm classifier: the window of calls across claims
(:mod:`triage.pipeline.claim_ahead`); False for the figure without it."""
CACHE_N = 10_000
CACHE_REPEATS = 0.2
DAY = datetime(2026, 11, 1, tzinfo=UTC)

NAIVE_INSERT = sa.text("""
INSERT INTO naive.labels (source, external_id, label, confidence)
SELECT 'synthetic', e, l, c FROM unnest(CAST(:e AS text[]), CAST(:l AS text[]), CAST(:c AS float8[])) AS t(e, l, c)
ON CONFLICT (source, external_id) DO UPDATE SET label = excluded.label, confidence = excluded.confidence
""")


def _classify_worker(url: DatabaseUrl, payload_base: str, batch: str, worker: int) -> Callable[[], None]:
    """One mapped ``classify`` task instance: its own process, engine and classifier; its work."""
    engine = create_engine(url, pool_size=2)
    handler = ClassifyHandler(
        build_classifier("keyword", taxonomy=Taxonomy.load()), PayloadStore(payload_base), ClassifySettings(0.7, 1)
    )

    def work() -> None:
        try:
            # As the classify operator runs keyword on a task's first try: chunks of one transaction.
            run_step_in_chunks(
                JobStore(engine),
                handler,
                batch_key=batch,
                settings=RunSettings(
                    owner=f"bench/classify/{worker}/try1", batch_size=CLASSIFY_BATCH_SIZE, progress_every_seconds=1e9
                ),
            )
        finally:
            handler.close()
            engine.dispose()

    return work


def _retrieve_shard(
    url: DatabaseUrl, payload_base: str, batch: str, n: int, version: str, shard: int, shards: int
) -> Callable[[], None]:
    """One mapped ``retrieve`` task instance: its shard of the source, its own process; its work."""
    engine = create_engine(url, pool_size=2)

    def work() -> None:
        try:
            retrieve(
                JobStore(engine),
                Shard(SyntheticSource(n, seed=1), shard, shards),
                PayloadStore(payload_base),
                start=DAY,
                end=DAY + timedelta(days=1),
                batch_key=batch,
                classifier_version=version,
                max_attempts=3,
            )
        finally:
            engine.dispose()

    return work


STARTED_WITHIN_SECONDS = 300.0


def _task_process(prepare: Callable[..., Callable[[], None]], args: tuple[object, ...], ready: Any, cpu: Any) -> None:
    """A task process: its imports and ``prepare`` (engine, classifier) before ``ready`` lets the
    clock start, as Airflow starts a task before its ``execute``; then the work, whose CPU
    seconds it puts on ``cpu``."""
    work = prepare(*args)
    ready.wait(STARTED_WITHIN_SECONDS)
    began = resource.getrusage(resource.RUSAGE_SELF)
    work()
    ended = resource.getrusage(resource.RUSAGE_SELF)
    cpu.put(ended.ru_utime + ended.ru_stime - began.ru_utime - began.ru_stime)


@contextmanager
def _in_processes(prepare: Callable[..., Callable[[], None]], args: list[tuple[object, ...]]) -> Iterator[list[float]]:
    """Mapped task instances: one spawned process each (a fresh task process inherits nothing).
    The block is entered once every process is started and prepared (the start-up is Airflow's,
    excluded as the figure says) and left once they all ended; the list then holds each one's
    CPU seconds of work."""
    context = multiprocessing.get_context("spawn")
    ready, cpu = context.Barrier(len(args) + 1), context.Queue()
    procs = [context.Process(target=_task_process, args=(prepare, a, ready, cpu)) for a in args]
    for proc in procs:
        proc.start()
    ready.wait(STARTED_WITHIN_SECONDS)
    used: list[float] = []
    yield used
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"{prepare.__name__} exited {proc.exitcode}")
    used += [cpu.get(timeout=10) for _ in procs]


def _stages(
    store: JobStore,
    url: DatabaseUrl,
    payload_base: str,
    classifier: Classifier,
    n: int,
    batch: str,
    shards: int,
    workers: int,
) -> dict[str, float]:
    """retrieve (``shards`` processes) → classify (``workers`` processes), as the DAG maps them,
    → persist; seconds per stage (each from its processes' start once they are ready: imports
    and connections excluded), the CPU seconds its processes' work and PostgreSQL used, and the
    seconds its processes took to start."""
    seconds: dict[str, float] = {}

    def stage(name: str, prepare: Callable[..., Callable[[], None]], args: list[tuple[object, ...]]) -> None:
        spawned = time.perf_counter()
        with _in_processes(prepare, args) as used:
            began, server_cpu = time.perf_counter(), server_cpu_seconds()
        seconds[name] = time.perf_counter() - began
        seconds[f"{name}_start_up"] = began - spawned
        seconds[f"{name}_cpu_workers"] = sum(used)
        after = server_cpu_seconds()
        if after is not None and server_cpu is not None:
            seconds[f"{name}_cpu_postgres"] = after - server_cpu

    stage(
        "retrieve",
        _retrieve_shard,
        [(url, payload_base, batch, n, classifier.version, i, shards) for i in range(shards)],
    )
    stage("classify", _classify_worker, [(url, payload_base, batch, i) for i in range(workers)])
    step = time.perf_counter()
    run_step(store, PersistHandler(store), batch_key=batch, settings=RunSettings(owner="bench"))
    seconds["persist"] = time.perf_counter() - step
    seconds["total"] = seconds["retrieve"] + seconds["classify"] + seconds["persist"]
    return seconds


def _naive(engine: sa.Engine, classifier: Classifier, n: int) -> float:
    """The same documents and classifier, labels upserted in batches: no payloads, no ledger."""
    start = time.perf_counter()
    rows: list[tuple[str, str, float]] = []

    def flush() -> None:
        with engine.begin() as conn:
            conn.execute(
                NAIVE_INSERT, {"e": [r[0] for r in rows], "l": [r[1] for r in rows], "c": [r[2] for r in rows]}
            )
        rows.clear()

    for doc in SyntheticSource(n, seed=1).read(DAY, DAY + timedelta(days=1)):
        text = DocumentPayload.from_bytes(doc.content).text
        output = classifier.classify(ClassifyRequest("", doc.external_id, doc.external_id, "", 1, text))
        if decide_outcome(output, 0.7) == "accepted" and output.label:
            rows.append((doc.external_id, output.label, output.confidence))
        if len(rows) >= 5000:
            flush()
    if rows:
        flush()
    return time.perf_counter() - start


NAIVE_SCHEMA = (
    "CREATE SCHEMA naive",
    "CREATE TABLE naive.labels (source text, external_id text, label text,"
    " confidence float8, PRIMARY KEY (source, external_id))",
)


def naive_seconds(url: DatabaseUrl, n: int) -> float:
    """The naive script of ``n`` keyword documents on ``url`` (its own schema ``naive``, dropped
    again): what the real run is compared with (``bench.realrun``)."""
    engine = create_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP SCHEMA IF EXISTS naive CASCADE"))
            for statement in NAIVE_SCHEMA:
                conn.execute(sa.text(statement))
        seconds = _naive(engine, build_classifier("keyword", taxonomy=Taxonomy.load()), n)
        with engine.begin() as conn:
            conn.execute(sa.text("DROP SCHEMA naive CASCADE"))
        return seconds
    finally:
        engine.dispose()


def bench_end_to_end() -> list[Figure]:
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
    with scratch_database() as url, tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(url, pool_size=4)
        with engine.begin() as conn:
            for statement in NAIVE_SCHEMA:
                conn.execute(sa.text(statement))
        naive_s = _naive(engine, classifier, E2E_N)
        stages = _stages(
            JobStore(engine), url, f"{tmp}/payloads", classifier, E2E_N, "e2e", RETRIEVE_SHARDS, CLASSIFY_WORKERS
        )
        ours_s = stages["total"]
        with engine.connect() as conn:
            settled = conn.execute(sa.select(sa.func.count()).where(in_state(*SETTLED))).scalar()
        assert settled == E2E_N, settled
        engine.dispose()
    return [
        Figure(
            "end to end, keyword, 100k documents",
            "docs/s",
            E2E_N / ours_s,
            "target",
            5000.0,
            target_ratio=1.0,
            details={
                "seconds": round(ours_s, 2),
                "retrieve_shards": RETRIEVE_SHARDS,
                "classify_workers": CLASSIFY_WORKERS,
                **{(k if "_cpu_" in k else f"{k}_seconds"): round(v, 2) for k, v in stages.items() if k != "total"},
            },
        ),
        Figure(
            "reliability overhead (ledger vs naive script)",
            "docs/s",
            E2E_N / ours_s,
            "naive: classify + upsert labels",
            E2E_N / naive_s,
            details={"naive_seconds": round(naive_s, 2), "ledger_seconds": round(ours_s, 2)},
        ),
    ]


def bench_llm(budget: bool = False) -> list[Figure]:
    """``budget``: within a shared budget far above the calls' rate (never waits): what its one
    UPDATE per call costs the run."""
    taxonomy = Taxonomy.load()
    ideal = LLM_N * LLM_LATENCY_MS / 1000 / LLM_CONCURRENCY
    with (
        ServerProcess(keyword=True, latency_ms=LLM_LATENCY_MS) as server,
        scratch_database() as url,
        tempfile.TemporaryDirectory() as tmp,
    ):
        engine = create_engine(url, pool_size=4)
        store = JobStore(engine)
        limits = (
            {"budget": ModelBudget(JobStore(engine).budgets, "triage_llm", BudgetSettings(requests_per_minute=1e6))}
            if budget
            else {}
        )
        classifier = build_classifier(
            "llm",
            taxonomy=taxonomy,
            llm_settings={
                "base_url": server.base_url,
                "api_key": "bench",
                "model": "fake",
                "max_connections": LLM_CONCURRENCY,
                "timeout_s": 30.0,
                **limits,
            },
        )
        payloads = PayloadStore(f"{tmp}/payloads")
        retrieve(
            store,
            SyntheticSource(LLM_N, seed=2),
            payloads,
            start=DAY,
            end=DAY + timedelta(days=1),
            batch_key="llm",
            classifier_version=classifier.version,
            max_attempts=3,
        )
        handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.7, LLM_CONCURRENCY))
        start = time.perf_counter()
        try:
            run_step(
                store,
                handler,
                batch_key="llm",
                settings=RunSettings(
                    owner=f"bench-{uuid.uuid4().hex[:6]}",
                    batch_size=claim_size(500, LLM_CONCURRENCY),
                    claim_ahead=CLAIM_AHEAD,  # as the classify operator runs the llm classifier
                ),
            )
        finally:
            handler.close()
        seconds = time.perf_counter() - start
        engine.dispose()
    calls = server.request_count
    return [
        Figure(
            "llm classify, 2k docs, 200 ms, concurrency 32" + (", in a budget" if budget else ""),
            "seconds",
            seconds,
            "ideal (n × latency / conc.)",
            ideal,
            target_ratio=1.1,
            higher_is_better=False,
            details={"model_calls": calls},
        ),
    ]


def _repeating_documents(n: int, repeat_rate: float, seed: int) -> tuple[list[SourceDocument], int]:
    """``n`` documents of which ``repeat_rate`` carry the text of an earlier one under an id and a
    time of their own (a forwarded email, a duplicate upload); and how many texts are distinct."""
    distinct = n - round(n * repeat_rate)
    originals = list(SyntheticSource(distinct, seed=seed).read(DAY, DAY + timedelta(days=1)))
    plan = random.Random(seed)
    docs = list(originals)
    for i in range(n - distinct):
        at = plan.randrange(1, len(docs) + 1)  # somewhere after at least one document
        original = DocumentPayload.from_bytes(plan.choice(docs[:at]).content)
        external_id = f"repeat-{i:06d}"
        payload = original.model_copy(update={"external_id": external_id, "received_at": DAY + timedelta(seconds=i)})
        docs.insert(at, SourceDocument("synthetic", external_id, payload.to_bytes()))
    return docs, distinct


def bench_content_cache() -> list[Figure]:
    """Model calls for ``CACHE_N`` documents of which ``CACHE_REPEATS`` repeat earlier text, with the
    content cache, against the distinct texts. The documents are two runs (two batch keys, each
    classified by a fresh handler): the second run's repeats of the first's text are answered from
    the ledger, the others within the run. The product's default threshold (0.7): a repeat of an
    answer below it goes to review naming that answer, without a call."""
    taxonomy = Taxonomy.load()
    docs, distinct = _repeating_documents(CACHE_N, CACHE_REPEATS, seed=3)
    with (
        FakeOpenAIServer(responder=keyword_responder(taxonomy)) as server,
        scratch_database() as url,
        tempfile.TemporaryDirectory() as tmp,
    ):
        settings = {"base_url": server.base_url, "api_key": "bench", "model": "fake", "max_connections": 8}
        version = build_classifier("llm", taxonomy=taxonomy, llm_settings=settings).version
        engine = create_engine(url, pool_size=4)
        store = JobStore(engine)
        payloads = PayloadStore(f"{tmp}/payloads")
        half = len(docs) // 2
        runs = {"cache-1": docs[:half], "cache-2": docs[half:]}
        for key, part in runs.items():
            store.register(to_new_jobs(part, payloads, version), batch_key=key, step="classify", max_attempts=3)
        start = time.perf_counter()
        reused = 0
        for key in runs:
            classifier = build_classifier("llm", taxonomy=taxonomy, llm_settings=settings)
            cache = ContentCache(store, classifier.version, 0.7)
            handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.7, 8), cache=cache)
            try:
                run_step(
                    store,
                    handler,
                    batch_key=key,
                    # As the classify operator runs the llm classifier: the window of calls across claims.
                    settings=RunSettings(owner="bench-cache", batch_size=claim_size(1000, 8), claim_ahead=CLAIM_AHEAD),
                )
            finally:
                handler.close()
            reused += cache.reused
        seconds = time.perf_counter() - start
        states = store.status_counts()
        calls = len(server.requests)
        engine.dispose()
    return [
        Figure(
            f"llm model calls, {CACHE_N // 1000}k docs, {CACHE_REPEATS:.0%} repeats",
            "calls",
            calls,
            "distinct texts",
            distinct,
            target_ratio=1.0,
            higher_is_better=False,
            details={
                "documents": CACHE_N,
                "reused": reused,
                "completed": states[JobStatus.COMPLETED],
                "manual_review": states[JobStatus.MANUAL_REVIEW],
                # Calls beyond one per distinct text (two workers racing on a text, none here).
                "asked_again": calls - distinct,
                "seconds": round(seconds, 2),
            },
        ),
    ]


def run() -> list[Figure]:
    from bench import budgets

    return [*bench_end_to_end(), *bench_llm(), *bench_llm(budget=True), *bench_content_cache(), *budgets.run()]
