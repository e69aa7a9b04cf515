"""``python -m triage payload JOB_ID``: a reviewer reads a job's document through its reference."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from triage.cli import job_payload, main
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore
from triage.payloads import PayloadCorrupt, PayloadStore
from triage.pipeline.retrieve import retrieve
from triage.sources.synthetic import SyntheticSource

START = datetime(2026, 11, 1, tzinfo=UTC)


def _registered(store: JobStore, base: Path) -> dict[str, uuid.UUID]:
    retrieve(store, SyntheticSource(5, seed=8), PayloadStore(base), start=START, end=START + timedelta(days=1),
             batch_key="b", classifier_version="v", max_attempts=3)  # fmt: skip
    with store.engine.connect() as conn:
        return {r.external_id: r.id for r in conn.exec_driver_sql("SELECT external_id, id FROM triage.jobs")}


def test_prints_the_document_of_a_job_in_a_pack(store: JobStore, db_url: DatabaseUrl, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsysbinary: pytest.CaptureFixture[bytes]) -> None:  # fmt: skip
    ids = _registered(store, tmp_path / "payloads")
    monkeypatch.setenv("TRIAGE_DATABASE_URL", db_url.libpq())
    external_id, job_id = sorted(ids.items())[2]
    assert main(["payload", str(job_id)]) == 0
    assert json.loads(capsysbinary.readouterr().out)["external_id"] == external_id
    assert main(["payload", str(job_id).upper()]) == 0  # any spelling of the UUID
    assert json.loads(capsysbinary.readouterr().out)["external_id"] == external_id
    assert main(["payload", str(uuid.uuid4())]) == 1
    assert b"no job" in capsysbinary.readouterr().err
    assert main(["payload", "not-a-uuid"]) == 1
    assert b"not a job id" in capsysbinary.readouterr().err


def test_refuses_a_document_that_does_not_match_its_hash(store: JobStore, db_url: DatabaseUrl,
                                                         tmp_path: Path) -> None:  # fmt: skip
    ids = _registered(store, tmp_path / "payloads")
    [pack] = [p for p in (tmp_path / "payloads").rglob("*") if p.is_file()]
    pack.write_bytes(pack.read_bytes().upper())
    with pytest.raises(PayloadCorrupt):
        job_payload(db_url, str(next(iter(ids.values()))))
