"""Retrieval sources behind one :class:`~triage.sources.base.Source` protocol."""

from __future__ import annotations

from typing import Any

from triage.sources.base import Shard, Source, SourceDocument, SourceError
from triage.sources.jsonl import JsonlSource
from triage.sources.synthetic import SyntheticSource

__all__ = [
    "SOURCES",
    "JsonlSource",
    "Shard",
    "Source",
    "SourceDocument",
    "SourceError",
    "SyntheticSource",
    "build_source",
]

SOURCES: dict[str, type[SyntheticSource] | type[JsonlSource]] = {
    SyntheticSource.name: SyntheticSource,
    JsonlSource.name: JsonlSource,
}
"""Source classes by the name used in the ``source`` param of ``classify_documents``."""


def build_source(name: str, **kwargs: Any) -> Source:
    """Build the source called ``name`` with its constructor arguments.

    :raises ValueError: for an unknown name (the DAG param's enum should prevent it).
    """
    try:
        factory = SOURCES[name]
    except KeyError:
        raise ValueError(f"unknown source {name!r}; expected one of {sorted(SOURCES)}") from None
    source: Source = factory(**kwargs)
    return source
