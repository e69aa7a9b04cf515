"""Sources: determinism, duplicates, date partitioning and never losing a bad line."""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import OUT_OF_RANGE_TIMESTAMPS, timestamps
from triage.classifiers.taxonomy import Taxonomy
from triage.contracts.documents import DocumentPayload
from triage.sources import JsonlSource, SourceDocument, SourceError, SyntheticSource, build_source
from triage.sources.jsonl import LINE_REASONS

DAY = datetime(2026, 11, 1, tzinfo=UTC)
NEXT_DAY = DAY + timedelta(days=1)
SAMPLE_INBOX = Path(__file__).resolve().parents[2] / "include" / "sample_inbox"


# -- synthetic ---------------------------------------------------------------------------------


def test_synthetic_is_deterministic_for_a_date_and_seed() -> None:
    first = list(SyntheticSource(500, seed=3).read(DAY, NEXT_DAY))
    second = list(SyntheticSource(500, seed=3).read(DAY, NEXT_DAY))

    assert first == second
    assert len(first) == 500


@pytest.mark.parametrize(
    ("other_seed", "other_start"),
    [
        pytest.param(4, DAY, id="other-seed"),
        pytest.param(3, NEXT_DAY, id="other-date"),
    ],
)
def test_synthetic_differs_by_seed_and_date(other_seed: int, other_start: datetime) -> None:
    base = [d.content for d in SyntheticSource(50, seed=3).read(DAY, NEXT_DAY)]
    other = [d.content for d in SyntheticSource(50, seed=other_seed).read(other_start, other_start + timedelta(days=1))]

    assert base != other


def test_synthetic_ids_and_timestamps() -> None:
    documents = list(SyntheticSource(1000, seed=1).read(DAY, NEXT_DAY))
    payloads = [DocumentPayload.from_bytes(d.content) for d in documents]

    assert documents[42].external_id == "syn-2026-11-01-000042"
    assert len({d.external_id for d in documents}) == 1000
    assert all(d.source == "synthetic" and d.malformed_reason is None for d in documents)
    assert all(DAY <= p.received_at < NEXT_DAY for p in payloads)
    assert [p.received_at for p in payloads] == sorted(p.received_at for p in payloads)
    # spread over the day, not bunched at its start
    assert payloads[-1].received_at - payloads[0].received_at > timedelta(hours=23)
    assert [p.external_id for p in payloads] == [d.external_id for d in documents]


def test_synthetic_content_is_canonical_payload_bytes() -> None:
    # The generator writes JSON by hand for speed; it must be exactly what to_bytes() writes.
    for document in SyntheticSource(2000, seed=9).read(DAY, NEXT_DAY):
        assert DocumentPayload.from_bytes(document.content).to_bytes() == document.content


def test_synthetic_handles_a_taxonomy_with_characters_that_need_escaping() -> None:
    taxonomy = Taxonomy.from_mapping(
        {
            "labels": [
                {"name": "quoted", "description": "d", "keywords": ['say "hi"', "back\\slash", "tab\there"]},
                {"name": "unicode", "description": "d", "keywords": ["café", "naïve ☕"]},
            ]
        }
    )
    for document in SyntheticSource(300, seed=2, taxonomy=taxonomy).read(DAY, NEXT_DAY):
        assert DocumentPayload.from_bytes(document.content).to_bytes() == document.content


def test_synthetic_intra_day_interval_gets_its_own_ids() -> None:
    start = DAY + timedelta(hours=6)
    documents = list(SyntheticSource(3, seed=1).read(start, start + timedelta(hours=1)))

    assert documents[0].external_id == "syn-2026-11-01T060000-000000"


def test_synthetic_sub_second_bounds_stay_inside_the_interval() -> None:
    start = DAY + timedelta(microseconds=400_000)
    end = start + timedelta(seconds=3)
    payloads = [DocumentPayload.from_bytes(d.content) for d in SyntheticSource(50, seed=1).read(start, end)]

    assert all(start <= p.received_at < end for p in payloads)


def test_synthetic_empty_interval_puts_documents_at_start() -> None:
    payloads = [DocumentPayload.from_bytes(d.content) for d in SyntheticSource(5, seed=1).read(DAY, DAY)]

    assert {p.received_at for p in payloads} == {DAY}


