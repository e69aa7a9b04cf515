"""The learning loop on a real PostgreSQL: labelled examples (import, review, HTTP), training and
the registry's promotion rules, the artifact refused when tampered with, and a pipeline run
with the learned classifier end to end."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.ledger.test_triage_web import airflow_auth, as_user  # noqa: F401 - the fixture, shared
from triage import cli
from triage.classifiers import build_classifier
from triage.classifiers.taxonomy import Taxonomy
from triage.contracts.documents import DocumentPayload
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import LedgerError
from triage.jobs.vocabulary.models import ClassificationRecord, NewJob, SendToReview
from triage.learning.examples import LabelledDocument, import_examples
from triage.learning.model import ArtifactRefused, ArtifactTampered
from triage.learning.registry import (
    NoChampion,
    UnknownModel,
    list_models,
    load_champion,
    load_model,
    load_training_examples,
    promote,
    promotion_decision,
    train_candidate,
)
from triage.learning.training import TrainSettings
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.retrieve import retrieve
from triage.pipeline.steps import RunSettings, run_step
from triage.sources.synthetic import SyntheticSource
from triage.web.service import TriageService

TAXONOMY = Taxonomy.load()
NAMES = sorted(TAXONOMY.names)
DAY = datetime(2026, 11, 1, tzinfo=UTC)
BATCH = f"{DAY.isoformat()}/{(DAY + timedelta(days=1)).isoformat()}"


def line(external_id: str, label: str, subject: str = "Subject", body: str = "Body", **extra: Any) -> str:
    return json.dumps(
        {"id": external_id, "subject": subject, "body": body, "received_at": "2026-11-01T09:30:00Z", "label": label}
        | extra
    )


def examples_of(store: JobStore) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT source, external_id, label, labelled_by, job_id FROM triage.labelled_examples "
                    "ORDER BY source, external_id"
                )
            )
        ]


def synthetic_examples(n: int, seed: int, payloads: PayloadStore) -> list[LabelledDocument]:
    """Synthetic tickets with the label each was written for (the ground truth)."""
    source = SyntheticSource(n, seed=seed)
    out = []
    for document, label in source.read_labelled(DAY, DAY + timedelta(days=1)):
        out.append(LabelledDocument(DocumentPayload.from_bytes(document.content), label))
    return out


@pytest.fixture
def payloads(tmp_path: Path) -> PayloadStore:
    return PayloadStore(tmp_path / "payloads")


@pytest.fixture
def cli_env(db_url: DatabaseUrl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRIAGE_DATABASE_URL", db_url.libpq())
    monkeypatch.setenv("TRIAGE_PAYLOAD_BASE", str(tmp_path / "payloads"))
    return tmp_path


# -- labelled examples: the import -------------------------------------------------------------


def test_import_keeps_good_lines_refuses_bad_ones_one_by_one_and_adds_nothing_twice(
    store: JobStore, cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = cli_env / "labelled.jsonl"
    lines = [
        line("T-1", "billing", "Invoice", "charged twice"),
        line("T-2", "pizza"),  # outside the taxonomy
        "{not json",
        "",  # blank: skipped, not refused
        json.dumps({"id": "T-4", "subject": "s", "body": "b"}),  # no label
        line("T-5", "shipping", "Parcel", "where is it", colour="red"),  # a field the inbox refuses
        json.dumps({"id": "T-6", "subject": "No date", "body": "received_at may be left out", "label": "shipping"}),
        line("T-1", "shipping"),  # the same id again with another label: refused, the first stands
        line("T-1", "billing", "Invoice", "charged twice"),  # the same example again: already present
    ]
    file.write_text("\n".join(lines) + "\n")

    assert cli.main(["labels", "import", str(file), "--source", "helpdesk"]) == 1
    out, err = capsys.readouterr()
    assert "2 added, 1 already present, 5 refused" in out
    assert f"{file}: line 2: label_outside_taxonomy: 'pizza' is not in the taxonomy" in err
    assert f"{file}: line 3: invalid_json" in err
    assert f"{file}: line 5: missing_label" in err
    assert f"{file}: line 6: unexpected_field" in err
    assert f"{file}: line 8: duplicate_id: the id was given before (at 1) with another label or text" in err
    login = examples_of(store)
    assert [(s, e, label) for s, e, label, _, _ in login] == [
        ("helpdesk", "T-1", "billing"),
        ("helpdesk", "T-6", "shipping"),
    ]
    assert all(job_id is None for *_, job_id in login)

    # The text is a claim check: the payload store holds it, verified by its hash.
    with store.engine.connect() as conn:
        ref, sha = conn.execute(
            sa.text("SELECT payload_ref, content_sha256 FROM triage.labelled_examples WHERE external_id = 'T-1'")
        ).one()
    payload = DocumentPayload.from_bytes(PayloadStore(cli_env / "payloads").get(ref, sha))
    assert (payload.subject, payload.body) == ("Invoice", "charged twice")

    assert cli.main(["labels", "import", str(file), "--source", "helpdesk", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["added"], report["already_present"], len(report["refused"])) == (0, 3, 5)
    assert examples_of(store) == login


def test_import_refuses_the_reviewers_source_and_a_missing_file(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = cli_env / "one.jsonl"
    file.write_text(line("T-1", "billing") + "\n")
    assert cli.main(["labels", "import", str(file), "--source", "review"]) == 2
    assert "the reviewers' own" in capsys.readouterr().err
    assert cli.main(["labels", "import", str(cli_env / "missing.jsonl")]) == 2


def test_import_under_a_taxonomy_newer_than_the_ledger_names_triage_migrate(
    store: JobStore, cli_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A taxonomy file with a label ``triage migrate`` has not loaded yet: the import says so and
    what to run, writes nothing, and does not crash on the examples' foreign key (it did)."""
    taxonomy = cli_env / "taxonomy.yaml"
    taxonomy.write_text(
        (Path(__file__).parents[2] / "include" / "taxonomy.yaml").read_text()
        + "  - name: warranty\n    description: >-\n      Claims under the product's warranty.\n"
    )
    monkeypatch.setenv("TRIAGE_TAXONOMY", str(taxonomy))
    file = cli_env / "labelled.jsonl"
    file.write_text(line("W-1", "warranty", "Broken", "under warranty") + "\n" + line("W-2", "billing") + "\n")

    assert cli.main(["labels", "import", str(file), "--source", "helpdesk"]) == 2
    err = capsys.readouterr().err
    assert "does not know the labels warranty of the taxonomy file: run `triage migrate`" in err
    assert examples_of(store) == []


