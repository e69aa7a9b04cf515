"""A new pack is durable, bytes and name, before the writer returns: its file and its folder are
both fsynced (at once, the folder's from a thread), and a failure of either reaches the caller."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from triage import payload_packs
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
