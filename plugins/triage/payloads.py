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


class PayloadError(Exception):
    """A payload cannot be read."""

    error_class = "payload_error"


class PayloadMissing(PayloadError):
    """No payload at this reference."""

    error_class = "missing_payload"


class PayloadCorrupt(PayloadError):
    """The payload's content does not match its hash."""

    error_class = "payload_corrupt"


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
    if match is None:
        raise PayloadMissing(f"no payload at {ref}: the fragment is not offset=…&length=…")
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
        location = parse_ref(ref).object_ref
        local = self._local_path(location)
        return Path(local) if local is not None else _as_path(location)

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
            if len(pack.where) == 1:  # the pack is the payload: its object is named by its own hash
                self._write(digests[members[0]], pack.parts[0])
                for i in members:
                    refs[i] = self._object_ref(digests[i])
                continue
            body = b"".join(pack.parts)
            name = self._object_ref(sha256_hex(body))
            self._write(sha256_hex(body), body)
            for i in members:
                offset, length = pack.where[digests[i]]
                refs[i] = f"{name}#offset={offset}&length={length}"
        return list(zip(digests, refs, strict=True))

    def _write(self, digest: str, content: bytes) -> None:
        """Store the object ``digest`` unless present."""
        if self._local:
            self._put_local(digest, content)
            return
        path = self.path_for(digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)

    def _put_local(self, digest: str, content: bytes) -> None:
        """Create the file exclusively and write it in place: half the system calls of a
        temporary file and a rename. A crash mid-write leaves a short file, which no job
        references yet (jobs are registered after their pack is written); the next write of the
        same pack sees the wrong size and rewrites it atomically, and every read verifies the
        payload's hash meanwhile."""
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
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    @staticmethod
    def _replace(folder: str, final: str, digest: str, content: bytes) -> None:
        tmp = f"{folder}/.{digest}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(content)
        os.replace(tmp, final)

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

    def _read_object(self, object_ref: str, members: list[tuple[int, Location]]) -> list[bytes | None]:
        """The bytes of each member's range (``None``: no such object)."""
        local = self._local_path(object_ref)
        path: Any = local if local is not None else _as_path(object_ref)
        ranges = [(w.offset, w.length) for _, w in members]
        try:
            if len(ranges) > 1 and all(o is not None and n is not None for o, n in ranges):
                spans = [(o, o + n) for o, n in ranges if o is not None and n is not None]
                start, end = min(a for a, _ in spans), max(b for _, b in spans)
                if 2 * sum(b - a for a, b in spans) >= end - start:
                    block = _read(path, start, end - start)
                    return [block[a - start : b - start] for a, b in spans]
            return [_read(path, o, n) for o, n in ranges]
        except FileNotFoundError:
            return [None] * len(ranges)


def read_payload(ref: str, expected_sha256: str) -> bytes:
    """The payload behind any reference, verified, without knowing the store's base (tools:
    ``python -m triage payload``)."""
    return PayloadStore(Path("/")).get(ref, expected_sha256)


def _verified(ref: str, content: bytes | None, length: int | None, expected_sha256: str) -> bytes | PayloadError:
    if content is None:
        return PayloadMissing(f"no payload at {ref}")
    if length is not None and len(content) != length:
        return PayloadCorrupt(f"payload at {ref} is cut short ({len(content)} of {length} bytes)")
    if sha256_hex(content) != expected_sha256:
        return PayloadCorrupt(f"payload at {ref} does not match sha256 {expected_sha256}")
    return content


def _read(path: Any, offset: int | None, length: int | None) -> bytes:
    """``length`` bytes at ``offset`` of a local path (a string) or a path object; the whole
    object when ``offset`` is None."""
    if isinstance(path, str):
        if offset is None:
            with open(path, "rb") as handle:
                return handle.read()
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, length or 0, offset)
        finally:
            os.close(fd)
    if offset is None:
        whole: bytes = path.read_bytes()
        return whole
    with path.open("rb") as handle:
        handle.seek(offset)
        part: bytes = handle.read(length)
    return part
