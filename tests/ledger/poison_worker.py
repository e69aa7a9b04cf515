"""A worker process for the poison-isolation test: claim a batch as classify does (one claim of
up to ``--limit`` jobs), classify every job through the drill classifier, record the outcomes
of the claim in one transaction, and go on until nothing is claimable. The drill's ``kill_on``
document SIGKILLs this process mid-claim, so its whole claim is left running under a lease.

    python -m tests.ledger.poison_worker BATCH KILL_ON [--limit N] [--in-chunks]   (TRIAGE_DATABASE_URL set)

``--in-chunks``: as a keyword classify try's first try does, each chunk claimed, classified and
completed in one transaction (:meth:`JobStore.chunks.settle`, no lease); the ``kill_on``
document SIGKILLs the process inside its chunk's transaction.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from triage.classifiers.base import ClassifyRequest
from triage.classifiers.drill import DrillClassifier
from triage.classifiers.keyword import KeywordClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.contracts.drill import DrillSettings
from triage.database import configured_url, create_engine
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClaimedJob, Complete, LabelWrite, Outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("batch")
    parser.add_argument("kill_on")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--in-chunks", action="store_true")
    args = parser.parse_args()
    url = configured_url()
    assert url is not None, "TRIAGE_DATABASE_URL is not set"
    store = JobStore(create_engine(url, pool_size=1))
    classifier = DrillClassifier(KeywordClassifier(Taxonomy.load()), DrillSettings(kill_on=args.kill_on))

    def decide(jobs: Sequence[ClaimedJob]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for job in jobs:
            output = classifier.classify(
                ClassifyRequest(
                    job_id=str(job.id),
                    external_id=job.external_id,
                    idempotency_key=job.idempotency_key,
                    correlation_id=job.correlation_id,
                    attempt=job.attempt,
                    text="please refund my invoice",
                )
            )
            label = LabelWrite(output.label or "billing", output.confidence, classifier.version)
            outcomes.append(Complete(job.id, job.attempt, label))
        return outcomes

    while args.in_chunks:
        chunk = store.chunks.settle(
            batch_key=args.batch,
            step="classify",
            classifier_version="keyword-v1",
            limit=args.limit,
            actor=f"poison-worker/{args.batch}",
            decide=decide,
            lease_seconds=600,
        )
        if not chunk.jobs:
            return
    while True:
        claim = store.claim(
            batch_key=args.batch,
            step="classify",
            limit=args.limit,
            lease_seconds=600,
            owner=f"poison-worker/{args.batch}",
        )
        if not claim.jobs:
            return
        store.record(claim, decide(claim.jobs))


if __name__ == "__main__":
    main()
