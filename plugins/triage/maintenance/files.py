"""Retention of files: payload packs, the event sink's rotated files, reconciliation reports.

A file is removed when it was last written before the cutoff (its ``mtime``) and, for a payload
pack, when no open job (nor labelled example) references it. A pack is touched when a chunk reuses it
(:func:`triage.payload_packs.write_local`), so an old ``mtime`` means no writer has needed it
since; it is stat'ed again just before its removal, after the open references were read, under
the payload base's lock (:func:`triage.payload_packs.packs_lock`), which a writer holds from
finding the pack to touching it: a reuse is either seen by that re-check or comes after the
removal (and writes the pack anew).
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from triage.payload_packs import packs_lock

ROTATED = re.compile(r"\.\d{8}T\d{6}Z$")
"""The suffix of a rotated event file: ``outbox.jsonl.20261201T020000Z``."""
PACK_NAME = re.compile(r"^[0-9a-f]{64}$")
REPORT_NAME = re.compile(r"^reconciliation-\d{8}T\d{6}Z-run\d+\.html$")


@dataclass
class Removed:
    """What one kind's retention removed: files and bytes, and how many it kept because open."""

    files: int = 0
    bytes: int = 0
    kept_open: int = 0
    notes: list[str] = field(default_factory=list)

    def take(self, path: Path, size: int) -> None:
        path.unlink(missing_ok=True)
        self.files += 1
        self.bytes += size


def _older(paths: Iterable[Path], before: float) -> Iterator[tuple[Path, int]]:
    for path in paths:
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if stat.st_mtime < before:
            yield path, stat.st_size


def _still_older(path: Path, before: float) -> bool:
    try:
        return path.stat().st_mtime < before
    except FileNotFoundError:
        return False


def payload_packs(root: Path) -> Iterator[Path]:
    """Every object of a local payload base (``<root>/ab/<sha256>``)."""
    if not root.is_dir():
        return
    for folder in root.iterdir():
        if len(folder.name) == 2 and folder.is_dir():
            yield from (p for p in folder.iterdir() if PACK_NAME.match(p.name))


def old_payload_packs(root: Path, before: float) -> list[tuple[Path, int]]:
    """The packs under ``root`` last written before ``before``, with their sizes."""
    return list(_older(payload_packs(root), before))


def remove_payload_packs(old: list[tuple[Path, int]], open_names: set[str], before: float) -> Removed:
    """Remove the ``old`` packs (:func:`old_payload_packs`, listed *before* ``open_names`` was
    read) that no open job names and that nobody wrote since."""
    removed = Removed()
    for path, size in old:
        if path.name in open_names:
            removed.kept_open += 1
            continue
        with packs_lock(str(path.parent.parent), exclusive=True):
            if _still_older(path, before):
                removed.take(path, size)
    return removed


def rotate_event_log(path: Path, now: datetime) -> Path | None:
    """Rename the live event file to ``<name>.<UTC time>`` under the sink's own lock, if it holds
    anything; the sink makes a new one at its next append. A relay that opened the old file
    before the rename appends to the rotated one, which is kept like any other."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size == 0:
            return None
        target = path.with_name(f"{path.name}.{now.astimezone(UTC):%Y%m%dT%H%M%SZ}")
        os.rename(path, target)
        return target
    finally:
        os.close(fd)


def remove_event_files(path: Path, before: float) -> Removed:
    """Remove the rotated files of the event sink at ``path`` last written before ``before``."""
    removed = Removed()
    folder = path.parent
    if folder.is_dir():
        rotated = (p for p in folder.iterdir() if p.name.startswith(path.name + ".") and ROTATED.search(p.name))
        for file, size in _older(rotated, before):
            removed.take(file, size)
    return removed


def remove_reports(folder: Path, before: float) -> Removed:
    """Remove the reconciliation report pages written before ``before`` (never the latest)."""
    removed = Removed()
    if folder.is_dir():
        pages = (p for p in folder.iterdir() if REPORT_NAME.match(p.name))
        for page, size in _older(pages, before):
            removed.take(page, size)
    return removed