def test_synthetic_non_utc_start_is_the_same_instant() -> None:
    paris = timezone(timedelta(hours=1))
    local = list(SyntheticSource(20, seed=5).read(DAY.astimezone(paris), NEXT_DAY.astimezone(paris)))

    assert local == list(SyntheticSource(20, seed=5).read(DAY, NEXT_DAY))


@pytest.mark.parametrize(
    ("documents", "rate", "expected_duplicates"),
    [
        pytest.param(1000, 0.0, 0, id="none"),
        pytest.param(1000, 0.1, 100, id="ten-percent"),
        pytest.param(1000, 1.0, 1000, id="all"),
        pytest.param(7, 0.5, 4, id="rounded"),
    ],
)
def test_synthetic_duplicates_are_redelivered_later(documents: int, rate: float, expected_duplicates: int) -> None:
    delivered = list(SyntheticSource(documents, seed=1, duplicate_rate=rate).read(DAY, NEXT_DAY))
    first_seen: dict[str, int] = {}
    by_id: dict[str, bytes] = {}

    for position, document in enumerate(delivered):
        if document.external_id in first_seen:
            assert by_id[document.external_id] == document.content  # same bytes
            assert position > first_seen[document.external_id]  # later in the stream
        else:
            first_seen[document.external_id] = position
            by_id[document.external_id] = document.content

    counts = Counter(d.external_id for d in delivered)
    assert len(delivered) == documents + expected_duplicates
    assert len(counts) == documents
    assert max(counts.values()) <= 2


def test_synthetic_duplicates_do_not_change_the_documents() -> None:
    plain = list(SyntheticSource(300, seed=4).read(DAY, NEXT_DAY))
    with_duplicates = list(SyntheticSource(300, seed=4, duplicate_rate=0.3).read(DAY, NEXT_DAY))

    first_deliveries = list({d.external_id: d for d in reversed(with_duplicates)}.values())[::-1]
    assert sorted(first_deliveries, key=lambda d: d.external_id) == plain


def test_synthetic_labels_follow_the_taxonomy_with_some_vague_tickets() -> None:
    taxonomy = Taxonomy.load()
    labelled = list(SyntheticSource(5000, seed=1, taxonomy=taxonomy).read_labelled(DAY, NEXT_DAY))
    labels = Counter(label for _document, label in labelled)

    assert set(labels) == taxonomy.names
    assert min(labels.values()) > 100
    lengths = [len(DocumentPayload.from_bytes(d.content).text) for d, _label in labelled[:500]]
    assert 250 < sum(lengths) / len(lengths) < 700


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        pytest.param({"documents": -1}, ValueError, id="negative-count"),
        pytest.param({"documents": 1, "duplicate_rate": 1.5}, ValueError, id="rate"),
    ],
)
def test_synthetic_refuses_bad_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        SyntheticSource(**kwargs)


def test_naive_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        list(SyntheticSource(1).read(datetime(2026, 11, 1), datetime(2026, 11, 2)))


# -- jsonl -------------------------------------------------------------------------------------


def ticket(ticket_id: object = "T-1", **overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "id": ticket_id,
        "subject": "Refund",
        "body": "I want my money back.",
        "received_at": "2026-11-01T10:00:00+01:00",
        "channel": "email",
    }
    data.update(overrides)
    return data


def line(data: object) -> bytes:
    return json.dumps(data).encode()


def write_day(inbox: Path, day: str, name: str, lines: list[bytes]) -> Path:
    folder = inbox / day
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_jsonl_valid_line_becomes_a_canonical_payload(tmp_path: Path) -> None:
    write_day(tmp_path, "2026-11-01", "a.jsonl", [line(ticket("T-7"))])

    [document] = JsonlSource(tmp_path).read(DAY, NEXT_DAY)
    payload = DocumentPayload.from_bytes(document.content)

    assert document == SourceDocument("jsonl", "T-7", payload.to_bytes(), None)
    assert payload.received_at == datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
    assert payload.channel == "email"


