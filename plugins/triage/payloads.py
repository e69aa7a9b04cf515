"""The claim check: each payload stored once, by content hash, under a configurable base.

Events and jobs carry ``payload_ref`` (a URI), never the document. The base is a local folder
or any fsspec URL (``s3://bucket/triage``) through ``universal_pathlib``; Airflow's
``ObjectStoragePath`` is such a path too, so the operators may pass one. Reads verify the hash, so
a torn or corrupted payload is an error, never a wrong answer; a torn local write is repaired
by the next ``put`` of the same content.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse


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


class PayloadStore:
    """Content-addressed payloads under ``base``: ``<base>/ab/<sha256>``.

    One level of 256 folders, as git does: two levels made nearly every write create a folder.
    Local paths are handled as strings; pathlib cost more than the write itself at 100,000
    payloads a run (measured).
    """

    def __init__(self, base: Any) -> None:
        self.base = _as_path(base)
        self._local = isinstance(self.base, Path)
        self._made: set[str] = set()
        if self._local:
            self._root = str(self.base.resolve())
            self._root_uri = self.base.resolve().as_uri()

    def path_for(self, sha256: str) -> Any:
        if self._local:
            return Path(f"{self._root}/{sha256[:2]}/{sha256}")
        return self.base / sha256[:2] / sha256

    def address(self, content: bytes) -> tuple[str, str]:
        """``(sha256, payload_ref)`` of ``content``, without writing it."""
        digest = sha256_hex(content)
        if self._local:
            return digest, f"{self._root_uri}/{digest[:2]}/{digest}"
        return digest, str(self.path_for(digest))

    def write(self, digest: str, content: bytes) -> None:
        """Store ``content`` (whose hash is ``digest``) unless present. Thread-safe."""
        if self._local:
            self._put_local(digest, content)
            return
        path = self.path_for(digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)

    def put(self, content: bytes) -> tuple[str, str]:
        """Store ``content`` unless present; returns ``(sha256, payload_ref)``."""
        digest, ref = self.address(content)
        self.write(digest, content)
        return digest, ref

    def _put_local(self, digest: str, content: bytes) -> None:
        """Create the file exclusively and write it in place: half the system calls of a
        temporary file and a rename, which is what bounds retrieval on this kind of disk. A
        crash mid-write leaves a short file; the next ``put`` sees the wrong size and rewrites
        it atomically, and every read verifies the hash meanwhile."""
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
        """The payload at ``ref``, verified against ``expected_sha256``."""
        local = self._local_path(ref)
        try:
            if local is not None:
                with open(local, "rb") as handle:
                    content: bytes = handle.read()
            else:
                content = _as_path(ref).read_bytes()
        except FileNotFoundError:
            raise PayloadMissing(f"no payload at {ref}") from None
        if sha256_hex(content) != expected_sha256:
            raise PayloadCorrupt(f"payload at {ref} does not match sha256 {expected_sha256}")
        return content
