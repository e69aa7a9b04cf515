"""A classify worker process with a slow model, for the drain tests: the step as a ``classify``
task runs it, with SIGTERM wired to ``on_kill`` the way Airflow's task runner wires it.

``python -m tests.fakes.slow_worker URL PAYLOADS BATCH --batch-size N --slow-from K --fast S
--slow S --grace S`` prints ``call <n> <job id>`` as each model call starts, ``finished`` or
``drained`` at the end, and exits 0, or 3 when drained.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from triage.classifiers import Taxonomy, build_classifier
from triage.classifiers.base import ClassifyRequest, ModelOutput
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.operators.base import TriageOperator
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.steps import Drained, RunSettings, run_step


class SlowModel:
    """The keyword classifier behind a model that takes ``fast`` seconds a call, and ``slow``
    from the ``slow_from``-th call on."""

    def __init__(self, fast: float, slow: float, slow_from: int) -> None:
        self.inner = build_classifier("keyword", taxonomy=Taxonomy.load())
        self.fast, self.slow, self.slow_from, self.calls = fast, slow, slow_from, 0

    @property
    def version(self) -> str:
        return str(self.inner.version)

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        self.calls += 1
        print(f"call {self.calls} {request.job_id}", flush=True)
        time.sleep(self.slow if self.calls >= self.slow_from else self.fast)
        output: ModelOutput = self.inner.classify(request)
        return output

    def close(self) -> None:
        self.inner.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("payloads")
    parser.add_argument("batch")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--fast", type=float, default=1.0)
    parser.add_argument("--slow", type=float, default=1.0)
    parser.add_argument("--slow-from", type=int, default=1)
    parser.add_argument("--grace", type=float, default=3.0)
    args = parser.parse_args(argv)

    operator = TriageOperator(task_id="classify")
    operator.drain_grace_seconds = args.grace  # type: ignore[misc]  # a class setting, overridden for this drill's one operator

    def on_term(signum: int, frame: Any) -> None:  # what airflow.sdk's task runner installs
        operator.on_kill()

    signal.signal(signal.SIGTERM, on_term)
    engine = create_engine(DatabaseUrl.parse(args.url), pool_size=2)
    handler = ClassifyHandler(
        SlowModel(args.fast, args.slow, args.slow_from),  # type: ignore[arg-type]  # a duck-typed slow model, not a Classifier
        PayloadStore(args.payloads),
        ClassifySettings(0.0, 1),
    )
    try:
        run_step(
            JobStore(engine),
            handler,
            batch_key=args.batch,
            settings=RunSettings(owner="dag/run/classify/0/try1", batch_size=args.batch_size, lease_seconds=60),
            drain=operator.drain,
        )
    except Drained as exc:
        print(f"drained: {exc}", flush=True)
        return 3
    finally:
        handler.close()
        engine.dispose()
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