# -- labelled examples: the reviewers' decisions -------------------------------------------------


def to_review(store: JobStore, payloads: PayloadStore, n: int) -> list[uuid.UUID]:
    docs = []
    for i in range(n):
        content = DocumentPayload(external_id=f"R-{i}", subject="Help", body=f"text {i}", received_at=DAY).to_bytes()
        sha, ref = payloads.put(content)
        docs.append(NewJob(f"key-{i}", "inbox", f"R-{i}", sha, ref, "keyword-v1"))
    registered = store.register(docs, batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=n, lease_seconds=60, owner="worker-1")
    model = ClassificationRecord("billing", 0.41, "inconclusive", "keyword-v1")
    store.record(claim, [SendToReview(j.id, j.attempt, "inconclusive", classification=model) for j in claim.jobs])
    return list(registered.new_ids)


def test_a_reviewer_s_label_becomes_an_example_and_nothing_else_does(store: JobStore, payloads: PayloadStore) -> None:
    labelled, rejected, requeued = to_review(store, payloads, 3)
    store.review.resolve_with_label(labelled, "shipping", actor="ada", note="a parcel", taxonomy_names=NAMES)
    store.review.resolve_with_label(labelled, "shipping", actor="ada", note="a parcel", taxonomy_names=NAMES)  # again
    store.review.reject(rejected, actor="ada", note="spam")
    store.review.resolve_with_requeue(requeued, actor="ada", note="retry")
    assert examples_of(store) == [("review", str(labelled), "shipping", "ada", labelled)]
    with store.engine.connect() as conn:
        example = conn.execute(sa.text("SELECT content_sha256, payload_ref FROM triage.labelled_examples")).one()
        job = conn.execute(
            sa.text("SELECT content_sha256, payload_ref FROM triage.jobs WHERE id = :id"), {"id": labelled}
        )
        assert tuple(example) == tuple(job.one())  # the job's own document: no copy


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_model_s_auto_accepted_labels_never_become_examples(store: JobStore, payloads: PayloadStore) -> None:
    classifier = build_classifier("keyword", taxonomy=TAXONOMY)
    retrieve(
        store,
        SyntheticSource(50, seed=3),
        payloads,
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=BATCH,
        classifier_version=classifier.version,
        max_attempts=3,
    )
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.5, 1))
    run_step(store, handler, batch_key=BATCH, settings=RunSettings(owner="w", batch_size=50, lease_seconds=60))
    with store.engine.connect() as conn:
        accepted = conn.execute(sa.text("SELECT count(*) FROM triage.classifications WHERE outcome = 'accepted'"))
        assert accepted.scalar_one() > 20
    assert examples_of(store) == []


# -- labelled examples: over HTTP ----------------------------------------------------------------


@pytest.fixture
def client(store: JobStore, tmp_path: Path, airflow_auth: Any) -> TestClient:  # noqa: F811
    from triage.web.app import create_app

    root = FastAPI()
    service = TriageService(store, payload_base=str(tmp_path / "payloads"), taxonomy_names=NAMES)
    root.mount("/triage", create_app(service))
    return TestClient(root, base_url="http://airflow.test")


def test_labels_over_http_under_a_taxonomy_newer_than_the_ledger_is_409_naming_triage_migrate(
    store: JobStore,
    tmp_path: Path,
    airflow_auth: Any,  # noqa: F811
) -> None:
    from triage.web.app import create_app

    root = FastAPI()
    names = [*NAMES, "warranty"]  # the deployment's file, ahead of the ledger's taxonomy_labels
    root.mount("/triage", create_app(TriageService(store, payload_base=str(tmp_path / "p"), taxonomy_names=names)))
    client = TestClient(root, base_url="http://airflow.test")
    example = {"source": "crm", "external_id": "C-1", "subject": "Broken", "body": "warranty", "label": "warranty"}
    answer = client.post(
        "/triage/api/labels", json={"examples": [example]}, headers=as_user(airflow_auth, "editor", "user")
    )
    assert answer.status_code == 409, answer.text
    assert "run `triage migrate`" in answer.json()["detail"]
    assert examples_of(store) == []


