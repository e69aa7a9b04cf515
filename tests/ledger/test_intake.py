"""Intake (``POST /triage/api/documents``) over real HTTP, on the real database, behind Airflow's
real auth manager: what is acknowledged is committed, what is refused registers nothing, and a
server killed between the commit and the answer loses and doubles nothing.

The server is uvicorn serving the Triage app mounted at ``/triage`` (``tests/ledger/
intake_server.py``); the asset event is a recorded stand-in here (the real one is
``tests/drills/test_make_up.py``'s).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.ledger.intake_server import ROOT_PATH, ThreadServer, free_port, root_app, wait_listening
from tests.ledger.test_triage_web import airflow_auth, as_user  # noqa: F401 - the module's auth fixture
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClassificationRecord, Complete, LabelWrite, SendToReview
from triage.web import intake_service

URL = f"{ROOT_PATH}/api/documents"
JSON = {"Content-Type": "application/json"}


def doc(external_id: str, **overrides: Any) -> dict[str, Any]:
    return {
        "source": "helpdesk",
        "external_id": external_id,
        "subject": "Refund please",
        "body": "I was charged twice for my order, please refund the duplicate charge.",
        "received_at": "2026-12-01T09:00:00+00:00",
        **overrides,
    }


class Announcements:
    def __init__(self) -> None:
        self.calls: list[int] = []
        self.working = True

    def __call__(self, n: int) -> bool:
        if not self.working:
            return False
        self.calls.append(n)
        return True


@pytest.fixture
def announced() -> Announcements:
    return Announcements()


@pytest.fixture
def server(store: JobStore, tmp_path: Path, announced: Announcements, airflow_auth: Any) -> Iterator[ThreadServer]:  # noqa: F811
    with ThreadServer(root_app(store, str(tmp_path / "payloads"), announced)) as running:
        yield running


@pytest.fixture
def poster(airflow_auth: Any) -> dict[str, str]:  # noqa: F811
    return {**as_user(airflow_auth, "editor", "user"), **JSON}


def post(server: ThreadServer, body: Any, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(server.url + URL, content=json.dumps(body), headers=headers, timeout=30)


def ledger(store: JobStore) -> dict[str, Any]:
    with store.engine.connect() as conn:
        return {
            "jobs": conn.execute(
                sa.text("SELECT external_id, id, status, batch_key, correlation_id FROM triage.jobs ORDER BY 1")
            ).all(),
            "events": conn.execute(sa.text("SELECT job_id, event_type FROM triage.outbox ORDER BY 1")).all(),
        }


# -- accepted, once ------------------------------------------------------------------------------


def test_two_documents_then_one_again_answer_202_202_200_with_two_jobs(
    server: ThreadServer, store: JobStore, poster: dict[str, str], announced: Announcements
) -> None:
    first = post(server, doc("T-1"), poster)
    second = post(server, doc("T-2", correlation_id="client-trace-42"), poster)
    again = post(server, doc("T-1"), poster)
    assert [first.status_code, second.status_code, again.status_code] == [202, 202, 200]
    assert first.json()["status"] == "accepted"
    assert again.json() == {**first.json(), "status": "existing"}
    assert first.json()["job_id"] != second.json()["job_id"]
    assert second.json()["correlation_id"] == "client-trace-42"
    assert first.json()["correlation_id"]  # minted at intake: the job's own id
    rows = ledger(store)
    assert [(r.external_id, str(r.id), r.status, r.batch_key) for r in rows["jobs"]] == [
        ("T-1", first.json()["job_id"], "queued", "intake"),
        ("T-2", second.json()["job_id"], "queued", "intake"),
    ]
    assert sorted(e.event_type for e in rows["events"]) == ["job.registered", "job.registered"]
    assert announced.calls == [1, 1, 1]  # the repeat still queued: told again (its first answer may be lost)


def test_a_batch_answers_per_document_and_a_repeat_inside_it_is_one_job(
    server: ThreadServer, store: JobStore, poster: dict[str, str]
) -> None:
    response = post(server, {"documents": [doc("B-1"), doc("B-2"), doc("B-1")]}, poster)
    assert response.status_code == 202
    entries = response.json()["documents"]
    assert [(e["index"], e["external_id"], e["status"]) for e in entries] == [
        (0, "B-1", "accepted"),
        (1, "B-2", "accepted"),
        (2, "B-1", "existing"),
    ]
    assert entries[0]["job_id"] == entries[2]["job_id"]
    assert len(ledger(store)["jobs"]) == 2
    assert post(server, {"documents": [doc("B-2"), doc("B-1")]}, poster).status_code == 200


def test_an_edited_document_is_new_work(server: ThreadServer, store: JobStore, poster: dict[str, str]) -> None:
    first = post(server, doc("E-1"), poster)
    edited = post(server, doc("E-1", body="Actually it was charged three times."), poster)
    assert (first.status_code, edited.status_code) == (202, 202)
    assert first.json()["job_id"] != edited.json()["job_id"]


def test_the_status_endpoint_follows_the_job_to_its_label(
    server: ThreadServer, store: JobStore, poster: dict[str, str]
) -> None:
    job_id = post(server, doc("S-1"), poster).json()["job_id"]
    where = httpx.get(f"{server.url}{URL}/{job_id}", headers=poster).json()
    assert (where["status"], where["label"], where["review_reason"]) == ("queued", None, None)
    claim = store.claim(batch_key="intake", step="classify", limit=10, lease_seconds=60, owner="w")
    [job] = claim.jobs
    answer = ClassificationRecord("refund_request", 0.93, "accepted", "keyword-test-v1")
    label = LabelWrite("refund_request", 0.93, "keyword-test-v1")
    store.record(claim, [Complete(job.id, job.attempt, label, answer)])
    where = httpx.get(f"{server.url}{URL}/{job_id}", headers=poster).json()
    assert (where["status"], where["label"], where["confidence"]) == ("completed", "refund_request", 0.93)
    assert httpx.get(f"{server.url}{URL}/{uuid.uuid4()}", headers=poster).status_code == 404


# -- refused, registering nothing ------------------------------------------------------------------


HOSTILE_IDS = [
    pytest.param("../../etc/passwd", id="path-traversal"),
    pytest.param("/etc/passwd", id="absolute-path"),
    pytest.param("a\\..\\b", id="backslash-traversal"),
    pytest.param("bell\x07id", id="control-char"),
    pytest.param("nul\x00id", id="nul"),
    pytest.param("line\nbreak", id="newline"),
    pytest.param("rtl\u202eid", id="bidi-override"),
    pytest.param("x" * 513, id="too-long"),
    pytest.param("x" * 100_000, id="huge"),
    pytest.param("  ", id="blank"),
    pytest.param("", id="empty"),
]


@pytest.mark.parametrize("external_id", HOSTILE_IDS)
def test_a_hostile_id_gets_422_and_registers_nothing(
    server: ThreadServer, store: JobStore, poster: dict[str, str], external_id: str, tmp_path: Path
) -> None:
    response = post(server, doc(external_id), poster)
    assert response.status_code == 422
    [entry] = response.json()["detail"]
    assert entry["status"] == "invalid"
    assert entry["external_id"] is None  # a hostile id is never echoed
    assert [e["field"] for e in entry["errors"]] == ["external_id"]
    assert ledger(store)["jobs"] == []
    assert not (tmp_path / "payloads").exists()  # nor stored a payload


BAD_DOCUMENTS = [
    pytest.param({k: v for k, v in doc("M-1").items() if k != "body"}, "body", id="missing-body"),
    pytest.param(doc("M-2", received_at="2026-12-01T09:00:00"), "received_at", id="naive-received-at"),
    pytest.param(doc("M-3", received_at=1764579600), "received_at", id="epoch-received-at"),
    pytest.param(doc("M-4", subject=42), "subject", id="subject-not-text"),
    pytest.param(doc("M-5", source="Help Desk"), "source", id="bad-source"),
    pytest.param(doc("M-6", surprise=True), "surprise", id="unknown-field"),
    pytest.param(doc("M-7", correlation_id="has space"), "correlation_id", id="bad-correlation-id"),
    pytest.param(doc("M-8", metadata={"nested": {"a": 1}}), "metadata.nested", id="nested-metadata"),
    pytest.param(doc("M-9", body="x" * 1_000_001), "body", id="body-too-long"),
]


def test_a_batch_with_invalid_documents_gets_422_per_document_and_registers_only_the_valid(
    server: ThreadServer, store: JobStore, poster: dict[str, str]
) -> None:
    bad = [p.values[0] for p in BAD_DOCUMENTS]
    response = post(server, {"documents": [doc("OK-1"), *bad, doc("OK-2")]}, poster)
    assert response.status_code == 422
    entries = response.json()["documents"]
    assert [e["status"] for e in entries] == ["accepted", *["invalid"] * len(bad), "accepted"]
    for entry, param in zip(entries[1:-1], BAD_DOCUMENTS, strict=True):
        assert any(e["field"].startswith(param.values[1]) for e in entry["errors"]), (param.id, entry)
        assert "x" * 100 not in json.dumps(entry)  # no document text in an error
    assert [r.external_id for r in ledger(store)["jobs"]] == ["OK-1", "OK-2"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        pytest.param(b"{not json", 422, "not JSON", id="invalid-json"),
        pytest.param(b"[1, 2]", 422, "one document", id="not-an-object"),
        pytest.param(b'{"documents": []}', 422, "no document", id="empty-batch"),
        pytest.param(b'{"documents": {}}', 422, "nothing else", id="batch-not-a-list"),
        pytest.param(b'{"documents": [], "x": 1}', 422, "nothing else", id="batch-with-extra"),
        pytest.param(b"\xff\xfe", 422, "not JSON", id="not-utf8"),
    ],
)
def test_a_body_that_is_no_document_gets_a_clear_error(
    server: ThreadServer, store: JobStore, poster: dict[str, str], body: bytes, status: int, says: str
) -> None:
    response = httpx.post(server.url + URL, content=body, headers=poster, timeout=30)
    assert response.status_code == status
    assert says in json.dumps(response.json()["detail"])
    assert ledger(store)["jobs"] == []


def test_a_body_that_is_not_json_typed_gets_415(server: ThreadServer, store: JobStore, poster: dict[str, str]) -> None:
    headers = {**poster, "Content-Type": "text/plain"}
    assert httpx.post(server.url + URL, content=json.dumps(doc("C-1")), headers=headers).status_code == 415
    assert ledger(store)["jobs"] == []


def test_a_batch_over_the_limit_gets_413_and_registers_nothing(
    server: ThreadServer, store: JobStore, poster: dict[str, str]
) -> None:
    response = post(server, {"documents": [doc(f"L-{i}") for i in range(501)]}, poster)
    assert response.status_code == 413
    assert "at most 500" in response.json()["detail"]
    assert ledger(store)["jobs"] == []


def _raw_post(port: int, headers: dict[str, str], chunks: Iterator[bytes]) -> tuple[bytes, int]:
    """POST over a bare socket, sending ``chunks`` only while the server has not answered;
    returns the answer's first bytes and how many body bytes were sent before it came."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # what is sent is what left here
    head = f"POST {URL} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall((head + "\r\n").encode())
    sent, pending = 0, b""
    try:
        while True:
            readable, writable, _ = select.select([sock], [sock], [], 30)
            if readable:
                return sock.recv(65536), sent
            if not pending:
                pending = next(chunks, b"")
                if not pending:
                    readable, _, _ = select.select([sock], [], [], 30)
                    return sock.recv(65536), sent
            if writable:
                n = sock.send(pending)
                sent, pending = sent + n, pending[n:]
    finally:
        sock.close()


