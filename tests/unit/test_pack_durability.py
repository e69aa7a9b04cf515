"""A new pack is durable, bytes and name, before the writer returns: its file and its folder are
both fsynced (at once, the folder's from a thread), and a failure of either reaches the caller;
a pack reused while retention removes it is never lost."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from triage import payload_packs
from triage.maintenance import files
from triage.payload_packs import sha256_hex, write_local


def _recording_fsync(monkeypatch: pytest.MonkeyPatch, fail_on: str | None = None) -> list[str]:
    synced: list[str] = []
    lock = threading.Lock()
    real = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if fail_on is not None and path.endswith(fail_on):
            raise OSError(5, "Input/output error", path)
        real(fd)
        with lock:
            synced.append(path)

    monkeypatch.setattr(payload_packs.os, "fsync", fsync)
    return synced


def test_a_new_pack_and_its_folder_are_fsynced_before_the_write_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = _recording_fsync(monkeypatch)
    content = b"payload bytes"
    digest = sha256_hex(content)
    write_local(str(tmp_path), digest, content, set())
    folder = tmp_path / digest[:2]
    assert sorted(synced) == sorted([str(folder), str(folder / digest)])
    assert (folder / digest).read_bytes() == content


@pytest.mark.parametrize("failing", ["folder", "file"])
def test_a_failed_fsync_of_the_file_or_its_folder_reaches_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    content = b"payload bytes"
    digest = sha256_hex(content)
    _recording_fsync(monkeypatch, fail_on=digest[:2] if failing == "folder" else digest)
    with pytest.raises(OSError, match="Input/output error"):
        write_local(str(tmp_path), digest, content, set())


def test_a_pack_reused_while_retention_removes_it_survives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention has re-checked an old pack and is about to unlink it when a writer reuses it
    (finds it byte-identical and touches it; its jobs will point into it). The writer waits for
    the payload base's lock, so the removal comes first and the writer writes the pack anew.
    Without the lock the writer's touch landed between the re-check and the unlink, and the
    pack of a just-acknowledged document was gone."""
    content = b"payload bytes"
    digest = sha256_hex(content)
    write_local(str(tmp_path), digest, content, set())
    pack = tmp_path / digest[:2] / digest
    os.utime(pack, (1_000_000, 1_000_000))  # last written long before the cutoff
    before = 2_000_000.0
    old = files.old_payload_packs(tmp_path, before)
    assert old == [(pack, len(content))]

    # The interleaving is forced by events, never by sleeps: retention's re-check starts the
    # writer and goes on only once the writer has finished, or is waiting for the lock.
    writer_finished_or_waiting = threading.Event()
    failures: list[BaseException] = []

    def reuse() -> None:
        try:
            write_local(str(tmp_path), digest, content, set())
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failures.append(exc)
        finally:
            writer_finished_or_waiting.set()

    writer = threading.Thread(target=reuse, name="pack-writer")
    real_flock = fcntl.flock

    def flock(fd: int, operation: int) -> None:
        if threading.current_thread() is writer and not operation & fcntl.LOCK_NB:
            try:
                real_flock(fd, operation | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                writer_finished_or_waiting.set()  # it waits for retention's removal to finish
        real_flock(fd, operation)

    real_still_older = files._still_older

    def still_older(path: Path, cutoff: float) -> bool:
        answer = real_still_older(path, cutoff)
        writer.start()
        writer_finished_or_waiting.wait()
        return answer

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(files, "_still_older", still_older)
    removed = files.remove_payload_packs(old, set(), before)
    writer.join()

    assert failures == []
    assert removed.files == 1  # the old pack went, and then its writer made it again
    assert pack.read_bytes() == content
    assert pack.stat().st_mtime > before
