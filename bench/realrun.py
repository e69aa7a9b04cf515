"""The run users see (issue #16, item 1): ``make up``'s deployment, one ``classify_documents`` run
of 100,000 keyword documents triggered through the REST API, timed from the trigger to the run's
success, every task's seconds read back from the REST API's task instances; beside it the naive
script of the same documents (:func:`bench.pipeline.naive_seconds`).

The deployment is ``triage up`` (``make up``'s command: ``airflow standalone``) in a child, on a
fresh ``TRIAGE_HOME`` with a metadata database and a job database of its own on the benchmark
server and ports of its own, so it runs beside a ``make up`` on 8080 and leaves nothing behind
(``triage stop`` at the end; the job database's URL is given, so the server keeps running). The
DAGs connect with the URL given (the server's owner), not the embedded deployment's worker login,
and the scheduler starts only triggered runs (``use_job_schedule`` off: no scheduled day of
``classify_documents`` once it is unpaused, no ``reconcile_jobs`` beside the timed run). A
10-document day runs first, untimed: the deployment is warm, and its tasks show the mapping
follow the work (one ``classify``).

``BENCH_REAL_DOCUMENTS`` changes the volume (default 100,000).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from bench.common import Figure, scratch_database
from triage.database import DatabaseUrl
from triage_tools.processes import side_by_side_env

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "classify_documents"
DAY = date(2026, 11, 2)
TARGET = 5000.0
"""Documents per second the issue asks of the real run."""
WARM_UP_DOCUMENTS = 10
RELAY_SHARE_TARGET = 0.2
"""The relay's (``publish_events``) share of the run, at most."""


def documents() -> int:
    return int(os.environ.get("BENCH_REAL_DOCUMENTS", "100000"))


def _triage(env: Mapping[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "triage_tools", *args],
        env=dict(env),
        cwd=ROOT,
        text=True,
        capture_output=True,
        check=False,
        timeout=timeout,
    )