def test_jsonl_channel_is_optional(tmp_path: Path) -> None:
    data = ticket()
    del data["channel"]
    write_day(tmp_path, "2026-11-01", "a.jsonl", [line(data)])

    [document] = JsonlSource(tmp_path).read(DAY, NEXT_DAY)

    assert DocumentPayload.from_bytes(document.content).channel is None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(b"\xff\xfe not utf-8", "invalid_utf8", id="invalid-utf8"),
        pytest.param(b'{"id": "T-1", "subject": ', "invalid_json", id="truncated-json"),
        pytest.param(b"not json at all", "invalid_json", id="text"),
        pytest.param(b"[1, 2, 3]", "not_an_object", id="array"),
        pytest.param(b'"just a string"', "not_an_object", id="string"),
        pytest.param(line({k: v for k, v in ticket().items() if k != "body"}), "missing_field", id="missing-body"),
        pytest.param(line({k: v for k, v in ticket().items() if k != "id"}), "missing_field", id="missing-id"),
        pytest.param(line(ticket(label="billing")), "unexpected_field", id="extra-field"),
        pytest.param(line(ticket("")), "empty_id", id="empty-id"),
        pytest.param(line(ticket("   ")), "empty_id", id="blank-id"),
        pytest.param(line(ticket("x" * 513)), "id_too_long", id="id-too-long"),
        pytest.param(line(ticket(42)), "invalid_field", id="id-not-string"),
        pytest.param(line(ticket(body=None)), "invalid_field", id="null-body"),
        pytest.param(line(ticket(received_at="2026-11-01T10:00:00")), "naive_received_at", id="naive-timestamp"),
        pytest.param(line(ticket(received_at="next tuesday")), "invalid_field", id="bad-timestamp"),
        pytest.param(line(ticket(channel=3)), "invalid_field", id="channel-not-string"),
        pytest.param(
            b'{"id": "\\ud800", "subject": "", "body": "", "received_at": "2026-11-01T00:00:00Z"}',
            "invalid_json",
            id="lone-surrogate",
        ),
        *[
            pytest.param(line(ticket(received_at=ts)), "received_at_out_of_range", id=f"out-of-range-{ts}")
            for ts in OUT_OF_RANGE_TIMESTAMPS
        ],
    ],
)
def test_jsonl_malformed_line_is_kept_with_a_reason(tmp_path: Path, raw: bytes, reason: str) -> None:
    write_day(tmp_path, "2026-11-01", "tickets.jsonl", [line(ticket("T-1")), b"", raw])

    documents = list(JsonlSource(tmp_path).read(DAY, NEXT_DAY))

    assert [d.external_id for d in documents] == ["T-1", "2026-11-01/tickets.jsonl:3"]
    assert documents[1] == SourceDocument("jsonl", "2026-11-01/tickets.jsonl:3", raw, reason)
    assert reason in LINE_REASONS


def test_jsonl_over_long_line_is_malformed_and_truncated(tmp_path: Path) -> None:
    from triage.sources.jsonl import MAX_LINE_BYTES

    raw = line(ticket(body="x" * (MAX_LINE_BYTES + 10)))
    write_day(tmp_path, "2026-11-01", "a.jsonl", [raw])

    [document] = JsonlSource(tmp_path).read(DAY, NEXT_DAY)

    assert document.malformed_reason == "line_too_long"
    assert document.content == raw[:MAX_LINE_BYTES]


def test_jsonl_crlf_and_blank_lines(tmp_path: Path) -> None:
    folder = tmp_path / "2026-11-01"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(line(ticket("A")) + b"\r\n\r\n   \r\n\t\n" + line(ticket("B")))  # no final newline

    documents = list(JsonlSource(tmp_path).read(DAY, NEXT_DAY))

    assert [(d.external_id, d.malformed_reason) for d in documents] == [("A", None), ("B", None)]