def test_labels_over_http_per_example_422_and_idempotent(
    client: TestClient,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
) -> None:
    good = {"source": "crm", "external_id": "C-1", "subject": "Refund", "body": "money back", "label": "refund_request"}
    body = {
        "examples": [
            good,
            {**good, "external_id": "C-2", "label": "pizza"},
            {**good, "external_id": "C-3", "source": "review"},
            {**good, "external_id": "C-4", "body": 7},
            {**good, "external_id": "C-5", "source": "other", "label": "billing"},
        ]
    }
    editor = as_user(airflow_auth, "editor", "user")
    answer = client.post("/triage/api/labels", json=body, headers=editor)
    assert answer.status_code == 422, answer.text
    statuses = [(e["index"], e["status"], e.get("reason")) for e in answer.json()["examples"]]
    assert statuses == [
        (0, "added", None),
        (1, "invalid", "label_outside_taxonomy"),
        (2, "invalid", "invalid_source"),
        (3, "invalid", "invalid_field"),
        (4, "added", None),
    ]
    assert examples_of(store) == [
        ("crm", "C-1", "refund_request", "editor", None),
        ("other", "C-5", "billing", "editor", None),
    ]
    again = client.post("/triage/api/labels", json={"examples": [good]}, headers=editor)
    assert again.status_code == 200
    assert again.json()["examples"][0]["status"] == "already_present"
    fresh = client.post("/triage/api/labels", json={"examples": [{**good, "external_id": "C-9"}]}, headers=editor)
    assert fresh.status_code == 201
    assert len(examples_of(store)) == 3


def test_an_id_repeated_in_one_import_keeps_its_first_example_and_refuses_a_conflict(
    store: JobStore, payloads: PayloadStore
) -> None:
    """Which label wins when a file gives an id twice: the first, always; a later conflicting
    line is refused (duplicate_id, naming the first's line), not dropped as "already present"."""

    def doc(external_id: str, label: str, body: str = "b", position: int = 0) -> LabelledDocument:
        payload = DocumentPayload(external_id=external_id, subject="s", body=body, received_at=DAY)
        return LabelledDocument(payload, label, position)

    for order in ([("billing", 1), ("shipping", 2)], [("shipping", 1), ("billing", 2)]):
        source = f"file-{order[0][0]}"
        batch = [doc("D-1", label, position=position) for label, position in order]
        batch += [doc("D-2", "billing", position=3), doc("D-2", "billing", position=4)]  # the same twice
        batch += [doc("D-3", "billing", position=5), doc("D-3", "billing", "other text", position=6)]
        report = import_examples(store.engine, payloads, batch, source=source, labelled_by="me")
        assert (report.added, report.already) == (3, 1)
        assert [(r.position, r.reason, r.external_id) for r in report.refused] == [
            (2, "duplicate_id", "D-1"),
            (6, "duplicate_id", "D-3"),
        ]
        assert "(at 1)" in report.refused[0].detail
        stored = {e: label for s, e, label, _, _ in examples_of(store) if s == source}
        assert stored == {"D-1": order[0][0], "D-2": "billing", "D-3": "billing"}  # the first line's label


def test_an_id_repeated_in_an_http_batch_with_another_label_is_invalid(
    client: TestClient,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
) -> None:
    good = {"source": "crm", "external_id": "R-1", "subject": "Refund", "body": "money back", "label": "refund_request"}
    body = {"examples": [good, {**good, "label": "billing"}, good]}
    answer = client.post("/triage/api/labels", json=body, headers=as_user(airflow_auth, "editor", "user"))
    assert answer.status_code == 422, answer.text
    assert [(e["index"], e["status"], e.get("reason")) for e in answer.json()["examples"]] == [
        (0, "added", None),
        (1, "invalid", "duplicate_id"),
        (2, "already_present", None),
    ]
    assert examples_of(store) == [("crm", "R-1", "refund_request", "editor", None)]


def test_labels_over_http_need_a_reviewer(
    client: TestClient,
    store: JobStore,
    airflow_auth: Any,  # noqa: F811
) -> None:
    body = {"examples": [{"source": "crm", "external_id": "C-1", "subject": "s", "body": "b", "label": "billing"}]}
    assert client.post("/triage/api/labels", json=body).status_code == 401
    viewer = client.post("/triage/api/labels", json=body, headers=as_user(airflow_auth, "viewer", "viewer"))
    assert viewer.status_code == 403
    too_many = client.post(
        "/triage/api/labels",
        json={"examples": [body["examples"][0]] * 1001},
        headers=as_user(airflow_auth, "editor", "user"),
    )
    assert too_many.status_code == 413
    editor = as_user(airflow_auth, "editor", "user")
    form = client.post("/triage/api/labels", content=b"examples=1", headers={**editor, "Content-Type": "text/plain"})
    assert form.status_code == 415
    bad: object
    for bad in ([], {"examples": []}, {"examples": [], "more": 1}):
        assert client.post("/triage/api/labels", json=bad, headers=editor).status_code == 422
    huge = b'{"examples": ["' + b"x" * (33 << 20) + b'"]}'
    big = client.post("/triage/api/labels", content=huge, headers={**editor, "Content-Type": "application/json"})
    assert big.status_code == 413
    assert examples_of(store) == []


