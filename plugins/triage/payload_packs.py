"""The pack writer: how a chunk's payloads are cut into packs, and how a pack is written once,
durably, under a payload base (docs/adr/0004-payload-packs.md).

A pack is the distinct payloads of a run of a chunk, concatenated and named by its own sha256
(a pack of one payload is that payload, named by its hash). :class:`~triage.payloads.PayloadStore`
names the objects and their references; this module decides what goes in each pack and puts
its bytes on disk or in an object store, never twice and never torn.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

PACK_BYTES = 8 * 1024 * 1024
"""A pack is cut before it would pass this size (a payload larger than it is a pack of its own)."""


LOCK_NAME = ".packs.lock"
"""The lock file of a local payload base (``<root>/.packs.lock``): no pack is named like it."""


@contextmanager
def packs_lock(root: str, *, exclusive: bool) -> Iterator[None]:
    """Hold the lock of the local payload base ``root`` (``flock`` on its :data:`LOCK_NAME`) for
    the block: shared by the writers (:func:`write_local`), exclusive for retention's removal of
    a pack (:func:`triage.maintenance.files.remove_payload_packs`).

    A writer that finds a byte-identical pack reuses it (its jobs will point into it) and
    touches it, so that retention, which removes a pack last written before its cutoff, keeps
    it. Without a lock retention could stat the pack (old), the writer touch it and commit its
    jobs, and retention then unlink it: a just-acknowledged document without its payload. Under
    the lock either retention's re-check sees the touch, or the removal comes first and the
    writer, finding no pack, writes it anew. Writers share it (they never wait for each other);
    retention holds it for one re-check and unlink at a time."""
    fd = os.open(f"{root}/{LOCK_NAME}", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def sha256_hex(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


class Pack:
    """The distinct payloads of one pack being built, in order, each once.

    :ivar where: each payload's digest -> its ``(offset, length)`` in the pack.
    """

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.where: dict[str, tuple[int, int]] = {}

    def add(self, digest: str, content: bytes) -> None:
        if digest not in self.where:
            self.where[digest] = (self.size, len(content))
            self.parts.append(content)
            self.size += len(content)


def cut_packs(digests: Sequence[str], contents: Sequence[bytes], pack_bytes: int) -> list[tuple[Pack, list[int]]]:
    """``contents`` (with their ``digests``) in as few packs as ``pack_bytes`` allows, in order:
    each pack with the indexes of the contents it holds (a repeated payload is stored once)."""
    packs: list[tuple[Pack, list[int]]] = []
    pack: Pack | None = None
    for i, (digest, content) in enumerate(zip(digests, contents, strict=True)):
        fits = pack is not None and (digest in pack.where or pack.size + len(content) <= pack_bytes)
        if pack is None or not fits:
            pack = Pack()
            packs.append((pack, []))
        pack.add(digest, content)
        packs[-1][1].append(i)
    return packs


def write_object(path: Any, content: bytes) -> None:
    """Store ``content`` at ``path`` of an object store unless it is there with exactly those bytes."""
    try:
        # The object is named by its hash, so "there and the same bytes" is the whole test;
        # a size alone would trust a corrupted object of the right size. One GET, on
        # re-runs only (a new pack is a 404, then the PUT).
        if path.read_bytes() == content:
            return
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)  # an object store's PUT is durable once it returns


def write_local(root: str, digest: str, content: bytes, made: set[str]) -> None:
    """Store the object ``digest`` under the local folder ``root`` (``<root>/ab/<digest>``)
    unless it is there with exactly ``content``.

    Create the file exclusively, write it in place and fsync it and its folder before
    returning: the jobs that point into it are committed next, durably, so the pack must be
    on disk first (one fsync per pack, not per document). A crash mid-write leaves a short or
    torn file that no job references yet; the next write of the same pack compares it with the
    pack (its name is the pack's hash: equal bytes are the whole check) and replaces it
    atomically unless equal, and every read verifies the payload's hash meanwhile.

    :param made: the folders known to exist (this call adds to it).
    """
    folder = f"{root}/{digest[:2]}"
    final = f"{folder}/{digest}"
    if folder not in made:
        os.makedirs(folder, exist_ok=True)
        made.add(folder)
    # Shared with other writers, exclusive of retention's removals (packs_lock says why).
    with packs_lock(root, exclusive=False):
        try:
            fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            # Its name is the pack's hash, so equal bytes are the whole check (a size would trust
            # a torn or corrupted file of the right length). Reading and comparing a pack costs
            # ~0.4 ms; an fsync of it (durable already, unless a concurrent writer of the same
            # chunk has not synced yet) ~3 ms on this machine's disk, so it is not done.
            if not _holds(final, content):
                _replace(folder, final, digest, content)
            else:
                # Reused now: retention keeps a pack until its last writer is older than the
                # payloads' retention (triage.maintenance.files), so the reuse counts as a write.
                os.utime(final)
            return
        try:
            _write_all(fd, content)
            _fsync_with_folder(fd, folder)
        finally:
            os.close(fd)


def _fsync_with_folder(fd: int, folder: str) -> None:
    """Make a new file's bytes (``fd``) and its name in ``folder`` durable, both before this
    returns. Either may become durable first (no job points into the file until both have), so
    they are asked for at once, the folder's from a thread: the file system serves both with one
    journal commit (ext4 here: ~1.5 ms, against ~6 ms one after the other; measured)."""
    failed: list[OSError] = []

    def sync_folder() -> None:
        try:
            _fsync_folder(folder)
        except OSError as exc:
            failed.append(exc)

    syncing = threading.Thread(target=sync_folder, name="pack-folder-fsync")
    syncing.start()
    try:
        os.fsync(fd)
    finally:
        syncing.join()
    if failed:
        raise failed[0]


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


def _holds(path: str, content: bytes) -> bool:
    """Whether the file at ``path`` is exactly ``content`` (a file of another size is not read)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.fstat(fd).st_size == len(content) and os.pread(fd, len(content), 0) == content
    finally:
        os.close(fd)


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