def test_jsonl_reads_only_the_interval_days_in_order(tmp_path: Path) -> None:
    for day in ("2026-10-31", "2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"):
        write_day(tmp_path, day, "b.jsonl", [line(ticket(f"{day}-b"))])
        write_day(tmp_path, day, "a.jsonl", [line(ticket(f"{day}-a1")), line(ticket(f"{day}-a2"))])
    (tmp_path / "2026-11-02" / "notes.txt").write_text("not a jsonl file")
    (tmp_path / "README.md").write_text("ignored")
    (tmp_path / "not-a-date").mkdir()
    (tmp_path / "2026-13-01").mkdir()

    ids = [d.external_id for d in JsonlSource(tmp_path).read(DAY + timedelta(days=1), DAY + timedelta(days=3))]

    assert ids == [
        "2026-11-02-a1",
        "2026-11-02-a2",
        "2026-11-02-b",
        "2026-11-03-a1",
        "2026-11-03-a2",
        "2026-11-03-b",
    ]


@pytest.mark.parametrize(
    ("start", "end", "days"),
    [
        pytest.param(DAY, NEXT_DAY, ["2026-11-01"], id="one-day"),
        pytest.param(DAY, DAY, [], id="empty-interval"),
        pytest.param(DAY + timedelta(hours=1), NEXT_DAY + timedelta(hours=1), ["2026-11-02"], id="midnight-inside"),
        pytest.param(DAY - timedelta(hours=1), DAY, [], id="end-is-exclusive"),
        pytest.param(
            datetime(2026, 11, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))),
            datetime(2026, 11, 2, 0, 30, tzinfo=timezone(timedelta(hours=1))),
            ["2026-11-01"],
            id="offset-interval-is-compared-in-utc",
        ),
    ],
)
def test_jsonl_day_selection(tmp_path: Path, start: datetime, end: datetime, days: list[str]) -> None:
    for day in ("2026-10-31", "2026-11-01", "2026-11-02"):
        write_day(tmp_path, day, "a.jsonl", [line(ticket(day))])

    assert [d.external_id for d in JsonlSource(tmp_path).read(start, end)] == days


def test_jsonl_missing_inbox_raises(tmp_path: Path) -> None:
    with pytest.raises(SourceError):
        list(JsonlSource(tmp_path / "nowhere").read(DAY, NEXT_DAY))


def test_jsonl_inbox_that_is_a_file_raises(tmp_path: Path) -> None:
    (tmp_path / "inbox").write_text("")

    with pytest.raises(SourceError):
        list(JsonlSource(tmp_path / "inbox").read(DAY, NEXT_DAY))


def test_jsonl_missing_day_folder_is_just_empty(tmp_path: Path) -> None:
    assert list(JsonlSource(tmp_path).read(DAY, NEXT_DAY)) == []


@pytest.mark.parametrize(
    "inbox",
    [
        pytest.param(lambda p: str(p), id="string-path"),
        pytest.param(lambda p: f"file://{p}", id="file-url"),
        pytest.param(lambda p: __import__("upath").UPath(f"memory:///inbox-{p.name}"), id="upath-memory"),
    ],
)
def test_jsonl_accepts_strings_and_object_storage_paths(tmp_path: Path, inbox: Callable[[Path], Any]) -> None:
    target = inbox(tmp_path)
    if not isinstance(target, str):
        (target / "2026-11-01").mkdir(parents=True, exist_ok=True)
        (target / "2026-11-01" / "a.jsonl").write_bytes(line(ticket("M-1")) + b"\n{broken\n")
    else:
        write_day(tmp_path, "2026-11-01", "a.jsonl", [line(ticket("M-1")), b"{broken"])

    documents = list(JsonlSource(target).read(DAY, NEXT_DAY))

    assert [(d.external_id, d.malformed_reason) for d in documents] == [
        ("M-1", None),
        ("2026-11-01/a.jsonl:2", "invalid_json"),
    ]


def test_sample_inbox_is_mostly_valid() -> None:
    documents = list(JsonlSource(SAMPLE_INBOX).read(DAY, DAY + timedelta(days=2)))
    malformed = [d for d in documents if d.malformed_reason]

    assert len(documents) == 21
    assert {d.malformed_reason for d in malformed} == {"invalid_json", "empty_id", "naive_received_at"}


