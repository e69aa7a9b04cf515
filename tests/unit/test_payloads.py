"""The payload store on real files, without a database: which references it reads (only its
own, under its base), why an absent object is absent, and packs that are there but wrong."""

from __future__ import annotations

import hashlib
import os
import sys
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.payloads import (
    MAX_RANGE,
    Location,
    PayloadBaseMissing,
    PayloadCorrupt,
    PayloadMissing,
    PayloadRefInvalid,
    PayloadStore,
    PayloadUnavailable,
    parse_ref,
    read_payload,
)

PREFIX = "file:///srv/triage/payloads"
SHA = hashlib.sha256(b"a document").hexdigest()
OBJ = f"{PREFIX}/{SHA[:2]}/{SHA}"


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


# -- the form of a reference ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        pytest.param(OBJ, Location(SHA), id="whole-object"),
        pytest.param(f"{OBJ}#offset=0&length=0", Location(SHA, 0, 0), id="empty-payload"),
        pytest.param(f"{OBJ}#offset=491&length=12", Location(SHA, 491, 12), id="range"),
        pytest.param(f"{OBJ}#offset=0&length={MAX_RANGE}", Location(SHA, 0, MAX_RANGE), id="longest-range"),
    ],
)
def test_the_store_s_own_references_are_accepted(ref: str, expected: Location) -> None:
    assert parse_ref(ref, PREFIX) == expected


@pytest.mark.parametrize(
    "ref",
    [
        pytest.param("/etc/passwd", id="absolute-path"),
        pytest.param("file:///etc/passwd", id="file-uri-elsewhere"),
        pytest.param("file:///etc/passwd#offset=0&length=1", id="one-byte-oracle-elsewhere"),
        pytest.param(f"{PREFIX}/../../../etc/passwd", id="dot-dot"),
        pytest.param(f"{PREFIX}/{SHA[:2]}/../../{SHA[:2]}/{SHA}", id="dot-dot-back-in"),
        pytest.param(f"{PREFIX}/%2e%2e/{SHA[:2]}/{SHA}", id="encoded-dot-dot"),
        pytest.param(f"{PREFIX}-other/{SHA[:2]}/{SHA}", id="sibling-base"),
        pytest.param(f"{PREFIX}/{SHA}", id="no-folder"),
        pytest.param(f"{PREFIX}/ff/{SHA}", id="folder-not-the-name"),
        pytest.param(f"{PREFIX}/{SHA[:2].upper()}/{SHA.upper()}", id="upper-case"),
        pytest.param(f"{PREFIX}/{SHA[:2]}/{SHA[:63]}", id="short-name"),
        pytest.param(f"{OBJ}/", id="trailing-slash"),
        pytest.param(f"{OBJ}\n", id="trailing-newline"),
        pytest.param(f"{OBJ}?versionId=1", id="query"),
        pytest.param(f"{OBJ}#offset=0", id="no-length"),
        pytest.param(f"{OBJ}#length=1&offset=0", id="swapped"),
        pytest.param(f"{OBJ}#offset=-1&length=1", id="negative"),
        pytest.param(f"{OBJ}#offset=01&length=1", id="leading-zero"),
        pytest.param(f"{OBJ}#offset=+1&length=1", id="plus-sign"),
        pytest.param(f"{OBJ}#offset=\u0661&length=1", id="unicode-digit"),
        pytest.param(f"{OBJ}#offset=0&length={MAX_RANGE + 1}", id="range-too-long"),
        pytest.param(f"{OBJ}#offset={2**64}&length=1", id="offset-too-far"),
        pytest.param(f"{OBJ}#offset=0&length=1#offset=0&length=2", id="two-fragments"),
        pytest.param("memory://elsewhere/" + f"{SHA[:2]}/{SHA}", id="another-url"),
        pytest.param("https://169.254.169.254/latest/meta-data", id="http-url"),
        pytest.param("", id="empty"),
        pytest.param(None, id="none"),
    ],
)
def test_anything_else_is_refused(ref: object) -> None:
    with pytest.raises(PayloadRefInvalid):
        parse_ref(ref, PREFIX)


hex64 = st.text("0123456789abcdef", min_size=64, max_size=64)


