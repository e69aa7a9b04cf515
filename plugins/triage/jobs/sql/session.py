"""Settings of a ledger transaction: who acts in it, and the planner's join choice for the
fenced writes. Each is a statement :mod:`triage.jobs.store` runs at the start of a transaction
or around the writes it concerns (``SET LOCAL``: they end with the transaction).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa


@cache
def set_actor() -> Any:
    """Who moves jobs in this transaction; the trigger writes it into ``job_events.actor``."""
    return sa.select(sa.func.set_config("triage.actor", sa.bindparam("actor", type_=sa.Text), True))


@cache
def open_chunk() -> Any:
    """:func:`set_actor` for a chunk of one transaction (:mod:`triage.jobs.store.one_transaction`),
    and the chunk's lease: PostgreSQL ends the transaction (and its session) once it has been
    idle for ``:idle`` (``idle_in_transaction_session_timeout``, e.g. ``'300000ms'``). A chunk
    holds its jobs by row locks, not a lease that runs out: without this, a worker that hung with
    a chunk open, or whose host vanished without a FIN (TCP keepalive notices after hours by
    default), kept every claim off the jobs for as long."""
    return sa.select(
        sa.func.set_config("triage.actor", sa.bindparam("actor", type_=sa.Text), True),
        sa.func.set_config("idle_in_transaction_session_timeout", sa.bindparam("idle", type_=sa.Text), True),
    )


@cache
def fenced_write_joins() -> Any:
    """Hash joins for the fenced writes of this transaction, until :func:`default_joins`.

    A fenced write joins the batch's rows (``json_to_recordset``: the planner guesses 100) to
    the jobs held under the lease (the partial lease index: estimated from statistics taken
    when few jobs were running, often 1 row). With those guesses the planner picks a nested
    loop that re-reads the batch's JSON once per held job: quadratic, 140 ms to complete 1,000
    jobs instead of 20 (EXPLAIN ANALYZE, docs/performance.md). The held jobs are reached
    through the lease index whatever the join, and it holds only running jobs (live leases,
    and expired ones until they are taken back), a number bounded by the workers' batches, so
    a hash join is right at every size: the same reasoning as the ``enable_nestloop = off`` of
    the jobs triggers.
    """
    return sa.text("SET LOCAL enable_nestloop = off")


@cache
def default_joins() -> Any:
    """Undo :func:`fenced_write_joins`: later statements join jobs by primary key, where a
    nested loop over the index is the right plan."""
    return sa.text("SET LOCAL enable_nestloop TO DEFAULT")
