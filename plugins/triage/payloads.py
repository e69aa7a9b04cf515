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
write of the same pack.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

PACK_BYTES = 8 * 1024 * 1024
"""A pack is cut before it would pass this size (a payload larger than it is a pack of its own)."""
MAX_RANGE = 2**31 - 1
"""The longest byte range a reference may name (a larger payload is an object of its own)."""


class PayloadError(Exception):
    """A payload cannot be read."""

    error_class = "payload_error"


class PayloadMissing(PayloadError):
    """No payload at this reference."""

    error_class = "missing_payload"


class PayloadCorrupt(PayloadError):
    """The payload's content does not match its hash."""

    error_class = "payload_corrupt"


class PayloadUnavailable(PayloadError):
    """The store could not be read just now (permissions, I/O, network): worth another try."""

    error_class = "payload_unavailable"


def sha256_hex(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


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


@dataclass(frozen=True, slots=True)
class Location:
    """Where a reference points: the object, and the payload's bytes in it (``None``: all of it)."""

    object_ref: str
    offset: int | None = None
    length: int | None = None


_FRAGMENT = re.compile(r"offset=(\d+)&length=(\d+)")


def parse_ref(ref: str) -> Location:
    """Split ``<object>#offset=O&length=L``; a reference without a fragment is a whole object.

    :raises PayloadMissing: the fragment is not such a byte range.
    """
    base, sep, fragment = ref.partition("#")
    if not sep:
        return Location(ref)
    match = _FRAGMENT.fullmatch(fragment)
    if match is None or int(match[2]) > MAX_RANGE:
        raise PayloadMissing(f"no payload at {ref}: the fragment is not offset=…&length=… (at most {MAX_RANGE})")
    return Location(base, int(match[1]), int(match[2]))


class _Pack:
    """The distinct payloads of one pack being built, in order, each once."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.where: dict[str, tuple[int, int]] = {}

    def add(self, digest: str, content: bytes) -> None:
        if digest not in self.where:
            self.where[digest] = (self.size, len(content))
            self.parts.append(content)
            self.size += len(content)


class PayloadStore:
    """Content-addressed objects under ``base``: ``<base>/ab/<sha256>``, each a pack of payloads.

    One level of 256 folders, as git does: two levels made nearly every write create a folder.
    Local paths are handled as strings; pathlib cost more than the write itself (measured).

    :param pack_bytes: cut packs before they pass this size.
    """

    def __init__(self, base: Any, *, pack_bytes: int = PACK_BYTES) -> None:
        self.base = _as_path(base)
        self.pack_bytes = pack_bytes
        self._local = isinstance(self.base, Path)
        self._made: set[str] = set()
        if self._local:
            self._root = str(self.base.resolve())
            self._root_uri = self.base.resolve().as_uri()

    def path_for(self, sha256: str) -> Any:
        """The object named ``sha256``: a pack, or the one payload with that hash."""
        if self._local:
            return Path(f"{self._root}/{sha256[:2]}/{sha256}")
        return self.base / sha256[:2] / sha256

    def object_path(self, ref: str) -> Any:
        """The object a reference points into (tools and tests: the pack to open or break)."""
        path = self._object_path(parse_ref(ref).object_ref)
        return Path(path) if isinstance(path, str) else path

    def _object_path(self, object_ref: str) -> Any:
        """A local path as a string; an object under this store's base as ``base / key``, so it
        keeps the base's connection and options (``s3://conn_id@bucket/…`` read back as a
        plain URL would lose both); any other URL as :func:`_as_path` makes it."""
        local = self._local_path(object_ref)
        if local is not None:
            return local
        if not self._local:
            prefix = str(self.base).rstrip("/") + "/"
            if object_ref.startswith(prefix):
                return self.base.joinpath(*object_ref[len(prefix) :].split("/"))
        path = _as_path(object_ref)
        return str(path) if isinstance(path, Path) else path

    def _object_ref(self, sha256: str) -> str:
        if self._local:
            return f"{self._root_uri}/{sha256[:2]}/{sha256}"
        return str(self.path_for(sha256))

    def put(self, content: bytes) -> tuple[str, str]:
        """Store one payload (a pack of one); returns ``(sha256, payload_ref)``."""
        return self.put_many([content])[0]

    def put_many(self, contents: Sequence[bytes]) -> list[tuple[str, str]]:
        """Store ``contents`` in as few packs as ``pack_bytes`` allows, each distinct payload once
        per pack; returns ``(sha256, payload_ref)`` of each content, in order. Packs that are
        already stored (the same chunk again) are not written twice. Thread-safe."""
        digests = [sha256_hex(content) for content in contents]
        packs: list[tuple[_Pack, list[int]]] = []
        pack: _Pack | None = None
        for i, (digest, content) in enumerate(zip(digests, contents, strict=True)):
            fits = pack is not None and (digest in pack.where or pack.size + len(content) <= self.pack_bytes)
            if pack is None or not fits:
                pack = _Pack()
                packs.append((pack, []))
            pack.add(digest, content)
            packs[-1][1].append(i)
        refs: list[str] = [""] * len(contents)
        for pack, members in packs:
            alone = len(pack.where) == 1  # the pack is the payload: named by the payload's own hash
            body = b"".join(pack.parts)
            name = digests[members[0]] if alone else sha256_hex(body)
            self._write(name, body)
            for i in members:
                offset, length = pack.where[digests[i]]
                refs[i] = self._object_ref(name) + ("" if alone else f"#offset={offset}&length={length}")
        return list(zip(digests, refs, strict=True))

    def _write(self, digest: str, content: bytes) -> None:
        """Store the object ``digest`` unless present."""
        if self._local:
            self._put_local(digest, content)
            return
        path = self.path_for(digest)
        if path.exists() and path.stat().st_size == len(content):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)  # an object store's PUT is durable once it returns

    def _put_local(self, digest: str, content: bytes) -> None:
        """Create the file exclusively, write it in place and fsync it and its folder before
        returning: the jobs that point into it are committed next, durably, so the pack must be
        on disk first (one fsync per pack, not per document). A crash mid-write leaves a short
        file that no job references yet; the next write of the same pack sees the wrong size
        and replaces it atomically, and every read verifies the payload's hash meanwhile."""
        folder = f"{self._root}/{digest[:2]}"
        final = f"{folder}/{digest}"
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        try:
            fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if os.stat(final).st_size != len(content):
                self._replace(folder, final, digest, content)
            return
        try:
            _write_all(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_folder(folder)

    @staticmethod
    def _replace(folder: str, final: str, digest: str, content: bytes) -> None:
        tmp = f"{folder}/.{digest}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        _fsync_folder(folder)

    def _local_path(self, ref: str) -> str | None:
        if self._local and ref.startswith(self._root_uri + "/"):
            return self._root + ref[len(self._root_uri) :]
        return None

    def get(self, ref: str, expected_sha256: str) -> bytes:
        """The payload at ``ref``, verified against ``expected_sha256``.

        :raises PayloadMissing: no object at ``ref``, or a reference that names no byte range.
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
        payloads: one read instead of one open per payload), else one by one.
        """
        results: list[bytes | PayloadError] = [PayloadError("unread")] * len(wanted)
        by_object: dict[str, list[tuple[int, Location]]] = {}
        for i, (ref, _) in enumerate(wanted):
            try:
                where = parse_ref(ref)
            except PayloadMissing as exc:
                results[i] = exc
                continue
            by_object.setdefault(where.object_ref, []).append((i, where))
        for object_ref, members in by_object.items():
            for (i, where), content in zip(members, self._read_object(object_ref, members), strict=True):
                ref, expected = wanted[i]
                results[i] = _verified(ref, content, where.length, expected)
        return results

    def _read_object(self, object_ref: str, members: list[tuple[int, Location]]) -> list[bytes | PayloadError | None]:
        """The bytes of each member's range, ``None`` when there is no such object, or
        :class:`PayloadUnavailable` (transient) when the store failed."""
        path = self._object_path(object_ref)
        ranges = [(w.offset, w.length) for _, w in members]
        spans = [(o, o + n) for o, n in ranges if o is not None and n is not None]
        try:
            if 1 < len(spans) == len(ranges):
                start, end = min(a for a, _ in spans), max(b for _, b in spans)
                if 2 * sum(b - a for a, b in spans) >= end - start:
                    block = _read(path, [(start, end - start)])[0]
                    return [block[a - start : b - start] for a, b in spans]
            return list(_read(path, ranges))
        except FileNotFoundError:
            return [None] * len(ranges)
        except OSError as exc:
            error = PayloadUnavailable(f"{object_ref} could not be read: {type(exc).__name__}")
            return [error] * len(ranges)


def read_payload(ref: str, expected_sha256: str) -> bytes:
    """The payload behind any reference, verified, without knowing the store's base (tools:
    ``python -m triage payload``)."""
    return PayloadStore(Path("/")).get(ref, expected_sha256)


def _verified(
    ref: str, content: bytes | PayloadError | None, length: int | None, expected_sha256: str
) -> bytes | PayloadError:
    if content is None:
        return PayloadMissing(f"no payload at {ref}")
    if isinstance(content, PayloadError):
        return content
    if length is not None and len(content) != length:
        return PayloadCorrupt(f"payload at {ref} is cut short ({len(content)} of {length} bytes)")
    if sha256_hex(content) != expected_sha256:
        return PayloadCorrupt(f"payload at {ref} does not match sha256 {expected_sha256}")
    return content


def _read(path: Any, ranges: Sequence[tuple[int | None, int | None]]) -> list[bytes]:
    """The bytes of each ``(offset, length)`` of one object (``offset`` None: all of it): a local
    path (a string) with ``pread``, a path object with one ranged request each, concurrently
    where its filesystem can (``cat_ranges``; a file object's readahead would fetch megabytes
    per range)."""
    if isinstance(path, str):
        fd = os.open(path, os.O_RDONLY)
        try:
            return [os.pread(fd, os.fstat(fd).st_size, 0) if o is None else os.pread(fd, n or 0, o) for o, n in ranges]
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


def _write_all(fd: int, content: bytes) -> None:
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_folder(folder: str) -> None:
    """Make a new name in ``folder`` durable (its directory entry)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
