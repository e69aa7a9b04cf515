"""The learning loop's named statements: labelled examples and the model registry.

Statements only (nothing here executes anything): the store's learning part
(:mod:`triage.jobs.store.learning`) runs them for :mod:`triage.learning.examples` and
:mod:`triage.learning.registry`, and :meth:`~triage.jobs.store.review.ReviewDecisions.resolve_with_label`
runs :func:`example_from_review` inside the reviewer's decision.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema import jobs
from triage.jobs.schema.learning import REVIEW_SOURCE, classifier_models, labelled_examples
from triage.jobs.sql.expressions import NOW, UUID

__all__ = [
    "champion",
    "champion_version",
    "example_from_review",
    "insert_examples",
    "insert_model",
    "model",
    "model_status",
    "models",
    "promote",
    "training_examples",
]


@cache
def example_from_review() -> Any:
    """The labelled example of a reviewer's ``label`` decision on ``:p_job_id``: the job's own
    document (its payload reference and content hash, no copy), the reviewer's label and name;
    source ``review``, the job id as external id. Idempotent (the same decision applied again
    adds nothing). A job whose content hash is not a SHA-256 (a line too malformed to have
    one) makes no example: there is no text to learn from."""
    chosen = sa.select(
        sa.literal(REVIEW_SOURCE, sa.Text),
        sa.cast(jobs.c.id, sa.Text),
        sa.bindparam("p_label", type_=sa.Text),
        jobs.c.content_sha256,
        jobs.c.payload_ref,
        sa.bindparam("p_actor", type_=sa.Text),
        jobs.c.id,
    ).where(jobs.c.id == sa.bindparam("p_job_id", type_=UUID), sa.func.length(jobs.c.content_sha256) == 64)
    return (
        pg.insert(labelled_examples)
        .from_select(
            ["source", "external_id", "label", "content_sha256", "payload_ref", "labelled_by", "job_id"], chosen
        )
        .on_conflict_do_nothing(index_elements=["source", "external_id"])
    )


@cache
def insert_examples() -> Any:
    """Imported examples (executemany over rows of every column but ``id``/``job_id``); an
    example already there under its (source, external_id) is left as it is. Returns the
    external ids added."""
    return (
        pg.insert(labelled_examples)
        .on_conflict_do_nothing(index_elements=["source", "external_id"])
        .returning(labelled_examples.c.external_id)
    )


def training_examples() -> Any:
    """Every example's newest label per content (a document labelled twice counts once, with
    its latest label), oldest content first: the training set's rows."""
    newest = (
        sa.select(
            labelled_examples.c.id,
            labelled_examples.c.source,
            labelled_examples.c.external_id,
            labelled_examples.c.label,
            labelled_examples.c.content_sha256,
            labelled_examples.c.payload_ref,
        )
        .distinct(labelled_examples.c.content_sha256)
        .order_by(
            labelled_examples.c.content_sha256, labelled_examples.c.labelled_at.desc(), labelled_examples.c.id.desc()
        )
        .subquery()
    )
    return sa.select(newest).order_by(newest.c.id)


MODEL_COLUMNS = tuple(c for c in classifier_models.c if c.name != "artifact")


def models() -> Any:
    """Every model version, newest first, without artifacts."""
    return sa.select(*MODEL_COLUMNS).order_by(classifier_models.c.created_at.desc(), classifier_models.c.version)


def model() -> Any:
    """One version (``:p_version``), artifact included."""
    return sa.select(classifier_models).where(classifier_models.c.version == sa.bindparam("p_version", type_=sa.Text))


def champion() -> Any:
    """The champion, artifact included (none: no row)."""
    return sa.select(classifier_models).where(classifier_models.c.status == "champion")


def champion_version() -> Any:
    """The champion's version, its artifact not read (none: no row)."""
    return sa.select(classifier_models.c.version).where(classifier_models.c.status == "champion")


def model_status() -> Any:
    """The status of the version ``:p_version`` (none: no such version)."""
    return sa.select(classifier_models.c.status).where(
        classifier_models.c.version == sa.bindparam("p_version", type_=sa.Text)
    )


@cache
def insert_model() -> Any:
    """A new version; the same version again (the same training set, taxonomy and parameters)
    adds nothing. Returns the version added."""
    return (
        pg.insert(classifier_models)
        .on_conflict_do_nothing(index_elements=["version"])
        .returning(classifier_models.c.version)
    )


@cache
def promote() -> Any:
    """``:p_version`` (a candidate, or a retired version taken back) becomes champion and the
    champion it replaces retires, in one statement: the one-champion constraint is deferred to
    the end of the transaction. Returns the versions changed, with their new status; no row: no
    such version, or it is the champion already."""
    wanted = classifier_models.alias("wanted")
    target = sa.bindparam("p_version", type_=sa.Text)
    promotable = sa.exists().where(wanted.c.version == target, wanted.c.status.in_(("candidate", "retired")))
    stays_champion = classifier_models.c.status == "champion"
    return (
        sa.update(classifier_models)
        .where(
            promotable,
            sa.or_(
                sa.and_(classifier_models.c.version == target, classifier_models.c.status != "champion"),
                sa.and_(stays_champion, classifier_models.c.version != target),
            ),
        )
        .values(
            status=sa.case((stays_champion, "retired"), else_="champion"),
            promoted_at=sa.case((stays_champion, classifier_models.c.promoted_at), else_=NOW),
            promoted_by=sa.case(
                (stays_champion, classifier_models.c.promoted_by), else_=sa.bindparam("p_actor", type_=sa.Text)
            ),
            promotion_reason=sa.case(
                (stays_champion, classifier_models.c.promotion_reason),
                else_=sa.bindparam("p_reason", type_=sa.Text),
            ),
        )
        .returning(classifier_models.c.version, classifier_models.c.status)
    )
