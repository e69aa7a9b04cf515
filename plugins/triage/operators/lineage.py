"""OpenLineage for Triage's operators: what each task read and wrote, with its job counts.

apache-airflow-providers-openlineage emits a START and a COMPLETE (or FAIL) event per task
try when a transport is configured (``AIRFLOW__OPENLINEAGE__TRANSPORT``). Triage's operators
record during ``execute`` what they read and wrote (:class:`Lineage`), and the provider asks
for it after the task with ``get_openlineage_facets_on_complete``
(:meth:`triage.operators.base.TriageOperator.get_openlineage_facets_on_complete`), which this
module answers. Datasets are named as OpenLineage's naming spec names them:

- the ledger's tables: namespace ``postgres://HOST:PORT``, name ``DATABASE.triage.TABLE``;
- a JSONL inbox: ``file`` and its path, or the URL's ``scheme://authority`` and its path
  (``s3://bucket`` + ``/inbox/2026``); the synthetic source: ``triage`` + ``synthetic``;
- Triage's Airflow assets (``triage://intake``, ``triage://document_labels``), which the
  provider maps to nothing (no known scheme): namespace ``triage``, name the asset's;
- the label provider and a webhook event sink: the URL's ``scheme://host:port`` and its path;
  the event log: ``file`` and its path.

Job counts travel as the run facet ``triage_jobs`` (:func:`jobs_facet`). Lineage is reporting,
never part of the work: :func:`degrade` is the one place where any error is caught (logged and
answered with no lineage), around both the recording and the answer, so that nothing about
lineage can fail a task. docs/lineage.md shows the events.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

FACET = "triage_jobs"
"""The run facet's key in OpenLineage events."""
ASSET_NAMESPACE = "triage"

Dataset = tuple[str, str]
"""(namespace, name) of an OpenLineage dataset."""
T = TypeVar("T")


def degrade(task_id: str, what: str, work: Callable[[], T]) -> T | None:
    """``work()``, or None when it raises anything: the one broad ``except`` of the lineage path.
    Lineage is reporting, so an error in it (a provider release that moved a class, a value that
    does not serialise, an unexpected URL) is logged by its class, without values, and the task
    goes on as if no lineage had been asked for. Tested on that path (tests/unit/test_lineage.py)."""
    try:
        return work()
    except Exception as exc:  # noqa: BLE001  (lineage degrades, never fails the task)
        log.warning("OpenLineage: no %s for task %s (%s)", what, task_id, type(exc).__name__)
        return None


@functools.cache
def facet_class() -> type:
    """``TriageJobsRunFacet``: what a Triage task try did to the ledger's jobs, as counts.
    Made on first use, so that parsing a DAG never imports the OpenLineage client.

    Its fields: ``counts`` (``read``, ``registered``, ``claimed``, ``outcomes.completed``,
    ``published``…: numbers only, never a document's content) and ``batch`` (the data interval
    or ``intake`` the task worked on)."""
    import attrs
    from openlineage.client.facet_v2 import RunFacet

    @attrs.define
    class TriageJobsRunFacet(RunFacet):
        counts: dict[str, int] = attrs.field(factory=dict)
        batch: str | None = None

    TriageJobsRunFacet.__doc__ = facet_class.__doc__
    return TriageJobsRunFacet


def jobs_facet(counts: Mapping[str, int], batch: str | None) -> Any:
    """The ``triage_jobs`` run facet."""
    return facet_class()(counts=dict(counts), batch=batch)


@dataclass
class Lineage:
    """What one task try read and wrote, recorded by its ``execute``."""

    inputs: list[Dataset] = field(default_factory=list)
    outputs: list[Dataset] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    batch: str | None = None


def ledger(url: Any, *tables: str) -> list[Dataset]:
    """The ledger's ``tables`` on the database of SQLAlchemy URL ``url`` (a socket-directory URL
    has no host: ``localhost``)."""
    namespace = f"postgres://{url.host or 'localhost'}:{url.port or 5432}"
    return [(namespace, f"{url.database}.triage.{table}") for table in tables]


def location(where: str | Path) -> Dataset:
    """A file path or a URL as a dataset (credentials in a URL are dropped)."""
    text = str(where)
    if "://" not in text:
        return ("file", str(Path(text).absolute()))
    parts = urlsplit(text)
    if parts.scheme == "file":
        return ("file", parts.path)
    authority = parts.hostname or ""
    if parts.port:
        authority += f":{parts.port}"
    return (f"{parts.scheme}://{authority}", parts.path or "/")


def source(inbox: str | Path | None) -> Dataset:
    """What retrieval read: a JSONL inbox (:func:`location`), or the synthetic source (None)."""
    return location(inbox) if inbox is not None else (ASSET_NAMESPACE, "synthetic")


def sink(event_sink: Any) -> list[Dataset]:
    """Where publish_events sent events: a webhook's URL or the event log's path."""
    where = getattr(event_sink, "url", None) or getattr(event_sink, "path", None)
    return [location(where)] if where else []


def asset(uri: str) -> Dataset:
    """A ``triage://NAME`` Airflow asset."""
    return (ASSET_NAMESPACE, uri.removeprefix("triage://").strip("/"))


def counts(result: Mapping[str, Any]) -> dict[str, int]:
    """The numbers of an operator's return value, nested ones flattened (``outcome.completed``)."""
    found: dict[str, int] = {}
    for key, value in result.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            found[str(key)] = value
        elif isinstance(value, Mapping):
            found.update({f"{key}.{k}": v for k, v in counts(value).items()})
    return found


def _datasets(found: Sequence[Dataset]) -> list[Any]:
    from openlineage.client.event_v2 import Dataset as OpenLineageDataset

    unique = dict.fromkeys(found)  # in order, once each
    return [OpenLineageDataset(namespace=namespace, name=name) for namespace, name in unique]


def operator_lineage(recorded: Lineage | None) -> Any:
    """The provider's ``OperatorLineage`` for what a task recorded; None when it recorded
    nothing (a task that failed first, or one that reports no lineage). Called through
    :func:`degrade`."""
    if recorded is None:
        return None
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(
        inputs=_datasets(recorded.inputs),
        outputs=_datasets(recorded.outputs),
        run_facets={FACET: jobs_facet(recorded.counts, recorded.batch)},
    )