TWENTY_MB = 20 * 1000 * 1000


def test_a_20_mb_body_declared_is_refused_before_it_is_read(
    server: ThreadServer, store: JobStore, poster: dict[str, str]
) -> None:
    headers = {**poster, "Content-Length": str(TWENTY_MB)}
    answer, sent = _raw_post(server.port, headers, iter([b"x" * 65536] * (TWENTY_MB // 65536 + 1)))
    assert answer.startswith(b"HTTP/1.1 413")
    assert sent < 4 << 20, sent  # answered while most of the body was still unsent
    assert ledger(store)["jobs"] == []


def test_a_20_mb_chunked_body_is_refused_while_it_is_read(
    server: ThreadServer, store: JobStore, poster: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Content-Length to refuse up front: the server counts while it reads and answers 413 at
    its limit (1 MiB here), while the client has sent far less than the 20 MB it meant to (what
    it did send past the limit sits in loopback's socket buffers, a few MB at most)."""
    monkeypatch.setenv("TRIAGE_INTAKE_MAX_BODY_BYTES", str(1 << 20))
    piece = 256 * 1024

    def chunks() -> Iterator[bytes]:
        for _ in range(TWENTY_MB // piece):
            yield f"{piece:x}\r\n".encode() + b"x" * piece + b"\r\n"
        yield b"0\r\n\r\n"

    answer, sent = _raw_post(server.port, {**poster, "Transfer-Encoding": "chunked"}, chunks())
    assert answer.startswith(b"HTTP/1.1 413")
    assert sent < 10 << 20, sent
    assert ledger(store)["jobs"] == []


# -- who may post -------------------------------------------------------------------------------------


def test_without_a_token_401_with_a_bad_one_or_a_reader_s_403(
    server: ThreadServer,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
) -> None:
    assert post(server, doc("A-1"), JSON).status_code == 401
    assert post(server, doc("A-1"), {**JSON, "Authorization": "Bearer not.a.jwt"}).status_code == 403
    viewer = post(server, doc("A-1"), {**as_user(airflow_auth, "viewer", "viewer"), **JSON})
    assert viewer.status_code == 403
    assert "classify_intake" in viewer.json()["detail"]
    assert ledger(store)["jobs"] == []


@pytest.mark.parametrize(
    "origin",
    [
        pytest.param("null", id="null"),
        pytest.param("http://evil.test", id="another-host"),
        pytest.param("http://127.0.0.1:1", id="another-port"),
        pytest.param("http://[", id="unparsable"),
    ],
)
def test_a_session_post_from_another_origin_is_refused(
    server: ThreadServer,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
    origin: str,
) -> None:
    """A post carrying the UI session (the ``_token`` cookie) is checked as every session request
    of the app is (docs/security.md): another origin, or ``null`` (a sandboxed frame, a ``data:``
    page), is refused and registers nothing; the same post from the server's own origin, or
    without an ``Origin`` (no browser page), is accepted."""
    from tests.ledger.test_triage_web import token

    cookies = {"_token": token(airflow_auth, "editor", "user")}
    url, body = server.url + URL, json.dumps(doc("S-1"))
    refused = httpx.post(url, content=body, headers={**JSON, "Origin": origin}, cookies=cookies, timeout=30)
    assert refused.status_code == 403, refused.text
    assert "Origin" in refused.json()["detail"]
    assert ledger(store)["jobs"] == []
    own = httpx.post(url, content=body, headers={**JSON, "Origin": server.url}, cookies=cookies, timeout=30)
    assert own.status_code == 202, own.text
    script = httpx.post(url, content=json.dumps(doc("S-2")), headers=JSON, cookies=cookies, timeout=30)
    assert script.status_code == 202, script.text


# -- backpressure -------------------------------------------------------------------------------------


def test_a_full_queue_answers_429_with_retry_after_until_work_is_claimed(
    server: ThreadServer, store: JobStore, poster: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIAGE_INTAKE_MAX_QUEUED", "3")
    monkeypatch.setenv("TRIAGE_INTAKE_RETRY_AFTER_SECONDS", "7")
    # The depth cache's age is set, not slept: a loaded machine took longer than its second
    # between two posts and the cached answer this test expects was measured again.
    monkeypatch.setattr(intake_service, "DEPTH_TTL_SECONDS", 3600.0)
    assert post(server, {"documents": [doc("Q-1"), doc("Q-2"), doc("Q-3")]}, poster).status_code == 202
    refused = post(server, doc("Q-4"), poster)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "7"
    assert [r.external_id for r in ledger(store)["jobs"]] == ["Q-1", "Q-2", "Q-3"]
    claim = store.claim(batch_key="intake", step="classify", limit=1, lease_seconds=60, owner="w")
    monkeypatch.setattr(intake_service, "DEPTH_TTL_SECONDS", 0.0)  # the measurement has expired
    assert post(server, doc("Q-4"), poster).status_code == 429  # a claimed job is unfinished work all the same
    model = ClassificationRecord("billing", 0.41, "inconclusive", "keyword-v1")
    store.record(claim, [SendToReview(j.id, j.attempt, "inconclusive", classification=model) for j in claim.jobs])
    assert post(server, doc("Q-4"), poster).status_code == 202  # measured again: 2 unfinished


def test_backpressure_holds_through_a_model_outage(
    server: ThreadServer, store: JobStore, poster: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #25, finding 4: with a bound of 3, four outage cycles (post, then ``classify_intake``
    parks what it could not classify) left 12 documents unclassified; parked (``waiting``) work
    counts, so the second cycle is refused and 3 wait."""
    monkeypatch.setenv("TRIAGE_INTAKE_MAX_QUEUED", "3")
    monkeypatch.setattr(intake_service, "DEPTH_TTL_SECONDS", 0.0)
    answers = []
    for cycle in range(4):
        batch = {"documents": [doc(f"O-{cycle}-{i}") for i in range(3)]}
        answers.append(post(server, batch, poster).status_code)
        store.park_unstarted(
            "intake",
            "classify",
            dependency="model",
            delay_seconds=300,
            error_class="server_error",
            error="HTTP 503",
            actor="classify_intake/asset_triggered__x/classify/0/try1",
        )
    assert answers == [202, 429, 429, 429]
    assert [r.status for r in ledger(store)["jobs"]] == ["waiting"] * 3


@pytest.mark.own_database  # VACUUM runs outside a transaction
def test_the_queue_depth_is_read_from_the_batch_index_and_bounded(store: JobStore) -> None:
    """Beside 300,000 queued jobs of a daily batch, the depth check of intake's 3,000 is one index
    scan of the batch's entries (never the table), which stops at its bound."""
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
                " classifier_version, correlation_id, batch_key, step, status, max_attempts)"
                " SELECT 'k' || i, 's', 'e' || i, 'h', 'r', 'v', 'c', CASE WHEN i % 101 = 0 THEN 'intake'"
                " ELSE '2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00' END, 'classify', 'queued', 3"
                " FROM generate_series(1, 303000) i"
            )
        )
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE triage.jobs"))
    assert store.intake.unfinished_depth(bound=1000) == 1000
    assert store.intake.unfinished_depth(bound=10**7) == 3000
    from tests.ledger.test_plans import _explain
    from triage.jobs.sql.reads.intake import unfinished_depth

    with store.engine.connect() as conn:
        for bound in (1000, 50_000):
            nodes = _explain(conn, unfinished_depth(), {"p_batch_key": "intake", "bound": bound})
            scans = [(n["Node Type"], n.get("Index Name"), n["Actual Rows"]) for n in nodes if "Scan" in n["Node Type"]]
            [(kind, index, rows)] = scans
            assert kind in ("Index Only Scan", "Index Scan"), scans
            assert index == "jobs_batch_key_status_idx", scans
            assert rows == min(bound, 3000), scans


# -- Airflow not told -------------------------------------------------------------------------------


def test_when_airflow_cannot_be_told_503_and_the_repeat_tells_it(
    server: ThreadServer, store: JobStore, poster: dict[str, str], announced: Announcements
) -> None:
    announced.working = False
    lost = post(server, doc("N-1"), poster)
    assert lost.status_code == 503
    assert lost.headers["Retry-After"]
    [job] = ledger(store)["jobs"]  # committed all the same
    announced.working = True
    again = post(server, doc("N-1"), poster)
    assert again.status_code == 200
    assert again.json()["job_id"] == str(job.id)
    assert announced.calls == [1]


# -- killed between the commit and the answer -------------------------------------------------------


def test_a_server_killed_between_commit_and_answer_loses_and_doubles_nothing(
    db_url: Any,
    tmp_path: Path,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
) -> None:
    port, payloads, told = free_port(), tmp_path / "payloads", tmp_path / "announced"
    env = {**os.environ, "TRIAGE_DATABASE_URL": db_url.libpq()}

    def start(*extra: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "tests.ledger.intake_server", str(port), str(payloads), str(told), *extra]
        process = subprocess.Popen(argv, env=env)
        wait_listening(port)
        return process

    headers = {**as_user(airflow_auth, "editor", "user"), **JSON}
    body = json.dumps({"documents": [doc("K-1"), doc("K-2")]})
    doomed = start("--die-after-commit")
    try:
        with pytest.raises(httpx.TransportError):  # the connection dies: no answer at all
            httpx.post(f"http://127.0.0.1:{port}{URL}", content=body, headers=headers, timeout=30)
        assert doomed.wait(30) == -9
    finally:
        doomed.kill()
    committed = {r.external_id: str(r.id) for r in ledger(store)["jobs"]}
    assert set(committed) == {"K-1", "K-2"}  # committed before the kill
    assert not told.exists()  # and Airflow never told

    restarted = start()
    try:
        retry = httpx.post(f"http://127.0.0.1:{port}{URL}", content=body, headers=headers, timeout=30)
    finally:
        restarted.terminate()
        restarted.wait(30)
    assert retry.status_code == 200
    assert {e["external_id"]: e["job_id"] for e in retry.json()["documents"]} == committed
    rows = ledger(store)
    assert len(rows["jobs"]) == 2
    assert len(rows["events"]) == 2  # one job.registered each
    assert told.read_text().split() == ["2"]  # the retry told Airflow


@pytest.mark.own_database  # clients race in threads
def test_two_clients_racing_with_the_same_document_get_one_job(
    server: ThreadServer, store: JobStore, poster: dict[str, str]
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _i: post(server, doc("R-1"), poster), range(16)))
    codes = sorted(a.status_code for a in answers)
    assert codes.count(202) == 1
    assert codes.count(200) == 15
    assert len({a.json()["job_id"] for a in answers}) == 1
    assert len(ledger(store)["jobs"]) == 1


# -- the set-based registration ---------------------------------------------------------------------


@pytest.mark.own_database  # intake's AUTOCOMMIT statement, on connections of its own
def test_a_batch_mixing_valid_invalid_repeated_and_known_documents_answers_each_one(
    server: ThreadServer, store: JobStore, poster: dict[str, str]
) -> None:
    """One statement registers the batch's new documents and answers the known ones with their
    jobs; the invalid one registers nothing; every document is answered at its own index."""
    known = post(server, doc("X-1"), poster).json()["job_id"]
    body = {"documents": [doc("X-1"), doc("X-2"), doc("X-bad", body=None), doc("X-2"), doc("X-3")]}
    response = post(server, body, poster)
    assert response.status_code == 422  # one invalid: the valid ones registered all the same
    entries = response.json()["documents"]
    assert [(e["index"], e["external_id"], e["status"]) for e in entries] == [
        (0, "X-1", "existing"),
        (1, "X-2", "accepted"),
        (2, "X-bad", "invalid"),
        (3, "X-2", "existing"),
        (4, "X-3", "accepted"),
    ]
    assert entries[0]["job_id"] == known
    assert entries[1]["job_id"] == entries[3]["job_id"]
    rows = ledger(store)
    assert [r.external_id for r in rows["jobs"]] == ["X-1", "X-2", "X-3"]
    ids = {r.external_id: str(r.id) for r in rows["jobs"]}
    assert (entries[1]["job_id"], entries[4]["job_id"]) == (ids["X-2"], ids["X-3"])
    assert {r.correlation_id for r in rows["jobs"] if r.external_id == "X-3"} == {ids["X-3"]}  # minted: its id
    assert sorted(str(e.job_id) for e in rows["events"]) == sorted(ids.values())  # one job.registered each
    with store.engine.connect() as conn:
        logged = conn.execute(sa.text("SELECT job_id::text, to_status, actor FROM triage.job_events")).all()
        assert sorted(logged) == sorted((i, "queued", "intake:editor") for i in ids.values())
        # the actor was set for the statement's own transaction only, on the pool's connections
        assert conn.exec_driver_sql("SELECT current_setting('triage.actor', true)").scalar() in ("", None)


@pytest.mark.own_database  # clients race in threads
def test_the_same_batch_posted_at_once_by_many_clients_registers_each_document_once(
    server: ThreadServer, store: JobStore, poster: dict[str, str]
) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    body = {"documents": [doc(f"D-{i}") for i in range(50)]}
    start = threading.Barrier(6)

    def one(_i: int) -> httpx.Response:
        start.wait()
        return post(server, body, poster)

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(one, range(6)))
    assert {a.status_code for a in answers} <= {200, 202}
    by_doc: dict[str, set[str]] = {}
    accepted: dict[str, int] = {}
    for answer in answers:
        for entry in answer.json()["documents"]:
            by_doc.setdefault(entry["external_id"], set()).add(entry["job_id"])
            accepted[entry["external_id"]] = accepted.get(entry["external_id"], 0) + (entry["status"] == "accepted")
    assert all(len(ids) == 1 for ids in by_doc.values())  # every client heard the same job
    assert set(accepted.values()) == {1}  # and exactly one heard it accepted
    rows = ledger(store)
    assert len(rows["jobs"]) == 50
    assert len(rows["events"]) == 50


def test_every_answer_carries_the_security_headers(server: ThreadServer, poster: dict[str, str]) -> None:
    for response in (post(server, doc("H-1"), poster), post(server, doc("H-2", body=None), poster)):
        assert response.status_code in (202, 422)
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert "frame-ancestors 'self'" in response.headers["Content-Security-Policy"]
        assert response.headers["Cache-Control"] == "no-store"
