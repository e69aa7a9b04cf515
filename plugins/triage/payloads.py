"""The claim check: payloads stored by content hash, a pack at a time, under a configurable base.

Events and jobs carry ``payload_ref`` (a URI), never the document. The base is a local folder
or any fsspec URL (``s3://bucket/triage``) through ``universal_pathlib``; Airflow's
``ObjectStoragePath`` is such a path too, so the operators may pass one.

Retrieval stores a chunk's payloads as one *pack*: the distinct payloads concatenated, named by
the pack's own sha256 (``<base>/ab/<sha256>``). A payload's reference names its pack and its
bytes, ``<pack>#offset=O&length=L``; a pack of one payload is that payload, referenced without
a fragment. One object per chunk instead of one per document: creating a file was most of what
retrieval cost on local disks, and one PUT per document is what object stores charge for
(docs/adr/0004-payload-packs.md). Every read verifies the payload's own hash, so a torn or
corrupted pack is an error, never a wrong answer; a torn local write is repaired by the next
write of the same pack, which compares what is there with what it would write.

A store reads only references of its own form under its own base: a ``payload_ref`` is data
in a database row, and a row that names another file, ``..`` or another URL is refused
(:class:`PayloadRefInvalid`) before anything is opened, so the hash-verified read cannot be
turned into an oracle over files outside the base.

Here: the store (its base, the names of its objects and references) and the reader. How a chunk
is cut into packs and written durably is :mod:`triage.payload_packs`; the reference form and
the errors are :mod:`triage.payload_refs`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from triage.payload_packs import PACK_BYTES, cut_packs, sha256_hex, write_local, write_object
from triage.payload_refs import (
    MAX_OFFSET,
    MAX_RANGE,
    Location,
    PayloadBaseMissing,
    PayloadCorrupt,
    PayloadError,
    PayloadMissing,
    PayloadRefInvalid,
    PayloadUnavailable,
    parse_ref,
    shown_ref,
)

__all__ = [  # from triage.payload_refs and triage.payload_packs too: callers import them here
    "MAX_OFFSET",
    "MAX_RANGE",
    "PACK_BYTES",
    "Location",
    "PayloadBaseMissing",
    "PayloadCorrupt",
    "PayloadError",
    "PayloadMissing",
    "PayloadRefInvalid",
    "PayloadStore",
    "PayloadUnavailable",
    "parse_ref",
    "read_payload",
    "sha256_hex",
]


def _as_path(location: Any) -> Any:
    """A local ``Path`` for folders and ``file://`` URIs, a ``UPath`` for other URLs, and any
    path object (``ObjectStoragePath``, ``UPath``) as given."""
    if isinstance(location, os.PathLike) and not isinstance(location, str):
        return location
    text = str(location)
    if text.startswith("file://"):
        return Path(unquote(urlparse(text).path))
    if "://" in text:
        if "@" in urlparse(text).netloc:  # Airflow's s3://conn_id@bucket/…: the connection holds the credentials
            from airflow.sdk import ObjectStoragePath

            return ObjectStoragePath(text)
        from upath import UPath

        return UPath(text)
    return Path(text)


class PayloadStore:
    """Content-addressed objects under ``base``: ``<base>/ab/<sha256>``, each a pack of payloads.

    One level of 256 folders, as git does: two levels made nearly every write create a folder.
    Local paths are handled as strings; pathlib cost more than the write itself (measured).
    References are ``<prefix>/ab/<sha256>[#offset=O&length=L]``, the prefix being the base's
    ``file://`` URI (local) or the base's own URL (``s3://conn_id@bucket/triage``); reads
    accept nothing else (:func:`parse_ref`).

    :param pack_bytes: cut packs before they pass this size.
    """

    def __init__(self, base: Any, *, pack_bytes: int = PACK_BYTES) -> None:
        self.base = _as_path(base)
        self.pack_bytes = pack_bytes
        self._local = isinstance(self.base, Path)
        self._made: set[str] = set()
        if self._local:
            root = self.base.resolve()
            self._root = str(root).rstrip("/")  # "/" as a base: objects at "/ab/…", not "//ab/…"
            self.prefix = root.as_uri().rstrip("/")
        else:
            # The prefix as the path type spells it: an object's reference is str() of its path.
            tail = f"/00/{'0' * 64}"
            probe = str(self.base / "00" / ("0" * 64))
            if not probe.endswith(tail):
                raise ValueError(f"the payload base {self.base} does not spell its objects as <base>/ab/<sha256>")
            self.prefix = probe[: -len(tail)]

    def path_for(self, sha256: str) -> Any:
        """The object named ``sha256``: a pack, or the one payload with that hash."""
        if self._local:
            return Path(f"{self._root}/{sha256[:2]}/{sha256}")
        return self.base / sha256[:2] / sha256

    def object_path(self, ref: str) -> Any:
        """The object a reference points into (tools and tests: the pack to open or break).

        :raises PayloadRefInvalid: not a reference of this store.
        """
        return self.path_for(parse_ref(ref, self.prefix).name)

    def _object_path(self, name: str) -> Any:
        """A local path as a string; an object of a remote base as ``base / ab / name``, so it
        keeps the base's connection and options (``s3://conn_id@bucket/…`` read back as a plain
        URL would lose both)."""
        return f"{self._root}/{name[:2]}/{name}" if self._local else self.path_for(name)

    def _object_ref(self, sha256: str) -> str:
        return f"{self.prefix}/{sha256[:2]}/{sha256}"

    def put(self, content: bytes) -> tuple[str, str]:
        """Store one payload (a pack of one); returns ``(sha256, payload_ref)``."""
        return self.put_many([content])[0]

    def put_many(self, contents: Sequence[bytes]) -> list[tuple[str, str]]:
        """Store ``contents`` in as few packs as ``pack_bytes`` allows, each distinct payload once
        per pack; returns ``(sha256, payload_ref)`` of each content, in order. A pack that is
        already stored whole (the same chunk again) is not written twice; one that is there but
        differs (torn, corrupted) is replaced. Thread-safe."""
        digests = [sha256_hex(content) for content in contents]
        refs: list[str] = [""] * len(contents)
        for pack, members in cut_packs(digests, contents, self.pack_bytes):
            alone = len(pack.where) == 1  # the pack is the payload: named by the payload's own hash
            body = b"".join(pack.parts)
            name = digests[members[0]] if alone else sha256_hex(body)
            if self._local:
                write_local(self._root, name, body, self._made)
            else:
                write_object(self.path_for(name), body)
            for i in members:
                offset, length = pack.where[digests[i]]
                refs[i] = self._object_ref(name) + ("" if alone else f"#offset={offset}&length={length}")
        return list(zip(digests, refs, strict=True))

    def get(self, ref: str, expected_sha256: str) -> bytes:
        """The payload at ``ref``, verified against ``expected_sha256``.

        :raises PayloadRefInvalid: ``ref`` is not a reference of this store (nothing is read).
        :raises PayloadMissing: the store is there and the object is not.
        :raises PayloadUnavailable: the store could not be read (its base or the pack's folder
            absent, permissions, I/O).
        :raises PayloadCorrupt: the bytes do not hash to ``expected_sha256``, or fewer bytes
            than the reference names are there.
        """
        result = self.get_many([(ref, expected_sha256)])[0]
        if isinstance(result, PayloadError):
            raise result
        return result

    def get_many(self, wanted: Sequence[tuple[str, str]]) -> list[bytes | PayloadError]:
        """Each ``(payload_ref, expected_sha256)``'s payload, verified, or the error reading it.

        The ranges wanted from one pack are read with one read of the span they cover when
        they fill at least half of it (a claimed batch usually holds a run of one pack's
        payloads: one read instead of one open per payload), else one by one. Only the bytes
        a reference names are returned, and only once they hash to ``expected_sha256``.
        """
        results: list[bytes | PayloadError] = [PayloadError("unread")] * len(wanted)
        by_object: dict[str, list[tuple[int, Location]]] = {}
        for i, (ref, expected) in enumerate(wanted):
            try:
                where = parse_ref(ref, self.prefix)
            except PayloadRefInvalid as exc:
                results[i] = exc
                continue
            if where.offset is None and where.name != expected:
                # A whole object is one payload named by its own hash: anything else is not a
                # reference this store made (a pack read as one document, a mismatched row).
                results[i] = PayloadRefInvalid(
                    f"payload_ref {shown_ref(ref)} names a whole object that is not "
                    "the job's payload (its name is not the job's content hash)"
                )
                continue
            by_object.setdefault(where.name, []).append((i, where))
        for name, members in by_object.items():
            for (i, where), content in zip(members, self._read_object(name, members), strict=True):
                ref, expected = wanted[i]
                results[i] = _verified(ref, content, where.length, expected)
        return results

    def _read_object(self, name: str, members: list[tuple[int, Location]]) -> list[bytes | PayloadError]:
        """The bytes of each member's range, or the one error of the whole object: why it is
        not there (:meth:`_absent`), or :class:`PayloadUnavailable` when the store failed."""
        path = self._object_path(name)
        ranges = [(w.offset, w.length) for _, w in members]
        spans = [(o, o + n) for o, n in ranges if o is not None and n is not None]
        try:
            if 1 < len(spans) == len(ranges):
                start, end = min(a for a, _ in spans), max(b for _, b in spans)
                if 2 * sum(b - a for a, b in spans) >= end - start:
                    block = _read(path, [(start, end - start)])[0]
                    return [block[a - start : b - start] for a, b in spans]
            return [*_read(path, ranges)]
        except FileNotFoundError:
            error = self._absent(name)
        except OSError as exc:
            error = PayloadUnavailable(f"pack {name} could not be read: {type(exc).__name__}")
        return [error] * len(ranges)

    def _absent(self, name: str) -> PayloadError:
        """Why the object ``name`` is not there. The base absent or empty (a volume not mounted
        leaves an empty mount point) or the pack's folder absent: the store is unavailable, a
        transient failure for the circuit breaker. Both there: the payload is gone."""
        try:
            if self._local:
                try:
                    with os.scandir(self._root or "/") as entries:
                        base_empty = next(entries, None) is None
                except (FileNotFoundError, NotADirectoryError):
                    base_empty = True
                folder_there = not base_empty and os.path.isdir(f"{self._root}/{name[:2]}")
            else:
                base_empty = not self.base.exists()
                folder_there = not base_empty and (self.base / name[:2]).exists()
        except OSError as exc:
            return PayloadUnavailable(f"the payload base {self.prefix} could not be read: {type(exc).__name__}")
        if base_empty:
            return PayloadBaseMissing(f"the payload base {self.prefix} is absent or empty (is its volume mounted?)")
        if not folder_there:
            return PayloadUnavailable(f"the folder {name[:2]}/ of pack {name} is absent under {self.prefix}")
        return PayloadMissing(f"pack {name} is not in the payload base {self.prefix}")


def read_payload(ref: str, expected_sha256: str, base: Any) -> bytes:
    """The payload behind ``ref``, verified, from the store at ``base`` only (tools: ``python
    -m triage payload``): a reference outside it is refused, never followed.

    :raises PayloadError: as :meth:`PayloadStore.get`.
    """
    return PayloadStore(base).get(ref, expected_sha256)


def _verified(
    ref: str, content: bytes | PayloadError, length: int | None, expected_sha256: str
) -> bytes | PayloadError:
    if isinstance(content, PayloadError):
        return content
    if length is not None and len(content) != length:
        return PayloadCorrupt(
            f"payload at {shown_ref(ref)} is cut short ({len(content)} of {length} bytes): the pack "
            "is shorter than the range"
        )
    if sha256_hex(content) != expected_sha256:
        return PayloadCorrupt(f"payload at {shown_ref(ref)} does not match its sha256")
    return content


def _read(path: Any, ranges: Sequence[tuple[int | None, int | None]]) -> list[bytes]:
    """The bytes of each ``(offset, length)`` of one object (``offset`` None: all of it): a local
    path (a string) with ``pread``, a path object with one ranged request each, concurrently
    where its filesystem can (``cat_ranges``; a file object's readahead would fetch megabytes
    per range). A range past the end gives fewer bytes, which the caller refuses."""
    if isinstance(path, str):
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            # Never ask for more than the file holds: pread allocates what it is asked for, and a
            # range's length is data from a row (2 GiB would be allocated for a 1 KiB pack).
            return [os.pread(fd, size if o is None else max(0, min(n or 0, size - o)), o or 0) for o, n in ranges]
        finally:
            os.close(fd)
    parts = [b""] * len(ranges)
    ranged = [i for i, (o, _) in enumerate(ranges) if o is not None]
    for i in set(range(len(ranges))) - set(ranged):
        parts[i] = path.read_bytes()
    if ranged:
        starts = [ranges[i][0] or 0 for i in ranged]
        ends = [start + (ranges[i][1] or 0) for i, start in zip(ranged, starts, strict=True)]
        got = path.fs.cat_ranges([path.path] * len(ranged), starts, ends, on_error="raise")
        for i, content in zip(ranged, got, strict=True):
            parts[i] = content
    return parts