@given(st.text(max_size=300))
def test_arbitrary_text_is_a_location_or_a_refusal(text: str) -> None:
    for ref in (text, PREFIX + text, f"{OBJ}{text}"):
        try:
            where = parse_ref(ref, PREFIX)
        except PayloadRefInvalid:
            continue
        # Whatever is accepted is spelled exactly as the store writes it: nothing but the name
        # and the range can vary, so no path outside <base>/ab/ can come out of it.
        fragment = "" if where.offset is None else f"#offset={where.offset}&length={where.length}"
        assert ref == f"{PREFIX}/{where.name[:2]}/{where.name}{fragment}"


@given(hex64, st.one_of(st.none(), st.tuples(st.integers(0, 2**53), st.integers(0, MAX_RANGE))))
def test_every_reference_of_the_store_s_form_round_trips(name: str, fragment: tuple[int, int] | None) -> None:
    ref = f"{PREFIX}/{name[:2]}/{name}" + ("" if fragment is None else "#offset={}&length={}".format(*fragment))
    assert parse_ref(ref, PREFIX) == Location(name, *(fragment or (None, None)))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=8))
def test_every_reference_the_store_writes_is_one_it_reads(
    tmp_path_factory: pytest.TempPathFactory, contents: list[bytes]
) -> None:
    payloads = PayloadStore(tmp_path_factory.mktemp("payloads"))
    for content, (digest, ref) in zip(contents, payloads.put_many(contents), strict=True):
        assert parse_ref(ref, payloads.prefix).name == payloads.object_path(ref).name
        assert payloads.get(ref, digest) == content


# -- reads never leave the base ------------------------------------------------------------------


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """Every path this process opens while the test runs (the ``open`` audit event is raised
    by ``os.open`` and ``open`` alike): proof that a refused reference is never read."""
    seen: list[str] = []
    _OPENS.append(seen)
    yield seen
    _OPENS.remove(seen)


_OPENS: list[list[str]] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _OPENS and isinstance(args[0], str | bytes | os.PathLike):
        _OPENS[-1].append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # cannot be removed: it only records while a test holds `opened`


def test_a_reference_outside_the_base_is_refused_before_anything_is_opened(tmp_path: Path, opened: list[str]) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s3cr3t")
    other = PayloadStore(tmp_path / "other")
    _, foreign = other.put(b"another store's document")
    payloads = PayloadStore(tmp_path / "payloads")
    digest, own = payloads.put_many([b"one", b"two"])[0]
    pack = own.split("#")[0]
    hostile = [
        (f"{secret.as_uri()}#offset=0&length=1", sha(b"s")),  # the per-byte oracle
        (secret.as_uri(), sha(b"s3cr3t")),
        (str(secret), sha(b"s3cr3t")),
        (f"{payloads.prefix}/{digest[:2]}/../../secret.txt", sha(b"s3cr3t")),
        (foreign, sha(b"another store's document")),
        (f"memory://triage-{uuid.uuid4().hex}/{digest[:2]}/{digest}", digest),
        (pack, digest),  # a pack of two read as one payload under another payload's hash
    ]
    opened.clear()
    results = payloads.get_many(hostile)
    assert [type(r) for r in results] == [PayloadRefInvalid] * len(hostile)
    assert opened == []  # not even the store's own pack
    assert payloads.get(own, digest) == b"one"


def test_the_verified_bytes_are_exactly_the_bytes_returned_and_a_range_stays_in_its_pack(tmp_path: Path) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    (a, ref_a), (b, ref_b) = payloads.put_many([b"alpha", b"beta"])
    pack = ref_a.split("#")[0]
    assert payloads.get_many([(ref_a, a), (ref_b, b)]) == [b"alpha", b"beta"]  # one read of the span
    with pytest.raises(PayloadCorrupt, match="cut short"):  # past the pack's end: never padded, never more
        payloads.get(f"{pack}#offset=5&length=5", sha(b"beta\x00"))
    with pytest.raises(PayloadCorrupt):  # the right bytes under the wrong hash
        payloads.get(ref_a, b)