# -- training and the registry ---------------------------------------------------------------------


def train(store: JobStore, payloads: PayloadStore, **settings: Any) -> Any:
    return train_candidate(
        store.engine,
        payloads,
        taxonomy_names=NAMES,
        taxonomy_sha256=TAXONOMY.content_hash,
        settings=TrainSettings(**settings),
        actor="trainer",
    )


def test_the_first_model_becomes_champion_the_same_data_trains_nothing_new(
    store: JobStore, payloads: PayloadStore
) -> None:
    with pytest.raises(NoChampion, match="triage train"):
        load_champion(store.engine)
    import_examples(store.engine, payloads, synthetic_examples(600, 1, payloads), source="hist", labelled_by="me")
    first = train(store, payloads)
    assert (first.new, first.status, first.promoted) == (True, "champion", True)
    assert first.reason == "the first model: no champion yet"
    assert first.metrics["n"] + sum(first.label_counts.values()) == 600
    assert first.metrics["accepted_precision"] is None or first.metrics["accepted_precision"] >= 0.97
    again = train(store, payloads)
    assert (again.version, again.new, again.promoted) == (first.version, False, False)
    champion = load_champion(store.engine)
    assert champion.version == first.version
    assert [m["version"] for m in list_models(store.engine)] == [first.version]


def test_a_candidate_is_promoted_only_when_it_beats_the_champion_on_the_same_held_out_examples(
    store: JobStore, payloads: PayloadStore
) -> None:
    examples = synthetic_examples(900, 2, payloads)
    import_examples(store.engine, payloads, examples[:150], source="hist", labelled_by="me")
    small = train(store, payloads, min_examples=5)
    assert small.status == "champion"
    import_examples(store.engine, payloads, examples[150:], source="hist", labelled_by="me")
    big = train(store, payloads, min_examples=5)
    assert big.champion_version == small.version
    assert big.champion_metrics is not None
    assert big.champion_metrics["n"] == big.metrics["n"]  # scored on the same held-out examples
    assert big.metrics["macro_f1"] > big.champion_metrics["macro_f1"]
    assert (big.status, big.promoted) == ("champion", True)
    assert {m["version"]: m["status"] for m in list_models(store.engine)} == {
        big.version: "champion",
        small.version: "retired",
    }


def test_a_candidate_that_does_not_beat_the_champion_stays_a_candidate(store: JobStore, payloads: PayloadStore) -> None:
    good = synthetic_examples(600, 3, payloads)
    import_examples(store.engine, payloads, good, source="hist", labelled_by="me")
    champion = train(store, payloads, min_examples=5)
    # Labels given at random: nothing to learn from them, and they blur what the good ones teach.
    draw = random.Random(4)
    noisy = [LabelledDocument(e.payload, draw.choice(NAMES)) for e in synthetic_examples(900, 4, payloads)]
    import_examples(store.engine, payloads, noisy, source="noisy", labelled_by="me")
    candidate = train(store, payloads, min_examples=5)
    assert candidate.champion_version == champion.version
    assert candidate.metrics["macro_f1"] <= candidate.champion_metrics["macro_f1"]
    assert (candidate.status, candidate.promoted) == ("candidate", False)
    assert "does not beat the champion's" in candidate.reason
    assert load_champion(store.engine).version == champion.version


def test_the_promotion_rule() -> None:
    assert promotion_decision({"macro_f1": 0.5, "accepted_precision": 0.99}, None, 0.97) == (
        True,
        "the first model: no champion yet",
    )
    assert promotion_decision({"macro_f1": 0.9, "accepted_precision": 0.99}, {"macro_f1": 0.8}, 0.97)[0]
    assert not promotion_decision({"macro_f1": 0.8, "accepted_precision": 0.99}, {"macro_f1": 0.8}, 0.97)[0]
    below = promotion_decision({"macro_f1": 0.99, "accepted_precision": 0.95}, {"macro_f1": 0.8}, 0.97)
    assert below == (False, "accepted precision 0.9500 is below the target 0.9700")
    assert not promotion_decision({"macro_f1": 0.99, "accepted_precision": 0.96}, None, 0.97)[0]


