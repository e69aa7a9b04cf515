"""retrieve() against a real PostgreSQL and a real payload folder: identity, idempotency, claim check."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from triage.contracts.documents import DocumentPayload
from triage.jobs.store import JobStore
from triage.payloads import PayloadCorrupt, PayloadRefInvalid, PayloadStore
from triage.pipeline.retrieve import RetrieveResult, idempotency_key, retrieve
from triage.sources.base import Source
from triage.sources.jsonl import JsonlSource
from triage.sources.synthetic import SyntheticSource

START = datetime(2026, 11, 1, tzinfo=UTC)
END = datetime(2026, 11, 2, tzinfo=UTC)
BATCH = f"{START.isoformat()}/{END.isoformat()}"
VERSION = "keyword-v1+tax-test"


def run(
    store: JobStore, source: Source, payloads: PayloadStore, *, version: str = VERSION, chunk: int = 5000
) -> RetrieveResult:
    return retrieve(
        store,
        source,
        payloads,
        start=START,
        end=END,
        batch_key=BATCH,
        classifier_version=version,
        max_attempts=3,
        chunk=chunk,
    )


def rows(store: JobStore, sql: str, **params: object) -> list[sa.Row]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


def scalar(store: JobStore, sql: str, **params: object) -> object:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def payload_files(base: Path) -> list[Path]:
    return [p for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")]


# -- synthetic source ----------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [pytest.param(5000, id="one-chunk"), pytest.param(7, id="many-chunks")])
def test_one_job_per_document_and_a_rerun_registers_nothing(store: JobStore, tmp_path: Path, chunk: int) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    source = SyntheticSource(40, seed=3)
    first = run(store, source, payloads, chunk=chunk)
    assert (first.read, first.registered, first.existing, first.malformed) == (40, 40, 0, 0)
    assert scalar(store, "SELECT count(*) FROM triage.jobs") == 40
    assert rows(store, "SELECT DISTINCT status, step, batch_key, attempt, max_attempts FROM triage.jobs") == [
        ("queued", "classify", BATCH, 0, 3)
    ]
    external = {r.external_id for r in rows(store, "SELECT external_id FROM triage.jobs")}
    assert external == {d.external_id for d in source.read(START, END)}

    again = run(store, source, payloads, chunk=chunk)
    assert (again.read, again.registered, again.existing) == (40, 0, 40)
    assert scalar(store, "SELECT count(*) FROM triage.jobs") == 40
    assert scalar(store, "SELECT count(*) FROM triage.outbox") == 40


@pytest.mark.parametrize("chunk", [pytest.param(5000, id="one-chunk"), pytest.param(4, id="across-chunks")])
def test_duplicate_deliveries_register_once(store: JobStore, tmp_path: Path, chunk: int) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    source = SyntheticSource(30, seed=11, duplicate_rate=0.5)
    delivered = list(source.read(START, END))
    assert len(delivered) == 45  # 15 redeliveries: the test exercises duplicates at all
    result = run(store, source, payloads, chunk=chunk)
    assert (result.read, result.registered, result.existing) == (45, 30, 15)
    assert scalar(store, "SELECT count(*) FROM triage.jobs") == 30
    assert scalar(store, "SELECT count(DISTINCT external_id) FROM triage.jobs") == 30
    assert scalar(store, "SELECT count(*) FROM triage.outbox") == 30


def test_payloads_are_stored_once_per_pack_and_read_back_verified(store: JobStore, tmp_path: Path) -> None:
    base = tmp_path / "payloads"
    payloads = PayloadStore(base)
    source = SyntheticSource(25, seed=5, duplicate_rate=0.4)
    delivered = list(source.read(START, END))
    run(store, source, payloads)
    jobs = rows(store, "SELECT external_id, content_sha256, payload_ref FROM triage.jobs")
    assert len(jobs) == 25
    [pack] = payload_files(base)  # one chunk, one pack
    body = pack.read_bytes()
    assert pack.name == hashlib.sha256(body).hexdigest()  # the pack is content-addressed
    assert len(body) == sum(len(c) for c in {d.content for d in delivered})  # redeliveries wrote nothing twice
    assert all(j.payload_ref.startswith(f"{pack.as_uri()}#offset=") for j in jobs)
    by_id = {d.external_id: d.content for d in delivered}
    for job in jobs:
        content = payloads.get(job.payload_ref, job.content_sha256)
        assert hashlib.sha256(content).hexdigest() == job.content_sha256
        assert content == by_id[job.external_id]
        assert DocumentPayload.from_bytes(content).external_id == job.external_id
    # Events carry the reference, never the document: no payload column holds text.
    assert scalar(store, "SELECT count(*) FROM triage.outbox WHERE payload <> '{}'::jsonb") == 0

    run(store, source, payloads)  # the same chunk again: the same pack, not written twice
    assert [(p.name, p.stat().st_mtime_ns) for p in payload_files(base)] == [(pack.name, pack.stat().st_mtime_ns)]


def test_packs_are_cut_at_their_size_and_each_payload_reads_back(store: JobStore, tmp_path: Path) -> None:
    base = tmp_path / "payloads"
    payloads = PayloadStore(base, pack_bytes=4000)
    source = SyntheticSource(30, seed=6)
    run(store, source, payloads, chunk=20)  # two chunks: 20 and 10 documents
    sizes = [p.stat().st_size for p in payload_files(base)]
    total = sum(len(d.content) for d in source.read(START, END))
    assert sum(sizes) == total
    assert len(sizes) > 2  # the chunks were cut into several packs
    assert all(size <= 4000 for size in sizes)
    for job in rows(store, "SELECT content_sha256, payload_ref FROM triage.jobs"):
        assert hashlib.sha256(payloads.get(job.payload_ref, job.content_sha256)).hexdigest() == job.content_sha256


def test_a_payload_alone_is_its_own_object_and_refs_are_checked(tmp_path: Path) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    digest, ref = payloads.put(b"one document")
    assert ref == (tmp_path / "payloads" / digest[:2] / digest).as_uri()  # no fragment: the whole object
    assert payloads.get(ref, digest) == b"one document"
    [(_, packed)] = [r for r in payloads.put_many([b"a", b"b"]) if r[0] == hashlib.sha256(b"b").hexdigest()]
    assert packed.endswith("#offset=1&length=1")
    for broken in (
        f"{ref}#offset=x&length=1",
        f"{ref}#offset=0",
        f"{ref}#offset=-1&length=1",
        f"{ref}#offset=0&length={2**40}",
    ):
        with pytest.raises(PayloadRefInvalid):
            payloads.get(broken, digest)
    with pytest.raises(PayloadCorrupt, match="cut short"):
        payloads.get(packed.replace("length=1", "length=5"), hashlib.sha256(b"b").hexdigest())


def test_payloads_on_object_storage_are_packed_and_verified(store: JobStore) -> None:
    base = f"memory://triage-test-{uuid.uuid4().hex}"
    payloads = PayloadStore(base)
    source = SyntheticSource(10, seed=4, duplicate_rate=0.5)
    assert run(store, source, payloads).registered == 10
    jobs = rows(store, "SELECT content_sha256, payload_ref FROM triage.jobs")
    fs = payloads.base.fs
    [pack] = fs.find(base)  # one object for the chunk, not one per document
    assert all(j.payload_ref.startswith(f"memory://{pack.lstrip('/')}#offset=") for j in jobs)
    for j in jobs:
        assert hashlib.sha256(payloads.get(j.payload_ref, j.content_sha256)).hexdigest() == j.content_sha256
    # Objects under the base are reached from the base (its connection and options), not re-parsed.
    assert payloads.object_path(jobs[0].payload_ref) == payloads.base.joinpath(*pack.rsplit("/", 2)[-2:])
    # A sparse batch from one pack: ranged requests, each payload's own bytes.
    sparse = [jobs[0], jobs[-1]]
    got = payloads.get_many([(j.payload_ref, j.content_sha256) for j in sparse])
    assert [hashlib.sha256(g).hexdigest() for g in got if isinstance(g, bytes)] == [j.content_sha256 for j in sparse]


def test_a_new_classifier_version_is_new_work(store: JobStore, tmp_path: Path) -> None:
    base = tmp_path / "payloads"
    payloads = PayloadStore(base)
    source = SyntheticSource(12, seed=2)
    run(store, source, payloads, version="v1")
    second = run(store, source, payloads, version="v2")
    assert (second.registered, second.existing) == (12, 0)
    assert rows(store, "SELECT classifier_version, count(*) FROM triage.jobs GROUP BY 1 ORDER BY 1") == [
        ("v1", 12),
        ("v2", 12),
    ]
    assert len(payload_files(base)) == 1  # same documents, same pack
    assert run(store, source, payloads, version="v2").registered == 0


def test_every_registered_job_has_one_registered_event(store: JobStore, tmp_path: Path) -> None:
    run(store, SyntheticSource(20, seed=9, duplicate_rate=0.3), PayloadStore(tmp_path / "p"))
    assert rows(
        store,
        """
        SELECT count(*) FILTER (WHERE o.event_type = 'job.registered' AND o.attempt = 0 AND (o.txid, o.event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)),
               count(*)
        FROM triage.jobs j LEFT JOIN triage.outbox o ON o.job_id = j.id
    """,
    ) == [(20, 20)]
    assert (
        scalar(
            store, "SELECT count(*) FROM triage.outbox o LEFT JOIN triage.jobs j ON j.id = o.job_id WHERE j.id IS NULL"
        )
        == 0
    )


# -- jsonl inbox ----------------------------------------------------------------------------


def line(**fields: object) -> str:
    return json.dumps(fields)


GOOD = dict(subject="Refund", body="I want my money back", received_at="2026-11-01T09:30:00+01:00")

INBOX_LINES: dict[str, list[str]] = {
    "a.jsonl": [
        line(id="T-1", **GOOD),
        "{not json",
        "",
        line(id="T-2", subject="x", body="y"),  # missing received_at
        "   ",
        line(id="T-3", **GOOD, extra="field"),
        line(id="T-4", subject="x", body="y", received_at="2026-11-01T09:30:00"),  # naive time
    ],
    "b.jsonl": [
        "[1, 2, 3]",
        line(id="", **GOOD),
        line(id="T-5", **GOOD, channel="email"),
        "{not json",  # the same broken bytes again, elsewhere: still its own job
    ],
}
MALFORMED = {
    "2026-11-01/a.jsonl:2": "invalid_json",
    "2026-11-01/a.jsonl:4": "missing_field",
    "2026-11-01/a.jsonl:6": "unexpected_field",
    "2026-11-01/a.jsonl:7": "naive_received_at",
    "2026-11-01/b.jsonl:1": "not_an_object",
    "2026-11-01/b.jsonl:2": "empty_id",
    "2026-11-01/b.jsonl:4": "invalid_json",
}


def write_inbox(root: Path, files: dict[str, list[str]], day: str = "2026-11-01") -> None:
    folder = root / day
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_jsonl_malformed_lines_go_to_review_and_nothing_is_lost(store: JobStore, tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    write_inbox(inbox, INBOX_LINES)
    write_inbox(inbox, {"c.jsonl": [line(id="T-other-day", **GOOD)]}, day="2026-11-02")  # outside the interval
    non_blank = sum(1 for lines in INBOX_LINES.values() for text in lines if text.strip())
    result = run(store, JsonlSource(inbox), PayloadStore(tmp_path / "payloads"))
    assert (result.read, result.registered, result.malformed) == (non_blank, non_blank, len(MALFORMED))
    assert scalar(store, "SELECT count(*) FROM triage.jobs") == non_blank

    review = rows(
        store,
        """
        SELECT j.external_id, j.status, j.status_reason, j.last_error, r.reason, r.context, r.resolved_at
        FROM triage.jobs j JOIN triage.manual_review r ON r.job_id = j.id
    """,
    )
    assert {r.external_id: r.last_error for r in review} == MALFORMED
    for r in review:
        assert (r.status, r.status_reason, r.reason, r.resolved_at) == (
            "manual_review",
            "malformed_input",
            "malformed_input",
            None,
        )
        assert r.context == {"external_id": r.external_id, "malformed_reason": MALFORMED[r.external_id]}
    queued = rows(store, "SELECT external_id FROM triage.jobs WHERE status = 'queued' ORDER BY 1")
    assert [r.external_id for r in queued] == ["T-1", "T-5"]
    assert scalar(store, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.registered'") == non_blank

    # The raw bytes of a malformed line are kept for the reviewer, hash-verified.
    payloads = PayloadStore(tmp_path / "payloads")
    ref, digest = rows(
        store, "SELECT payload_ref, content_sha256 FROM triage.jobs WHERE external_id = '2026-11-01/a.jsonl:2'"
    )[0]
    assert payloads.get(ref, digest) == b"{not json"

    again = run(store, JsonlSource(inbox), PayloadStore(tmp_path / "payloads"))
    assert (again.registered, again.existing) == (0, non_blank)
    assert scalar(store, "SELECT count(*) FROM triage.manual_review") == len(MALFORMED)


def test_jsonl_same_instant_in_another_offset_is_the_same_document(store: JobStore, tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    write_inbox(
        inbox,
        {
            "a.jsonl": [
                line(id="T-1", subject="s", body="b", received_at="2026-11-01T09:30:00+01:00"),
                line(id="T-1", subject="s", body="b", received_at="2026-11-01T08:30:00Z"),
                line(id="T-1", subject="s", body="edited", received_at="2026-11-01T08:30:00Z"),
            ]
        },
    )
    result = run(store, JsonlSource(inbox), PayloadStore(tmp_path / "payloads"))
    assert (result.read, result.registered, result.existing) == (3, 2, 1)  # an edit is new work


# -- the idempotency key ---------------------------------------------------------------------

H1, H2 = "a" * 64, "b" * 64


@pytest.mark.parametrize(
    ("one", "other", "naive_separator"),
    [
        pytest.param(("s", "a", H1, f"x/{H2}/v"), ("s", f"a/{H1}/x", H2, "v"), "/", id="slash-shifts-fields"),
        pytest.param(("s", "a", H1, f"x:{H2}:v"), ("s", f"a:{H1}:x", H2, "v"), ":", id="colon-shifts-fields"),
        pytest.param(("s:a", "b", H1, "v"), ("s", "a:b", H1, "v"), ":", id="source-and-id"),
    ],
)
def test_idempotency_key_is_unambiguous(
    one: tuple[str, str, str, str], other: tuple[str, str, str, str], naive_separator: str
) -> None:
    assert naive_separator.join(one) == naive_separator.join(other)  # a plain join would collide
    assert idempotency_key(*one) != idempotency_key(*other)


def test_external_ids_with_separators_do_not_collide(store: JobStore, tmp_path: Path) -> None:
    ids = ["a", "a/b", "a:b", "a/b:c", "2026-11-01/a.jsonl:2", "a/", "/a", ":", "1:a"]
    inbox = tmp_path / "inbox"
    write_inbox(inbox, {"a.jsonl": [line(id=i, **GOOD) for i in ids]})
    result = run(store, JsonlSource(inbox), PayloadStore(tmp_path / "payloads"))
    assert result.registered == len(ids)
    keys = rows(store, "SELECT external_id, content_sha256, idempotency_key FROM triage.jobs")
    assert sorted(k.external_id for k in keys) == sorted(ids)
    for k in keys:
        assert k.idempotency_key == idempotency_key("jsonl", k.external_id, k.content_sha256, VERSION)
        assert k.idempotency_key.startswith(f"jsonl/{len(k.external_id)}:{k.external_id}/")