def test_a_long_range_costs_the_pack_s_size_not_the_range_s(tmp_path: Path) -> None:
    """A reference's length is data from a row: reading it never allocates more than the pack."""
    payloads = PayloadStore(tmp_path / "payloads")
    (a, ref_a), _ = payloads.put_many([b"alpha", b"beta"])
    pack = ref_a.split("#")[0]
    tracemalloc.start()
    try:
        with pytest.raises(PayloadCorrupt, match="cut short"):
            payloads.get(f"{pack}#offset=0&length={2**30}", a)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_read_payload_reads_only_from_the_base_it_is_given(tmp_path: Path) -> None:
    digest, ref = PayloadStore(tmp_path / "payloads").put(b"a document")
    assert read_payload(ref, digest, tmp_path / "payloads") == b"a document"
    assert read_payload(ref, digest, str(tmp_path / "payloads")) == b"a document"
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s3cr3t")
    with pytest.raises(PayloadRefInvalid):
        read_payload(secret.as_uri(), sha(b"s3cr3t"), tmp_path / "payloads")
    with pytest.raises(PayloadRefInvalid):
        read_payload(ref, digest, tmp_path / "elsewhere")


# -- why an object is absent -------------------------------------------------------------------


def _absent_base(base: Path) -> None:
    for p in sorted(base.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    base.rmdir()


def _empty_base(base: Path) -> None:
    _absent_base(base)
    base.mkdir()  # a mount point whose volume is not mounted


@pytest.mark.parametrize(
    ("breakage", "error"),
    [
        pytest.param("pack", PayloadMissing, id="pack-gone-store-healthy"),
        pytest.param("folder", PayloadUnavailable, id="pack-folder-absent"),
        pytest.param("base", PayloadBaseMissing, id="base-absent"),
        pytest.param("empty", PayloadBaseMissing, id="base-empty"),
    ],
)
def test_an_absent_object_says_whether_the_store_or_the_payload_is_gone(
    tmp_path: Path, breakage: str, error: type[Exception]
) -> None:
    base = tmp_path / "payloads"
    payloads = PayloadStore(base)
    digest, ref = payloads.put(b"a document")
    other, _ = payloads.put(b"a document in another folder")
    assert other[:2] != digest[:2]
    pack = payloads.object_path(ref)
    if breakage == "pack":
        pack.unlink()
    elif breakage == "folder":
        pack.unlink()
        pack.parent.rmdir()
    else:
        (_absent_base if breakage == "base" else _empty_base)(base)
    with pytest.raises(error) as raised:
        payloads.get(ref, digest)
    assert type(raised.value) is error
    assert isinstance(raised.value, PayloadUnavailable) == (breakage != "pack")  # transient but a gone pack


# -- a pack that is there but wrong --------------------------------------------------------------


def _flip(path: Path) -> None:
    body = bytearray(path.read_bytes())
    body[len(body) // 2] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(body))


@pytest.mark.parametrize(
    "contents", [pytest.param([b"one document"], id="alone"), pytest.param([b"first", b"second", b"third"], id="pack")]
)
def test_a_stored_pack_of_the_right_size_with_other_bytes_is_rewritten(tmp_path: Path, contents: list[bytes]) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    stored = payloads.put_many(contents)
    pack = payloads.object_path(stored[0][1])
    _flip(pack)
    with pytest.raises(PayloadCorrupt):
        payloads.get(stored[len(contents) // 2][1], stored[len(contents) // 2][0])
    assert PayloadStore(tmp_path / "payloads").put_many(contents) == stored  # the same chunk again
    assert sha(pack.read_bytes()) == pack.name  # repaired, not trusted for its size
    assert [payloads.get(ref, digest) for digest, ref in stored] == contents
    assert [p.name for p in pack.parent.iterdir()] == [pack.name]  # no temporary file left behind


def test_an_intact_pack_is_not_rewritten(tmp_path: Path) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    stored = payloads.put_many([b"first", b"second"])
    pack = payloads.object_path(stored[0][1])
    os.utime(pack, (1_000_000_000, 1_000_000_000))  # written long ago
    before = pack.stat()
    assert payloads.put_many([b"first", b"second"]) == stored
    after = pack.stat()
    assert after.st_ino == before.st_ino  # the same file: a rewrite renames a new one in place
    # Reused now: its time is touched, so retention counts it as written today
    # (triage.maintenance.files removes packs by their last write).
    assert after.st_mtime > before.st_mtime


def test_an_object_of_the_right_size_with_other_bytes_is_rewritten_on_object_storage() -> None:
    payloads = PayloadStore(f"memory://triage-test-{uuid.uuid4().hex}")
    stored = payloads.put_many([b"first", b"second"])
    pack = payloads.object_path(stored[0][1])
    body = pack.read_bytes()
    pack.write_bytes(body.upper())
    assert payloads.put_many([b"first", b"second"]) == stored
    assert pack.read_bytes() == body