def test_promotion_by_hand_retires_the_champion_and_is_recorded(store: JobStore, payloads: PayloadStore) -> None:
    examples = synthetic_examples(400, 4, payloads)
    import_examples(store.engine, payloads, examples[:200], source="a", labelled_by="me")
    first = train(store, payloads, min_examples=5)
    import_examples(store.engine, payloads, examples[200:], source="b", labelled_by="me")
    second = train(store, payloads, min_examples=5, target_precision=0.5)
    if second.status == "champion":  # it won by the rule: take the first back by hand
        back, retired = first.version, second.version
    else:
        back, retired = second.version, first.version
    assert promote(store.engine, back, actor="ops", reason="rollback drill") == {back: "champion", retired: "retired"}
    assert load_champion(store.engine).version == back
    row = next(m for m in list_models(store.engine) if m["version"] == back)
    assert (row["promoted_by"], row["promotion_reason"]) == ("ops", "rollback drill")
    with pytest.raises(UnknownModel):
        promote(store.engine, back, actor="ops", reason="again")  # the champion already
    with pytest.raises(UnknownModel):
        promote(store.engine, "learned-nope", actor="ops", reason="typo")
    with store.engine.connect() as conn:
        champions = conn.execute(sa.text("SELECT count(*) FROM triage.classifier_models WHERE status = 'champion'"))
        assert champions.scalar_one() == 1


def test_the_database_holds_one_champion_at_most(store: JobStore, payloads: PayloadStore) -> None:
    import_examples(store.engine, payloads, synthetic_examples(300, 5, payloads), source="a", labelled_by="me")
    first = train(store, payloads, min_examples=5)
    train(store, payloads, min_examples=5, target_precision=0.6)
    with pytest.raises(sa.exc.IntegrityError, match="classifier_models_one_champion"), store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE triage.classifier_models SET status = 'champion' WHERE version <> :v"),
            {"v": first.version},
        )


def test_a_tampered_artifact_in_the_registry_is_refused(store: JobStore, payloads: PayloadStore) -> None:
    import_examples(store.engine, payloads, synthetic_examples(300, 6, payloads), source="a", labelled_by="me")
    model = train(store, payloads, min_examples=5)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE triage.classifier_models SET artifact = overlay(artifact PLACING '\\x00ff'::bytea FROM 100) "
                "WHERE version = :v"
            ),
            {"v": model.version},
        )
    with pytest.raises(ArtifactTampered):
        load_champion(store.engine)
    with pytest.raises(ArtifactRefused):
        load_model(store.engine, model.version)


@pytest.mark.parametrize(
    "thresholds",
    [
        pytest.param('{"billing": "x"}', id="string"),
        pytest.param('{"billing": -1}', id="negative-accepts-all"),
        pytest.param('{"billing": true}', id="bool"),
        pytest.param('{"pizza": 0.5}', id="unknown-label"),
        pytest.param("[0.5]", id="not-an-object"),
    ],
)
def test_thresholds_rewritten_in_the_row_are_refused_as_the_artifact_is(
    store: JobStore, payloads: PayloadStore, thresholds: str
) -> None:
    """The row's thresholds decide what is accepted without a person: a negative one accepted
    every answer, a string one crashed the load with a bare ValueError. Both are refused now."""
    import_examples(store.engine, payloads, synthetic_examples(300, 6, payloads), source="a", labelled_by="me")
    model = train(store, payloads, min_examples=5)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE triage.classifier_models SET thresholds = CAST(:t AS jsonb) WHERE version = :v"),
            {"t": thresholds, "v": model.version},
        )
    with pytest.raises(ArtifactRefused, match="threshold"):
        load_champion(store.engine)


# -- the command line ------------------------------------------------------------------------------