@contextmanager
def deployment(
    metadata_url: DatabaseUrl, jobs_url: DatabaseUrl, settings: Mapping[str, str] | None = None
) -> Iterator[tuple[dict[str, str], str]]:
    """``triage up`` on a home and ports of its own; yields its environment and base URL.
    ``settings`` (``AIRFLOW__...`` variables) are exported to it: an A/B of the deployment's
    own settings runs two of them side by side, one with the setting given back."""
    with tempfile.TemporaryDirectory(prefix="triage-realrun-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRIAGE_"))}
        env.update(
            PYTHONPATH=os.pathsep.join(
                [str(ROOT / "plugins"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            TRIAGE_HOME=home,
            TRIAGE_DATABASE_URL=jobs_url.libpq(),
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=metadata_url.airflow_metadata_url(),
        )
        env.update(side_by_side_env())
        # Only the triggered runs: unpausing classify_documents must not also start its latest
        # scheduled day (1,000 documents of the params' defaults beside the timed run), nor the
        # scheduler start reconcile_jobs in the middle of it.
        env["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] = "False"
        # An A/B of the scheduler's idle sleep (the deployment's own is 0.25 s).
        if os.environ.get("BENCH_SCHEDULER_IDLE_SLEEP"):
            env["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] = os.environ["BENCH_SCHEDULER_IDLE_SLEEP"]
        env.update(settings or {})
        try:
            started = _triage(env, "up")
            if started.returncode != 0:
                raise RuntimeError(f"triage up failed:\n{(started.stdout + started.stderr)[-4000:]}")
            yield env, env["AIRFLOW__API__BASE_URL"]
        finally:
            _triage(env, "stop", timeout=120)


def scheduler_cpu_share(home: str, seconds: float = 10.0) -> float | None:
    """The CPU the idle deployment's scheduler uses, in CPU-seconds a second, over ``seconds``
    (what a shorter idle sleep costs): the processes of this ``TRIAGE_HOME`` whose command line
    is ``airflow scheduler`` (the LocalExecutor's workers too); None when none is found."""

    def cpu() -> float | None:  # the scheduler and its executor's worker processes (same command line)
        ticks, total, found = os.sysconf("SC_CLK_TCK"), 0, False
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if b"scheduler" not in argv or f"TRIAGE_HOME={home}".encode() not in (proc / "environ").read_bytes():
                    continue
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total, found = total + int(fields[11]) + int(fields[12]), True
        return total / ticks if found else None

    before = cpu()
    time.sleep(seconds)
    after = cpu()
    return None if before is None or after is None else round((after - before) / seconds, 4)


def _client(env: Mapping[str, str], base_url: str) -> httpx.Client:
    from triage_tools.local import admin_login

    user, password = admin_login({**env, "AIRFLOW_HOME": str(Path(env["TRIAGE_HOME"]) / "airflow")})
    token = httpx.post(f"{base_url}/auth/token", json={"username": user, "password": password}, timeout=60)
    token.raise_for_status()
    return httpx.Client(
        base_url=base_url, timeout=60, headers={"Authorization": f"Bearer {token.json()['access_token']}"}
    )


def _wait_for_dag(api: httpx.Client, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while api.get(f"/api/v2/dags/{DAG_ID}").status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{DAG_ID} not parsed within {timeout:.0f}s")
        time.sleep(1.0)


def timed_run(
    api: httpx.Client, n: int, day: date = DAY, timeout: float = 1800, classifier: str = "keyword"
) -> dict[str, Any]:
    """Trigger one run of ``n`` documents for ``day`` with ``classifier`` and wait for it; its
    seconds and tasks."""
    from triage_tools.run import day_run

    api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False}).raise_for_status()
    run_id = f"bench__{day.isoformat()}__{int(time.time())}"
    body = day_run(run_id, day, {"documents": n, "classifier": classifier, "source": "synthetic"})
    started = time.perf_counter()
    api.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json=body).raise_for_status()
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}"
    state = "queued"
    while True:
        try:
            state = api.get(path).json()["state"]
        except httpx.TimeoutException:  # an API server starved by the machine's load: ask again
            state = "unknown"
        if state in ("success", "failed"):
            break
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"run {run_id} still {state} after {timeout:.0f}s")
        time.sleep(0.2)
    seconds = time.perf_counter() - started
    api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": True})
    run = api.get(path).json()
    queued_at = _time(run["queued_at"])
    if run.get("end_date"):  # the run's own end: the poll above may have waited on a slow answer
        seconds = min(seconds, _time(run["end_date"]) - queued_at)
    instances = api.get(f"{path}/taskInstances", params={"limit": 100}).json()["task_instances"]
    tasks: dict[str, float] = {}
    timeline: dict[str, list[float]] = {}
    for ti in sorted(instances, key=lambda t: (t["start_date"] or "", t["task_id"], t["map_index"])):
        name = ti["task_id"] + (f"[{ti['map_index']}]" if ti["map_index"] >= 0 else "")
        tasks[name] = round(float(ti["duration"] or 0.0), 2)
        if ti["start_date"] and ti["end_date"]:
            timeline[name] = [
                round(_time(ti["start_date"]) - queued_at, 2),
                round(_time(ti["end_date"]) - queued_at, 2),
            ]
    work: dict[str, float] = {}
    for name in tasks:
        try:
            own = _work_seconds(api, path, name)
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):  # a detail of the figure, never its end
            own = None
        if own is not None:
            work[name] = own
    return {"run_id": run_id, "state": state, "seconds": seconds, "tasks": tasks, "timeline": timeline, "work": work}


def _work_seconds(api: httpx.Client, run_path: str, name: str) -> float | None:
    """The seconds a task's own work took, as it reported them (``retrieve`` returns
    ``seconds``; ``classify`` pushes them in XCom ``summary``, its return value being what it
    leaves ``persist``): the rest of its duration is the task process's start and end."""
    task_id, _, index = name.partition("[")
    params: dict[str, Any] = {"deserialize": True, "map_index": int(index.rstrip("]")) if index else -1}
    key = "summary" if task_id == "classify" else "return_value"
    response = api.get(f"{run_path}/taskInstances/{task_id}/xcomEntries/{key}", params=params)
    if response.status_code != 200:
        return None
    value = response.json().get("value")
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError:
            return None
    seconds = value.get("seconds") if isinstance(value, dict) else None
    return round(float(seconds), 2) if isinstance(seconds, int | float) else None


