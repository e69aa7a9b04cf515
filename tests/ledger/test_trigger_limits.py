"""The trigger form's limits, enforced by the operators on a real database: an inbox outside the
deployment's roots and a drill where drills are off fail the task at once, without retry
(``AirflowFailException``) and without registering anything; inside the limits the run works."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from airflow.sdk.exceptions import AirflowFailException

from triage import settings
from triage.jobs.vocabulary.models import batch_key_for
from triage.operators import ClassifyDocumentsOperator, PersistLabelsOperator, RetrieveDocumentsOperator

DAY = datetime(2026, 11, 1, tzinfo=UTC)
TICKET = b'{"id": "T-1", "subject": "refund", "body": "b", "received_at": "2026-11-01T08:00:00Z"}\n'
DRILL = {"transient_error_rate": 0.2, "seed": 3}


def context(params: dict[str, Any]) -> dict[str, Any]:
    ti = SimpleNamespace(
        dag_id="classify_documents",
        run_id=f"manual__{uuid.uuid4().hex}",
        task_id="retrieve",
        map_index=-1,
        try_number=1,
    )
    return {"params": params, "data_interval_start": DAY, "data_interval_end": DAY + timedelta(days=1), "ti": ti}


def seamed(cls: type, engine: sa.Engine, **kwargs: Any) -> Any:
    class Seamed(cls):
        def get_engine(self) -> sa.Engine:
            return engine

        def dispose(self) -> None:  # the test's engine outlives the task
            pass

    return Seamed(task_id="t", **kwargs)


def jobs_of(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM triage.jobs WHERE batch_key = :b"),
                {"b": batch_key_for(DAY, DAY + timedelta(days=1))},
            ).scalar_one()
        )


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An inbox root holding one day, a secret folder beside it, and a symlink out of the root."""
    root = tmp_path / "inbox"
    (root / "2026-11-01").mkdir(parents=True)
    (root / "2026-11-01" / "tickets.jsonl").write_bytes(TICKET)
    secret = tmp_path / "secret" / "2026-11-01"
    secret.mkdir(parents=True)
    (secret / "creds.jsonl").write_bytes(TICKET.replace(b"T-1", b"SECRET"))
    (root / "elsewhere").symlink_to(tmp_path / "secret")
    monkeypatch.setenv(settings.ENV_INBOX_ROOTS, str(root))
    monkeypatch.delenv(settings.ENV_ALLOW_DRILL, raising=False)
    return tmp_path


@pytest.mark.parametrize(
    "inbox",
    [
        pytest.param("{tmp}/inbox/../secret", id="traversal"),
        pytest.param("{tmp}/inbox/elsewhere", id="symlink-out"),
        pytest.param("{tmp}/secret", id="absolute-elsewhere"),
        pytest.param("http://127.0.0.1:9/inbox", id="url"),
    ],
)
def test_an_inbox_outside_the_roots_fails_the_task_without_retry(
    engine: sa.Engine, deployment: Path, inbox: str
) -> None:
    operator = seamed(RetrieveDocumentsOperator, engine, payload_base=str(deployment / "payloads"))

    with pytest.raises(AirflowFailException, match=r"allowed: .*/inbox \(TRIAGE_INBOX_ROOTS\)"):
        operator.execute(context({"source": "jsonl", "inbox": inbox.format(tmp=deployment)}))
    assert jobs_of(engine) == 0
    assert not (deployment / "payloads").exists()  # nothing was read, nothing stored


def test_an_inbox_inside_the_roots_is_read(engine: sa.Engine, deployment: Path) -> None:
    operator = seamed(RetrieveDocumentsOperator, engine, payload_base=str(deployment / "payloads"))

    result = operator.execute(context({"source": "jsonl", "inbox": str(deployment / "inbox")}))

    assert (result["read"], result["registered"]) == (1, 1)


@pytest.mark.parametrize("cls", [RetrieveDocumentsOperator, ClassifyDocumentsOperator, PersistLabelsOperator])
def test_a_drill_where_drills_are_off_fails_every_task_without_retry(
    engine: sa.Engine, deployment: Path, cls: type
) -> None:
    operator = seamed(
        cls, engine, **({"payload_base": str(deployment / "payloads")} if cls is not PersistLabelsOperator else {})
    )

    with pytest.raises(AirflowFailException, match="does not run failure drills"):
        operator.execute(context({"documents": 5, "drill": DRILL}))
    assert jobs_of(engine) == 0


def test_a_drill_where_drills_are_on_runs(engine: sa.Engine, deployment: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.ENV_ALLOW_DRILL, "1")
    operator = seamed(RetrieveDocumentsOperator, engine, payload_base=str(deployment / "payloads"))

    result = operator.execute(context({"documents": 20, "drill": {**DRILL, "duplicate_rate": 0.5}}))

    assert (result["read"], result["registered"]) == (30, 20)  # the drill's duplicates were delivered
