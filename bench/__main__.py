"""``make bench``: every figure beside its baseline from the same run; bench/results/latest.json."""

from __future__ import annotations

import argparse
import logging
import sys

from bench import (
    footprint,
    growth,
    guarantees,
    intake,
    learning,
    ledger,
    ledger_days,
    migration,
    pipeline,
    pipeline_profile,
    realrun,
    relay,
    review_candidates,
    review_queue,
    task_execute,
    writes,
)
from bench.common import Figure, write_results

SUITES = {
    "ledger": ledger.run,
    "pipeline": pipeline.run,
    "review": review_queue.run,
    "intake": intake.run,
    "realrun": realrun.run,
    "relay": relay.run,
    "learning": learning.run,
    "writes": writes.run,
}
OPT_IN = {
    "footprint": footprint.run,
    "growth": growth.run,
    "migration": migration.run,
    "guarantees": guarantees.run,
    "llm": pipeline.bench_llm,
    "candidates": review_candidates.run,
    "realrun-learned": realrun.run_learned,
    "learning-crossfit": learning.run_crossfit,
    "realrun-chunks": realrun.run_chunks,
    "realrun-growth": realrun.run_growth,
    "pipeline-profile": pipeline_profile.run,
    "ledger-days": ledger_days.run,
    "realrun-relay": realrun.run_relay,
    "realrun-preload": realrun.run_preload,
    "task-execute": task_execute.run,
    "learning-variants": learning.run_variants,
    "learning-check": learning.run_check,
    "learning-thresholds": learning.run_thresholds,
}
"""Longer than the quick `make bench` (minutes to an hour), or one figure of a suite (``llm``:
the pipeline suite's llm figure alone): run only when named (`make bench-growth`)."""


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument(
        "suites", nargs="*", help=f"any of {', '.join([*SUITES, *OPT_IN])} (default: {', '.join(SUITES)})"
    )
    args = parser.parse_args()
    unknown = set(args.suites) - set(SUITES) - set(OPT_IN)
    if unknown:
        parser.error(f"unknown suites: {', '.join(sorted(unknown))}")
    logging.basicConfig(level=logging.WARNING)
    measured: dict[str, list[Figure]] = {}
    for name in args.suites or list(SUITES):
        print(f"== {name}", flush=True)
        for figure in {**SUITES, **OPT_IN}[name]():
            print(figure.line(), flush=True)
            measured.setdefault(name, []).append(figure)
    path = write_results(measured, "python -m bench " + " ".join(sys.argv[1:]))
    print(f"results written to {path} (other suites' figures kept from their last run)")
    return 1 if any(f.ok is False for figures in measured.values() for f in figures) else 0


if __name__ == "__main__":
    raise SystemExit(main())