def _time(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def between_tasks(timeline: Mapping[str, list[float]]) -> float:
    """Seconds of the run in which no task ran: the scheduler's and the executor's own time
    (queueing, starting task processes) between one stage's end and the next one's start."""
    idle, last_end = 0.0, 0.0
    for start, end in sorted(timeline.values()):
        idle += max(0.0, start - last_end)
        last_end = max(last_end, end)
    return idle


def task_seconds(tasks: Mapping[str, float], task_id: str) -> float:
    """The wall-clock seconds of a task: its longest map index (they run side by side)."""
    return max((s for name, s in tasks.items() if name.split("[")[0] == task_id), default=0.0)


JOB_MOVERS = ("classify", "persist")
"""The tasks that move jobs: the relay's tail starts when the last of their instances ends
(``persist`` is skipped, with no instance, when classify left it nothing)."""


def relay_tail(timeline: Mapping[str, list[float]]) -> float:
    """Seconds the relay adds to the run: from the end of the last task that moves jobs (the
    last ``classify`` or ``persist`` instance) to ``publish_events``' end: the hand-off and the
    relay of what is left of the run's events."""
    ends = [end for task in JOB_MOVERS for _start, end in _spans(timeline, task)]
    if not ends or "publish_events" not in timeline:
        return 0.0
    return max(0.0, timeline["publish_events"][1] - max(ends))


def _spans(timeline: Mapping[str, list[float]], task: str) -> list[list[float]]:
    """The ``[start, end]`` of each of ``task``'s instances (every map index)."""
    return [span for name, span in timeline.items() if name.split("[")[0] == task]


def hand_offs(timeline: Mapping[str, list[float]], seconds: float) -> dict[str, float]:
    """The run's scheduler hand-offs around the classification: from ``retrieve``'s last end to
    ``classify``'s first start (``size_classify`` between), from ``classify``'s last end to
    ``publish_events``' start (``persist`` between, when it runs), and from ``publish_events``'
    end to the run's end (the ``alert`` teardown, when it runs). Issue #29: fewer tasks there."""

    retrieve, classify, publish = (_spans(timeline, task) for task in ("retrieve", "classify", "publish_events"))
    out: dict[str, float] = {}
    if retrieve and classify:
        out["retrieve_to_classify"] = round(min(s for s, _ in classify) - max(e for _, e in retrieve), 2)
    if classify and publish:
        out["classify_to_publish"] = round(min(s for s, _ in publish) - max(e for _, e in classify), 2)
    if publish:
        out["publish_to_run_end"] = round(seconds - max(e for _, e in publish), 2)
    return out


def published_events(url: DatabaseUrl) -> int:
    import psycopg

    with psycopg.connect(url.libpq()) as conn:
        row = conn.execute(
            "SELECT count(*) FROM triage.outbox"
            " WHERE (txid, event_id) <= (SELECT txid, event_id FROM triage.outbox_watermark)"
        ).fetchone()
    return int(row[0]) if row else 0


def run() -> list[Figure]:
    from bench.pipeline import naive_seconds

    n = documents()
    with scratch_database(migrate=False) as metadata_url, scratch_database() as jobs_url:
        with deployment(metadata_url, jobs_url) as (env, base_url), _client(env, base_url) as api:
            _wait_for_dag(api)
            # A 10-document day first: the deployment is warm when the timed run starts (the
            # first run's first task started 95 s after its trigger here), and it shows the
            # mapping follow the work (one classify task).
            warm = timed_run(api, WARM_UP_DOCUMENTS, day=DAY - timedelta(days=1))
            idle_scheduler = scheduler_cpu_share(env["TRIAGE_HOME"])
            result = timed_run(api, n)
        events = published_events(jobs_url)
        naive = naive_seconds(jobs_url, n)
    if result["state"] != "success" or warm["state"] != "success":
        raise RuntimeError(f"a run failed: {warm['state']} {warm['tasks']}; {result['state']} {result['tasks']}")
    seconds, tasks = result["seconds"], result["tasks"]
    relay = relay_tail(result["timeline"])
    details = {
        "seconds": round(seconds, 2),
        "tasks_seconds": tasks,
        "tasks_work_seconds": result["work"],
        "warm_up_run": {"documents": WARM_UP_DOCUMENTS, "seconds": round(warm["seconds"], 2), "tasks": warm["tasks"]},
        "timeline_from_queued": result["timeline"],
        "seconds_with_no_task_running": round(between_tasks(result["timeline"]), 2),
        "publish_events_share": round(task_seconds(tasks, "publish_events") / seconds, 3),
        "relay_after_last_job_move_seconds": round(relay, 2),
        "hand_off_seconds": hand_offs(result["timeline"], seconds),
        "naive_seconds": round(naive, 2),
        "idle_scheduler_cpu_per_second": idle_scheduler,
        "scheduler_idle_sleep": os.environ.get("BENCH_SCHEDULER_IDLE_SLEEP") or "deployment default",
        "command": "python -m bench realrun",
        "load_average": os.getloadavg(),
    }
    return [
        Figure(
            f"real run through make up, keyword, {n // 1000}k docs",
            "docs/s",
            n / seconds,
            "target",
            TARGET,
            target_ratio=1.0,
            details=details,
        ),
        Figure(
            "real run vs naive script",
            "docs/s",
            n / seconds,
            "naive: classify + upsert labels",
            n / naive,
            details={"naive_seconds": round(naive, 2), "real_run_seconds": round(seconds, 2)},
        ),
        Figure(
            "relay share of the real run (last classify/persist end to publish_events' end)",
            "seconds",
            relay,
            "the whole run",
            seconds,
            target_ratio=RELAY_SHARE_TARGET,
            higher_is_better=False,
            details={
                "events": events,
                "publish_events_seconds": task_seconds(tasks, "publish_events"),
            },
        ),
    ]


LEARNED_EXAMPLES = 5000
"""Labelled synthetic documents the learned run's champion is trained on (a speed figure: the
quality figures are measured on real text, ``python -m bench learning``)."""


def train_champion(env: Mapping[str, str], folder: Path, n: int = LEARNED_EXAMPLES) -> dict[str, Any]:
    """``triage labels import`` of ``n`` synthetic documents with the label each was written for,
    then ``triage train``: the deployment's first champion. Its training summary."""
    import json
    from datetime import UTC, datetime

    from triage.sources.synthetic import SyntheticSource

    start = datetime(2026, 10, 1, tzinfo=UTC)
    path = folder / "labelled.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for document, label in SyntheticSource(n, seed=11).read_labelled(start, start + timedelta(days=1)):
            if document.malformed_reason is not None:
                continue
            payload = json.loads(document.content)
            line = {"id": document.external_id, "subject": payload["subject"], "body": payload["body"], "label": label}
            out.write(json.dumps(line) + "\n")
    from bench.learning import _triage as triage_command

    for args in (("labels", "import", str(path), "--source", "bench"), ("train", "--json")):
        done = triage_command(dict(env), *args)
        if done.returncode != 0:
            raise RuntimeError(f"triage {' '.join(args[:2])} failed: {done.stderr[-2000:]}")
    trained: dict[str, Any] = json.loads(done.stdout)
    return trained


@contextmanager
def _warm_deployment() -> Iterator[tuple[dict[str, str], httpx.Client]]:
    """A `make up` deployment on scratch databases, its DAG parsed and a 10-document day run
    (the first run's tasks start slowly): its environment and API client."""
    with (
        scratch_database(migrate=False) as metadata_url,
        scratch_database() as jobs_url,
        deployment(metadata_url, jobs_url) as (env, base_url),
        _client(env, base_url) as api,
    ):
        _wait_for_dag(api)
        timed_run(api, WARM_UP_DOCUMENTS, day=DAY - timedelta(days=1))
        yield env, api


def run_learned() -> list[Figure]:
    """``python -m bench realrun-learned``: the same deployment runs ``n`` documents with
    ``keyword``, then (a champion trained on labelled synthetic documents) ``n`` with ``learned``;
    the learned run's rate beside the keyword run's (issue #27: at least 0.8 of it)."""
    n = documents()
    with _warm_deployment() as (env, api):
        trained = train_champion(env, Path(env["TRIAGE_HOME"]))
        keyword = timed_run(api, n)
        learned = timed_run(api, n, day=DAY + timedelta(days=1), classifier="learned")
    if keyword["state"] != "success" or learned["state"] != "success":
        raise RuntimeError(
            f"a run failed: {keyword['state']} {keyword['tasks']}; {learned['state']} {learned['tasks']}"
        )
    return [
        Figure(
            f"real run through make up, learned, {n // 1000}k docs",
            "docs/s",
            n / learned["seconds"],
            "the same run with keyword",
            n / keyword["seconds"],
            target_ratio=0.8,
            details={
                "model": trained.get("version"),
                "learned_tasks_seconds": learned["tasks"],
                "keyword_tasks_seconds": keyword["tasks"],
                "command": "python -m bench realrun-learned",
                "load_average": os.getloadavg(),
            },
        )
    ]


def _set_variable(api: httpx.Client, key: str, value: str) -> None:
    api.delete(f"/api/v2/variables/{key}")  # 404 when unset: nothing to remove
    api.post("/api/v2/variables", json={"key": key, "value": value}).raise_for_status()


def _checked_run(api: httpx.Client, n: int, day: date, what: str) -> dict[str, Any]:
    """One ``n``-document run of ``day`` (:func:`timed_run`), refused unless it succeeded, with
    the load average at its end."""
    result = timed_run(api, n, day=day)
    if result["state"] != "success":
        raise RuntimeError(f"{what} failed: {result['tasks']}")
    result["load_average"] = os.getloadavg()
    return result


def _alternating(
    api: httpx.Client, variable: str, n: int, rounds: int, modes: tuple[str, str] = ("off", "on")
) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` pairs of ``n``-document keyword runs on fresh days, Variable ``variable`` set to
    each of ``modes`` in turn, so that the machine's load at each moment hits both."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    day = DAY
    for _ in range(rounds):
        for mode in modes:
            _set_variable(api, variable, mode)
            runs[mode].append(_checked_run(api, n, day, f"a run ({variable}={mode})"))
            day += timedelta(days=1)
    return runs


def _pair_details(n: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "docs_per_second": [round(n / r["seconds"]) for r in runs],
        "runs": [
            {
                "seconds": round(r["seconds"], 2),
                "tasks_seconds": r["tasks"],
                "tasks_work_seconds": r["work"],
                "relay_share": round(relay_tail(r["timeline"]) / r["seconds"], 3),
                "hand_off_seconds": hand_offs(r["timeline"], r["seconds"]),
                "publish_events_share": round(task_seconds(r["tasks"], "publish_events") / r["seconds"], 3),
                "load_average": [round(x, 2) for x in r["load_average"]],
                **({"classify_relayed": r["relayed"]} if "relayed" in r else {}),
            }
            for r in runs
        ],
    }


def run_chunks(rounds: int | None = None) -> list[Figure]:
    """``python -m bench realrun-chunks``: the same deployment runs ``n`` keyword documents with
    the classify step leased (Variable ``triage_classify_in_chunks`` = ``off``: each job claimed,
    then recorded) and in chunks of one transaction (``on``, the default), alternating ``rounds``
    times on fresh days (``BENCH_REAL_ROUNDS``, default 2), so that the machine's load at each
    moment hits both (issue #29)."""
    from triage.pipeline.one_transaction import IN_CHUNKS_VARIABLE

    rounds = rounds or int(os.environ.get("BENCH_REAL_ROUNDS", "2"))
    n = documents()
    with _warm_deployment() as (_env, api):
        runs = _alternating(api, IN_CHUNKS_VARIABLE, n, rounds)
    import statistics

    on, off = _pair_details(n, runs["on"]), _pair_details(n, runs["off"])
    return [
        Figure(
            f"real run through make up, keyword, {n // 1000}k docs, classify in chunks of one transaction",
            "docs/s",
            statistics.median(on["docs_per_second"]),
            "the same runs with the classify step leased",
            statistics.median(off["docs_per_second"]),
            details={
                "in_chunks": on,
                "leased": off,
                "order": "leased, chunks, alternating",
                "command": "python -m bench realrun-chunks",
            },
        )
    ]


GROWTH_BAND = (0.8, 1.2)
"""The tenth run's rate against the first's: within ±20% (issue #29)."""


def growth_runs() -> int:
    return int(os.environ.get("BENCH_GROWTH_RUNS", "10"))


def run_growth(runs: int | None = None) -> list[Figure]:
    """``python -m bench realrun-growth``: one warm deployment runs ``runs`` keyword days of ``n``
    documents back to back (``BENCH_GROWTH_RUNS``, default 10; ``BENCH_REAL_DOCUMENTS``), each on a
    fresh day, so each run meets the ledger, the outbox and the metadata database the earlier ones
    left. The last run's rate beside the first's: issue #29 asks it within ±20%. The figure's
    target is the slower side (at least 0.8 of the first, as ``python -m bench growth`` states its
    flatness); ``within_band`` in the details says whether it is also at most 1.2."""
    runs = runs or growth_runs()
    n = documents()
    results: list[dict[str, Any]] = []
    with _warm_deployment() as (_env, api):
        for i in range(runs):
            results.append(_checked_run(api, n, DAY + timedelta(days=i), f"run {i + 1} of {runs}"))
    rates = [round(n / r["seconds"]) for r in results]
    first, last = n / results[0]["seconds"], n / results[-1]["seconds"]
    ratio = last / first
    return [
        Figure(
            f"real run {runs} of {runs} back to back, keyword, {n // 1000}k docs",
            "docs/s",
            last,
            "the first of the series",
            first,
            target_ratio=GROWTH_BAND[0],
            details={
                "docs_per_second": rates,
                "within_band": GROWTH_BAND[0] <= ratio <= GROWTH_BAND[1],
                "band": list(GROWTH_BAND),
                "runs": [
                    {
                        "seconds": round(r["seconds"], 2),
                        "tasks_seconds": r["tasks"],
                        "load_average": [round(x, 2) for x in r["load_average"]],
                    }
                    for r in results
                ],
                "command": "python -m bench realrun-growth",
            },
        )
    ]


def _classify_relayed(api: httpx.Client, run_id: str) -> int:
    """Events the run's ``classify`` tasks relayed beside their work (their XCom ``summary``)."""
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/classify/xcomEntries/summary"
    relayed = 0
    for index in range(8):
        response = api.get(path, params={"deserialize": True, "map_index": index})
        if response.status_code != 200:
            break
        value = response.json().get("value")
        if isinstance(value, str):
            value = json.loads(value)
        relayed += int(value.get("relayed", 0)) if isinstance(value, dict) else 0
    return relayed


def run_relay(rounds: int | None = None) -> list[Figure]:
    """``python -m bench realrun-relay``: the same deployment runs ``n`` keyword documents with
    the relay beside ``classify`` off (Variable ``triage_relay_in_classify`` = ``off``:
    ``publish_events`` relays the whole run after ``persist``) and on (the default), alternating
    ``rounds`` times on fresh days (``BENCH_REAL_ROUNDS``, default 2); each pair's ratio is the
    figure (issue #29: the relay's share of the run, goal <= 0.15)."""
    import statistics

    from triage.pipeline.trailing_relay import RELAY_IN_CLASSIFY_VARIABLE

    rounds = rounds or int(os.environ.get("BENCH_REAL_ROUNDS", "2"))
    n = documents()
    with _warm_deployment() as (_env, api):
        runs = _alternating(api, RELAY_IN_CLASSIFY_VARIABLE, n, rounds)
        for result in (*runs["off"], *runs["on"]):
            result["relayed"] = _classify_relayed(api, result["run_id"])
    on, off = _pair_details(n, runs["on"]), _pair_details(n, runs["off"])
    ratios = [round(a / b, 3) for a, b in zip(on["docs_per_second"], off["docs_per_second"], strict=True)]
    tails = [relay_tail(r["timeline"]) for r in runs["on"]]
    return [
        Figure(
            f"real run through make up, keyword, {n // 1000}k docs, the relay beside classify",
            "docs/s",
            statistics.median(on["docs_per_second"]),
            "the same runs relayed by publish_events alone",
            statistics.median(off["docs_per_second"]),
            details={
                "pair_ratios": ratios,
                "relay_beside_classify": on,
                "publish_events_alone": off,
                "order": "off, on, alternating",
                "command": "python -m bench realrun-relay",
            },
        ),
        Figure(
            "relay share of the real run with the relay beside classify (persist's end to publish_events' end)",
            "seconds",
            statistics.median(tails),
            "the whole run",
            statistics.median(r["seconds"] for r in runs["on"]),
            target_ratio=RELAY_SHARE_TARGET,
            higher_is_better=False,
            details={
                "shares_on": [r["relay_share"] for r in on["runs"]],
                "shares_off": [r["relay_share"] for r in off["runs"]],
            },
        ),
    ]


def task_start_ups(api: httpx.Client, run_id: str) -> dict[str, dict[str, float]]:
    """Where each task instance's start and end went, from its REST record and its log's own
    marks (the Task SDK logs ``::group::Pre Execute`` when the task process starts, its
    ``::endgroup::`` when ``execute`` begins, and ``::group::Post Execute`` when it returned):
    ``queued_to_start`` (the executor's worker picks the workload, forks the task process and
    tells the API server), ``start_to_execute`` (the bundle, the DAG file parsed, the context),
    ``execute`` (the operator, its own imports included), ``after_execute`` (XCom pushes, the
    success call) and ``start_up`` (queued to ``execute``)."""
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}"
    instances = api.get(f"{path}/taskInstances", params={"limit": 100}).json()["task_instances"]
    out: dict[str, dict[str, float]] = {}
    for ti in instances:
        if not (ti["start_date"] and ti["end_date"] and ti.get("queued_when")):
            continue  # skipped by the scheduler: no process
        name = ti["task_id"] + (f"[{ti['map_index']}]" if ti["map_index"] >= 0 else "")
        response = api.get(
            f"{path}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}",
            params={"map_index": ti["map_index"], "full_content": True},
            headers={"Accept": "application/json"},
        )
        if response.status_code != 200:
            continue
        marks = [e for e in response.json().get("content", []) if isinstance(e, dict) and e.get("timestamp")]
        events = [str(e.get("event")) for e in marks]
        try:
            pre = events.index("::group::Pre Execute")
            execute = events.index("::endgroup::", pre)
            post = events.index("::group::Post Execute", execute)
        except ValueError:
            continue
        queued, start, end = _time(ti["queued_when"]), _time(ti["start_date"]), _time(ti["end_date"])
        began, returned = _time(marks[execute]["timestamp"]), _time(marks[post]["timestamp"])
        out[name] = {
            "queued_to_start": round(start - queued, 2),
            "start_to_execute": round(began - start, 2),
            "execute": round(returned - began, 2),
            "after_execute": round(end - returned, 2),
            "start_up": round(began - queued, 2),
        }
    return out


def start_up_seconds(start_ups: Mapping[str, Mapping[str, float]]) -> float:
    """The start-up the run waited for: each task's (its slowest map index's) queued-to-execute
    seconds, summed over the tasks (they run one after the other)."""
    slowest: dict[str, float] = {}
    for name, parts in start_ups.items():
        task = name.split("[")[0]
        slowest[task] = max(slowest.get(task, 0.0), parts["start_up"])
    return round(sum(slowest.values()), 2)


PRELOAD_OFF = {"AIRFLOW__SCHEDULER__MP_START_METHOD": "fork"}
"""The local deployment as before ``TASK_PRELOAD`` (Airflow's default start method on Linux:
the LocalExecutor's workers forked from the scheduler, every task importing its modules)."""


def run_preload(rounds: int | None = None) -> list[Figure]:
    """``python -m bench realrun-preload``: two ``make up`` deployments side by side, one with the
    local deployment's task preload (``triage_tools.deployment.TASK_PRELOAD``: the scheduler's
    forkserver imports the task modules once) and one given back Airflow's fork start method
    (:data:`PRELOAD_OFF`), ``n`` keyword documents a run (``BENCH_REAL_DOCUMENTS``; 2,000 is
    enough for start-up) alternating ``rounds`` times (``BENCH_REAL_ROUNDS``, default 6). The
    figures are what the preload is for: the tasks' start-up seconds (:func:`task_start_ups`)
    and the hand-offs, medians beside each other; the run's seconds are in the details."""
    import statistics
    from contextlib import ExitStack

    rounds = rounds or int(os.environ.get("BENCH_REAL_ROUNDS", "6"))
    n = documents()
    modes = {"fork": PRELOAD_OFF, "preload": {}}
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    with ExitStack() as stack:
        apis = {}
        for mode, settings in modes.items():
            metadata, jobs = (
                stack.enter_context(scratch_database(migrate=False)),
                stack.enter_context(scratch_database()),
            )
            env, base_url = stack.enter_context(deployment(metadata, jobs, settings))
            apis[mode] = stack.enter_context(_client(env, base_url))
            _wait_for_dag(apis[mode])
        for mode, api in apis.items():  # warm, as `python -m bench realrun` does
            _checked_run(api, WARM_UP_DOCUMENTS, DAY - timedelta(days=1), f"the warm-up ({mode})")
        for round_ in range(rounds):
            for mode, api in apis.items():
                result = _checked_run(api, n, DAY + timedelta(days=round_), f"a run ({mode})")
                result["start_ups"] = task_start_ups(api, result["run_id"])
                runs[mode].append(result)

    def summary(mode: str) -> dict[str, Any]:
        done = runs[mode]
        return {
            "start_up_seconds": [start_up_seconds(r["start_ups"]) for r in done],
            "seconds_with_no_task_running": [round(between_tasks(r["timeline"]), 2) for r in done],
            "hand_off_seconds": [hand_offs(r["timeline"], r["seconds"]) for r in done],
            "seconds": [round(r["seconds"], 2) for r in done],
            "task_start_ups": [r["start_ups"] for r in done],
            "load_average": [[round(x, 2) for x in r["load_average"]] for r in done],
        }

    after, before = summary("preload"), summary("fork")

    def against_fork(what: str, measure: str, details: dict[str, Any] | None = None) -> Figure:
        """The preload's median of ``measure`` beside the fork start method's (lower is better)."""
        return Figure(
            f"{what}, {n} docs, task preload",
            "seconds",
            statistics.median(after[measure]),
            "Airflow's fork start method (no preload)",
            statistics.median(before[measure]),
            higher_is_better=False,
            details=details or {},
        )

    return [
        against_fork(
            "task start-up of a real run, queued to execute summed over its tasks",
            "start_up_seconds",
            {
                "preload": after,
                "fork": before,
                "order": "fork, preload, alternating",
                "command": "python -m bench realrun-preload",
            },
        ),
        against_fork("seconds with no task running in a real run", "seconds_with_no_task_running"),
        against_fork(
            "real run through make up, keyword",
            "seconds",
            {"pair_ratios": [round(a / b, 3) for a, b in zip(after["seconds"], before["seconds"], strict=True)]},
        ),
    ]
