"""``python -m triage payload JOB_ID``: a reviewer reads a job's document through its reference,
from the deployment's payload base and nowhere else."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from triage.cli import job_payload, main
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore
from triage.payload_packs import LOCK_NAME
from triage.payloads import PayloadCorrupt, PayloadRefInvalid, PayloadStore
from triage.pipeline.retrieve import retrieve
from triage.sources.synthetic import SyntheticSource

START = datetime(2026, 11, 1, tzinfo=UTC)


def _registered(store: JobStore, base: Path) -> dict[str, uuid.UUID]:
    retrieve(
        store,
        SyntheticSource(5, seed=8),
        PayloadStore(base),
        start=START,
        end=START + timedelta(days=1),
        batch_key="b",
        classifier_version="v",
        max_attempts=3,
    )
    with store.engine.connect() as conn:
        return {r.external_id: r.id for r in conn.exec_driver_sql("SELECT external_id, id FROM triage.jobs")}


def test_prints_the_document_of_a_job_in_a_pack(
    store: JobStore,
    db_url: DatabaseUrl,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    ids = _registered(store, tmp_path / "payloads")
    monkeypatch.setenv("TRIAGE_DATABASE_URL", db_url.libpq())
    monkeypatch.setenv("TRIAGE_PAYLOAD_BASE", str(tmp_path / "payloads"))
    external_id, job_id = sorted(ids.items())[2]
    assert main(["payload", str(job_id)]) == 0
    assert json.loads(capsysbinary.readouterr().out)["external_id"] == external_id
    assert main(["payload", str(job_id).upper()]) == 0  # any spelling of the UUID
    assert json.loads(capsysbinary.readouterr().out)["external_id"] == external_id
    assert main(["payload", str(uuid.uuid4())]) == 1
    assert b"no job" in capsysbinary.readouterr().err
    assert main(["payload", "not-a-uuid"]) == 1
    assert b"not a job id" in capsysbinary.readouterr().err


def test_refuses_a_document_that_does_not_match_its_hash(store: JobStore, db_url: DatabaseUrl, tmp_path: Path) -> None:
    ids = _registered(store, tmp_path / "payloads")
    [pack] = [p for p in (tmp_path / "payloads").rglob("*") if p.is_file() and p.name != LOCK_NAME]
    pack.write_bytes(pack.read_bytes().upper())
    with pytest.raises(PayloadCorrupt):
        job_payload(db_url, str(next(iter(ids.values()))), str(tmp_path / "payloads"))


def test_reads_only_from_the_payload_base(
    store: JobStore,
    db_url: DatabaseUrl,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """A row's ``payload_ref`` naming a file outside the base is refused, never printed: the
    command reads through the configured store, not through whatever path the row holds."""
    ids = _registered(store, tmp_path / "payloads")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s3cr3t")
    job_id = next(iter(ids.values()))
    with store.engine.begin() as conn:  # what a holder of the app role could write into a row
        conn.exec_driver_sql(
            "UPDATE triage.jobs SET payload_ref = %(ref)s, content_sha256 = %(sha)s WHERE id = %(id)s",
            {"ref": secret.as_uri(), "sha": hashlib.sha256(b"s3cr3t").hexdigest(), "id": job_id},
        )
    monkeypatch.setenv("TRIAGE_DATABASE_URL", db_url.libpq())
    monkeypatch.setenv("TRIAGE_PAYLOAD_BASE", str(tmp_path / "payloads"))
    assert main(["payload", str(job_id)]) == 1
    out, err = capsysbinary.readouterr()
    assert (out, b"is not under the payload base" in err, b"s3cr3t" in err) == (b"", True, False)
    with pytest.raises(PayloadRefInvalid):
        job_payload(db_url, str(job_id), str(tmp_path))  # a wider base is not a way round it: not the store's form
    other = next(i for i in ids.values() if i != job_id)
    assert main(["payload", str(other), "--payload-base", str(tmp_path / "elsewhere")]) == 1  # another base
    assert b"is not under the payload base" in capsysbinary.readouterr().err
    assert main(["payload", str(other), "--payload-base", str(tmp_path / "payloads")]) == 0