def test_train_list_promote_and_evaluate_from_the_command_line(
    store: JobStore, cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payloads = PayloadStore(cli_env / "payloads")
    assert cli.main(["train"]) == 1
    assert "0 examples" in capsys.readouterr().err
    file = cli_env / "train.jsonl"
    file.write_text(
        "\n".join(
            line(e.payload.external_id, e.label, e.payload.subject, e.payload.body)
            for e in synthetic_examples(500, 7, payloads)
        )
    )
    assert cli.main(["labels", "import", str(file)]) == 0
    assert cli.main(["evaluate", str(file)]) == 1
    assert "triage train" in capsys.readouterr().err
    assert cli.main(["train", "--json", "--min-examples", "5"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["status"] == "champion"
    assert trained["params"]["thresholds"] == "verified"  # pooled, certified on held-out it did not choose on
    assert cli.main(["train", "--json", "--min-examples", "5", "--per-label-margin"]) == 0
    per_label = json.loads(capsys.readouterr().out)
    assert per_label["params"]["thresholds"] == "per-label"
    assert per_label["version"] != trained["version"]  # another rule, another model version
    assert cli.main(["train", "--json", "--min-examples", "5", "--thresholds", "pooled"]) == 0
    pooled = json.loads(capsys.readouterr().out)
    assert pooled["params"]["thresholds"] == "pooled"
    assert pooled["version"] not in (trained["version"], per_label["version"])
    assert cli.main(["models", "list"]) == 0
    assert trained["version"] in capsys.readouterr().out
    test = cli_env / "test.jsonl"
    test.write_text(
        "\n".join(
            line(e.payload.external_id, e.label, e.payload.subject, e.payload.body)
            for e in synthetic_examples(200, 8, payloads)
        )
        + "\n"
        + line("X-1", "pizza")
    )
    assert cli.main(["evaluate", str(test), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert {"n", "accuracy", "macro_f1", "coverage", "accepted_precision", "model_version"} <= set(scored)
    assert (scored["n"], scored["refused_lines"], scored["model_version"]) == (200, 1, trained["version"])
    assert scored["accuracy"] > 0.8
    rows = scored["per_label"].values()
    assert all({"accepted", "accepted_precision"} <= set(row) for row in rows)
    assert sum(row["accepted"] for row in rows) == scored["accepted"]  # each label's share of what is accepted
    assert cli.main(["evaluate", str(test), "--model", "keyword", "--json"]) == 0
    keyword = json.loads(capsys.readouterr().out)
    assert keyword["model_version"].startswith("keyword-v1")
    assert keyword["n"] == 200
    assert cli.main(["evaluate", str(test)]) == 0
    printed = capsys.readouterr().out
    assert "most confused" in printed or scored["accuracy"] == 1.0
    assert "at prec." in printed  # each label's accepted precision
    assert cli.main(["models", "promote", trained["version"]]) == 1  # the champion already
    assert cli.main(["evaluate", str(test), "--model", "learned-unknown"]) == 1


# -- a run with the learned classifier ------------------------------------------------------------


@pytest.fixture
def trained(store: JobStore, payloads: PayloadStore) -> Any:
    import_examples(store.engine, payloads, synthetic_examples(1500, 11, payloads), source="hist", labelled_by="me")
    return train(store, payloads, min_examples=5)


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_run_with_the_learned_classifier_end_to_end(store: JobStore, payloads: PayloadStore, trained: Any) -> None:
    champion = load_champion(store.engine)
    classifier = build_classifier("learned", taxonomy=TAXONOMY, learned=champion)
    assert classifier.version == trained.version
    source = SyntheticSource(300, seed=99)
    truth = {doc.external_id: label for doc, label in source.read_labelled(DAY, DAY + timedelta(days=1))}
    result = retrieve(
        store,
        source,
        payloads,
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=BATCH,
        classifier_version=classifier.version,
        max_attempts=3,
    )
    assert result.registered == 300
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.99, 1))  # the labels' own thresholds rule
    report = run_step(
        store, handler, batch_key=BATCH, settings=RunSettings(owner="w", batch_size=100, lease_seconds=60)
    )
    assert report.outcomes.get("Complete", 0) > 150
    with store.engine.connect() as conn:
        versions = conn.execute(sa.text("SELECT DISTINCT classifier_version FROM triage.classifications")).scalars()
        assert list(versions) == [trained.version]
        labels = conn.execute(sa.text("SELECT external_id, label FROM triage.document_labels")).all()
        reviews = conn.execute(sa.text("SELECT reason, context FROM triage.manual_review")).all()
    right = sum(truth[external_id] == label for external_id, label in labels)
    assert right / len(labels) >= 0.95  # what it accepts meets (about) the target precision
    assert len(labels) + len(reviews) == 300
    for reason, context in reviews:
        assert reason == "inconclusive"
        assert context["threshold"] == champion.threshold(context["label"])  # the label's own, not 0.99


# -- the Airflow side: the training operator, a learned run without a champion ----------------------


def test_a_learned_run_without_a_champion_fails_at_once_naming_triage_train(
    store: JobStore, payloads: PayloadStore
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from triage.adapters.model_api import build_run_classifier, configured_classifier_versions
    from triage.contracts.run_config import ClassifyRunConfig

    config = ClassifyRunConfig(classifier="learned")
    with pytest.raises(AirflowFailException, match="triage train"):
        build_run_classifier(config, "triage_llm", store.engine)
    import_examples(store.engine, payloads, synthetic_examples(300, 12, payloads), source="a", labelled_by="me")
    model = train(store, payloads, min_examples=5)
    assert build_run_classifier(config, "triage_llm", store.engine).version == model.version
    assert model.version in configured_classifier_versions("triage_llm", store.engine)


def test_a_refused_champion_fails_retrieve_at_once_registering_nothing(
    store: JobStore, payloads: PayloadStore, tmp_path: Path
) -> None:
    """Retrieval read the champion to register its version, and so refused a tampered artifact
    before any job existed. Reading only the version would register the day's jobs under a model
    that cannot load: classify then fails and its failure callback sends every one to review."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from triage.operators.classify_documents import RetrieveDocumentsOperator

    import_examples(store.engine, payloads, synthetic_examples(300, 16, payloads), source="a", labelled_by="me")
    model = train(store, payloads, min_examples=5)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE triage.classifier_models SET artifact = overlay(artifact PLACING '\\x00ff'::bytea FROM 100) "
                "WHERE version = :v"
            ),
            {"v": model.version},
        )

    class Seamed(RetrieveDocumentsOperator):
        def get_engine(self) -> sa.Engine:
            return store.engine

        def dispose(self) -> None:  # the test's engine outlives the task
            pass

    day = datetime(2026, 11, 1, tzinfo=UTC)
    ti = SimpleNamespace(
        dag_id="classify_documents", run_id="manual__r", task_id="retrieve", map_index=-1, try_number=1
    )
    context = {
        "params": {"classifier": "learned", "documents": 5},
        "data_interval_start": day,
        "data_interval_end": day + timedelta(days=1),
        "ti": ti,
    }
    with pytest.raises(AirflowFailException, match="does not match its SHA-256"):
        Seamed(task_id="retrieve", payload_base=str(tmp_path / "run-payloads")).execute(context)  # type: ignore[arg-type]
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM triage.jobs")).scalar_one() == 0


def test_a_run_s_default_classifier_is_the_champion_when_there_is_one_else_keyword(
    store: JobStore, payloads: PayloadStore
) -> None:
    """classify_documents' params leave classifier at auto: each task resolves it on the job
    database, so the version a run registers and classifies with is the keyword rules' until a
    champion exists, then the champion's, then the next champion's once promoted by hand."""
    from triage.adapters.model_api import build_run_classifier
    from triage.operators.classify_documents import ClassifyDocumentsOperator

    class Seamed(ClassifyDocumentsOperator):
        def get_engine(self) -> sa.Engine:
            return store.engine

    operator = Seamed(task_id="classify")

    def chosen(params: dict[str, Any]) -> tuple[str, str]:
        config = operator.run_config({"params": params})
        return config.classifier, build_run_classifier(config, "triage_llm", store.engine).version

    keyword_version = build_classifier("keyword", taxonomy=TAXONOMY).version
    assert chosen({}) == ("keyword", keyword_version)
    import_examples(store.engine, payloads, synthetic_examples(300, 14, payloads), source="a", labelled_by="me")
    first = train(store, payloads, min_examples=5)
    assert chosen({}) == ("learned", first.version)
    assert chosen({"classifier": "auto"}) == ("learned", first.version)
    assert chosen({"classifier": "keyword"}) == ("keyword", keyword_version)  # asked for by name: kept
    second = train(store, payloads, min_examples=5, margin_z=1.0)  # another version, not promoted by the rule
    promote(store.engine, second.version, actor="ada", reason="test")
    assert chosen({}) == ("learned", second.version)


def test_intake_registers_for_the_champion_and_refuses_clearly_when_no_classifier_can(
    store: JobStore,
    payloads: PayloadStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    airflow_auth: Any,  # noqa: F811
) -> None:
    """A taxonomy without keywords broke intake (its version built the keyword classifier, which
    refuses such a taxonomy: a 500). Now: 503 saying to train a model, nothing stored; once a
    champion exists, intake's documents are registered for its version."""
    from triage.web.app import create_app
    from triage.web.intake_service import IntakeService, NoIntakeClassifier, intake_classifier_version

    history = synthetic_examples(300, 15, payloads)  # written from the keywords of the shipped taxonomy
    taxonomy = tmp_path / "taxonomy.yaml"
    taxonomy.write_text(
        "schema_version: 1\nlabels:\n" + "".join(f"  - name: {n}\n    description: {n}\n" for n in NAMES)
    )
    monkeypatch.setenv("TRIAGE_TAXONOMY", str(taxonomy))
    monkeypatch.delenv("TRIAGE_INTAKE_CLASSIFIER", raising=False)
    triage = TriageService(store, payload_base=str(tmp_path / "payloads"), taxonomy_names=NAMES)

    def post() -> Any:
        root = FastAPI()
        root.mount("/triage", create_app(triage, IntakeService(triage, announce=lambda n: True)))
        document = {
            "source": "helpdesk",
            "external_id": "I-1",
            "subject": "Refund",
            "body": "money back",
            "received_at": DAY.isoformat(),
        }
        headers = as_user(airflow_auth, "editor", "user")
        return TestClient(root, base_url="http://airflow.test").post(
            "/triage/api/documents", json=document, headers=headers
        )

    refused = post()
    assert refused.status_code == 503, refused.text
    assert "needs keywords for every label" in refused.text
    assert "triage train" in refused.text
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM triage.jobs")).scalar_one() == 0
    monkeypatch.setenv("TRIAGE_INTAKE_CLASSIFIER", "learned")
    with pytest.raises(NoIntakeClassifier, match="no model is champion"):
        intake_classifier_version(store.engine)
    monkeypatch.delenv("TRIAGE_INTAKE_CLASSIFIER")

    import_examples(store.engine, payloads, history, source="a", labelled_by="me")
    model = train(store, payloads, min_examples=5)
    accepted = post()
    assert accepted.status_code == 202, accepted.text
    with store.engine.connect() as conn:
        versions = conn.execute(sa.text("SELECT classifier_version FROM triage.jobs")).scalars().all()
    assert versions == [model.version]
    monkeypatch.setenv("TRIAGE_INTAKE_CLASSIFIER", "keyword")  # asked for by name: still refused, clearly
    with pytest.raises(NoIntakeClassifier, match="needs keywords for every label"):
        intake_classifier_version(store.engine)


def test_the_training_operator_trains_and_refuses_without_examples(store: JobStore, tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from triage.operators.train import TrainClassifierOperator

    class Seamed(TrainClassifierOperator):
        def get_engine(self) -> sa.Engine:
            return store.engine

    operator = Seamed(task_id="train", payload_base=str(tmp_path / "payloads"))
    context: Any = {
        "params": {"target_precision": 0.97, "holdout_percent": 20, "min_examples": 5},
        "run_id": "manual_1",
    }
    with pytest.raises(AirflowFailException, match="nothing to train"):
        operator.execute(context)
    payloads = PayloadStore(tmp_path / "payloads")
    import_examples(store.engine, payloads, synthetic_examples(300, 13, payloads), source="a", labelled_by="me")
    result = operator.execute(context)
    assert (result["status"], result["promoted"]) == ("champion", True)
    assert result["params"]["thresholds"] == "verified"  # the param's default, as triage train's
    assert list_models(store.engine)[0]["created_by"] == "airflow:manual_1"
    pooled = operator.execute({**context, "params": {**context["params"], "thresholds": "pooled"}})
    assert pooled["params"]["thresholds"] == "pooled"  # the run's param picks the rule
    assert pooled["version"] != result["version"]  # another rule, another model version
    with pytest.raises(AirflowFailException, match="thresholds"):
        operator.execute({**context, "params": {**context["params"], "thresholds": "oracle"}})
    with pytest.raises(AirflowFailException, match="target_precision"):
        operator.execute({**context, "params": {"target_precision": 1.5}})


# -- the worker role's grants ----------------------------------------------------------------------


def test_the_worker_role_imports_reviews_trains_promotes_and_loads(
    pg_server: DatabaseUrl, db_url: DatabaseUrl, payloads: PayloadStore
) -> None:
    """What migration 0025 grants the deployment logins is enough for everything the DAGs and the
    web service do with the two tables, and no more than that: the worker imports, trains and
    promotes, the reviewer's label decision writes its example (the worker may not decide a
    review: migration 0021), and neither can delete an example."""

    from triage.database import create_engine
    from triage.roles import ensure_worker_role, reviewer_url, worker_url

    if not pg_server.is_socket:
        pytest.skip("the worker role logs in without a password: needs the embedded (trusting) server")
    ensure_worker_role(pg_server)
    engine = create_engine(worker_url(db_url), pool_size=2)
    review_engine = create_engine(reviewer_url(db_url), pool_size=1)
    try:
        app = JobStore(engine, rng=random.Random(1))
        report = import_examples(engine, payloads, synthetic_examples(300, 21, payloads), source="a", labelled_by="me")
        assert report.added == 300
        [job_id] = to_review(app, payloads, 1)
        with pytest.raises(LedgerError, match="may not record a review decision"):
            app.review.resolve_with_label(job_id, "billing", actor="ada", taxonomy_names=NAMES)
        JobStore(review_engine).review.resolve_with_label(job_id, "billing", actor="ada", taxonomy_names=NAMES)
        with review_engine.connect() as conn:
            written = conn.execute(
                sa.text("SELECT count(*) FROM triage.labelled_examples WHERE source = 'review' AND external_id = :id"),
                {"id": str(job_id)},
            ).scalar_one()
        assert written == 1
        trained = train(app, payloads, min_examples=5)
        assert trained.status == "champion"
        assert load_champion(engine).version == trained.version
        second = train(app, payloads, min_examples=5, target_precision=0.6)
        promote(engine, second.version, actor="ops", reason="grants")
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"), engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM triage.labelled_examples"))
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"), review_engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM triage.labelled_examples"))
    finally:
        engine.dispose()
        review_engine.dispose()


# -- retention keeps the examples' texts ------------------------------------------------------------


def test_retention_keeps_the_payloads_of_labelled_examples(store: JobStore, tmp_path: Path) -> None:
    """An imported example's text is referenced by no job, and a reviewed job's completes: the
    payload retention removed both once old, leaving training without them."""
    import os

    from triage.maintenance.retention import apply_retention
    from triage.settings import Retention

    payloads = PayloadStore(tmp_path / "payloads")
    import_examples(store.engine, payloads, synthetic_examples(5, 30, payloads), source="a", labelled_by="me")
    [job_id] = to_review(store, payloads, 1)
    store.review.resolve_with_label(job_id, "billing", actor="ada", taxonomy_names=NAMES)
    unlabelled = payloads.put(b"an old document nobody labelled")[1]
    old = (datetime.now(UTC) - timedelta(days=90)).timestamp()
    for path in (tmp_path / "payloads").rglob("*"):
        if path.is_file():
            os.utime(path, (old, old))

    report = apply_retention(
        store.engine,
        Retention(),
        payload_base=str(tmp_path / "payloads"),
        event_log=str(tmp_path / "events" / "outbox.jsonl"),
        reports_dir=str(tmp_path / "reports"),
    )

    assert report.kinds["payloads"].removed == 1
    assert not payloads.object_path(unlabelled).exists()
    examples, skipped = load_training_examples(store.engine, payloads, NAMES)
    assert len(examples) == 6
    assert skipped == {"label_outside_taxonomy": 0, "payload_unreadable": 0, "malformed_document": 0}
