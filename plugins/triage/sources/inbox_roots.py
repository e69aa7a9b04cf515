"""Confine a run's ``inbox`` to the deployment's inbox roots.

Whoever may trigger ``classify_documents`` types the inbox into the form. Unchecked, it could
name any folder the worker can read (``/opt/airflow/config``, ``../../etc``) or any URL (an
internal HTTP service, another bucket), and every line found there would be stored as a payload
a reviewer can open and, if it parses, sent to the model. So an inbox is accepted only inside a
configured root (:func:`triage.settings.inbox_roots`):

* a local path (relative ones from the project folder, ``file://`` URLs too) is resolved first,
  symlinks and ``..`` included, and must then be a root or lie under one; the source reads the
  resolved path, never the text it was given;
* a URL must have a root of the same scheme and host whose path is a prefix of its own, segment
  by segment, with no ``.``/``..`` segment, empty segment, ``%``-escape, query or fragment that
  a storage backend or server could read differently.

No Airflow here: the operator turns :class:`~triage.contracts.run_config.InboxNotAllowed` into a
failure without retry.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import SplitResult, urlsplit
from urllib.request import url2pathname

from triage.contracts.run_config import InboxNotAllowed

__all__ = ["InboxNotAllowed", "confine_inbox"]


def confine_inbox(inbox: str, roots: Sequence[str], *, base: Path) -> Path | str:
    """The inbox to read: a resolved local :class:`~pathlib.Path`, or a URL (normalised).

    :param roots: folders and URL prefixes (:func:`triage.settings.inbox_roots`).
    :param base: what relative paths, in ``inbox`` and in ``roots``, are relative to.
    :raises InboxNotAllowed: outside every root, or not a path or URL that can be checked. The
        message names the roots (for whoever configures them), never where a symlink led.
    """
    if not roots:
        raise InboxNotAllowed(
            f"inbox {inbox!r} is refused: this deployment has no inbox roots (set TRIAGE_INBOX_ROOTS)"
        )
    try:
        if "://" in inbox and not inbox.lower().startswith("file://"):
            confined: Path | str | None = _confine_url(inbox, roots)
        else:
            confined = _confine_path(_local(inbox, base), roots, base)
    except InboxNotAllowed as exc:
        raise InboxNotAllowed(f"inbox {inbox!r} is refused: {exc}; {_allowed(roots)}") from None
    if confined is None:
        raise InboxNotAllowed(f"inbox {inbox!r} is outside this deployment's inbox roots; {_allowed(roots)}")
    return confined


def _allowed(roots: Sequence[str]) -> str:
    return f"allowed: {', '.join(roots)} (TRIAGE_INBOX_ROOTS)"


def _local(location: str, base: Path) -> Path:
    """A local path from a path or a ``file://`` URL (relative paths from ``base``)."""
    if location.lower().startswith("file://"):
        parts = urlsplit(location)
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise InboxNotAllowed("a file:// URL names a path on this machine, with no host, query or fragment")
        return Path(url2pathname(parts.path))
    return base / location  # an absolute location stays itself


def _resolved(path: Path) -> Path:
    """``path`` with every symlink and ``..`` resolved. A folder that does not exist yet is
    resolved as far as it exists (the run then fails on the missing inbox, and may be retried);
    a symlink loop or a NUL byte is refused."""
    try:
        return Path(os.path.realpath(path, strict=True))
    except FileNotFoundError:
        pass
    except (ValueError, OSError) as exc:
        raise InboxNotAllowed(f"not a usable path ({type(exc).__name__})") from None
    return Path(os.path.realpath(path))


def _confine_path(path: Path, roots: Sequence[str], base: Path) -> Path | None:
    resolved = _resolved(path)
    for root in roots:
        if "://" in root and not root.lower().startswith("file://"):
            continue
        top = _resolved(_local(root, base))
        if resolved == top or resolved.is_relative_to(top):
            return resolved
    return None


def _segments(parts: SplitResult, what: str) -> list[str]:
    if parts.query or parts.fragment or "%" in parts.path or "\\" in parts.path:
        raise InboxNotAllowed(f"{what} may have no query, fragment, %-escape or backslash")
    segments = parts.path.strip("/").split("/") if parts.path.strip("/") else []
    if any(segment in ("", ".", "..") for segment in segments):
        raise InboxNotAllowed(f"{what} may have no empty, '.' or '..' segment")
    return segments


def _confine_url(url: str, roots: Sequence[str]) -> str | None:
    parts = urlsplit(url)
    segments = _segments(parts, "an inbox URL")
    for root in roots:
        if "://" not in root:
            continue
        top = urlsplit(root)
        if (top.scheme.lower(), top.netloc.lower()) != (parts.scheme.lower(), parts.netloc.lower()):
            continue
        prefix = _segments(top, "an inbox root")
        if segments[: len(prefix)] == prefix:
            return f"{parts.scheme.lower()}://{parts.netloc}/{'/'.join(segments)}"
    return None