_line_bytes = st.one_of(
    st.binary(max_size=80),
    st.text(max_size=80).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.builds(
        lambda d: json.dumps(d).encode(),
        st.dictionaries(
            st.sampled_from(["id", "subject", "body", "received_at", "channel", "other"]),
            st.none() | st.integers() | st.text(max_size=12) | st.sampled_from(["2026-11-01T00:00:00Z", ""]),
        ),
    ),
    st.builds(lambda ts: line(ticket(received_at=ts)), timestamps),
).map(lambda b: b.replace(b"\n", b" "))


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line_bytes, max_size=12))
def test_jsonl_never_raises_and_never_loses_a_line(tmp_path: Path, lines: list[bytes]) -> None:
    source = JsonlSource(tmp_path)

    documents = list(source.read_lines("2026-11-01/f.jsonl", io.BytesIO(b"".join(b + b"\n" for b in lines))))

    expected = [number for number, raw in enumerate(lines, start=1) if raw.rstrip(b"\r").strip()]
    assert len(documents) == len(expected)
    for number, document in zip(expected, documents, strict=True):
        if document.malformed_reason is None:
            assert DocumentPayload.from_bytes(document.content).external_id == document.external_id
        else:
            assert document.malformed_reason in LINE_REASONS
            assert document.external_id == f"2026-11-01/f.jsonl:{number}"


# -- factory -----------------------------------------------------------------------------------


def test_build_source(tmp_path: Path) -> None:
    assert isinstance(build_source("synthetic", documents=3), SyntheticSource)
    assert isinstance(build_source("jsonl", inbox=tmp_path), JsonlSource)
    with pytest.raises(ValueError, match="unknown source"):
        build_source("ftp")


# -- shards ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_partition_the_source_and_keep_duplicates_together(count: int) -> None:
    from collections import Counter

    from triage.sources.base import Shard, shard_of

    source = SyntheticSource(500, seed=4, duplicate_rate=0.2)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    end = start + timedelta(days=1)
    whole = Counter((d.external_id, d.content) for d in source.read(start, end))
    parts = [list(Shard(source, i, count).read(start, end)) for i in range(count)]
    assert sum((Counter((d.external_id, d.content) for d in part) for part in parts), Counter()) == whole
    for index, part in enumerate(parts):  # every delivery of a document, duplicates too, in one shard
        assert {shard_of(d.external_id, count) for d in part} <= {index}
    if count > 1:
        assert all(parts), "a shard of 500 documents came out empty"


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("seed", [4, 9])
def test_a_synthetic_shard_is_the_whole_read_filtered_in_the_same_order(count: int, seed: int) -> None:
    """A shard of the synthetic source draws the others' documents without building them
    (``read_where``): what it yields is exactly the whole read's share, in order, duplicates
    and their redeliveries included (the skipped draws keep the random stream in step)."""
    from triage.sources.base import FilteredSource, Shard, shard_of

    source = SyntheticSource(2000, seed=seed, duplicate_rate=0.1)
    assert isinstance(source, FilteredSource)
    whole = list(source.read(DAY, NEXT_DAY))
    for index in range(count):
        expected = [d for d in whole if shard_of(d.external_id, count) == index]
        assert list(Shard(source, index, count).read(DAY, NEXT_DAY)) == expected


def test_a_synthetic_shard_builds_only_its_own_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #29, retrieval builds each document once: two shards of a day build its documents
    once between them, not once each."""
    from triage.sources.base import Shard

    source = SyntheticSource(1000, seed=4)
    built = Counter[str]()
    ticket = source._ticket

    def counted(rnd: Callable[[], float], build: bool = True) -> Any:
        built["tickets" if build else "skipped"] += 1
        return ticket(rnd) if build else ticket(rnd, build=False)

    monkeypatch.setattr(source, "_ticket", counted)
    sizes = [sum(1 for _ in Shard(source, index, 2).read(DAY, NEXT_DAY)) for index in range(2)]
    assert sum(sizes) == 1000
    assert built["tickets"] == 1000
    assert built["skipped"] == 1000  # each shard draws the other's documents without building them


def test_a_shard_that_does_not_exist_is_refused() -> None:
    from triage.sources.base import Shard

    with pytest.raises(ValueError, match="shard 2 of 2"):
        Shard(SyntheticSource(1), 2, 2)
