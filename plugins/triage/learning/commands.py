"""The learning loop's commands: ``labels import``, ``train``, ``models list|promote``, ``evaluate``.

Registered by :func:`triage.cli.add_commands` (so ``python -m triage`` and the checkout's
``triage`` both have them) and run by :func:`run` against the job database.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triage.database import DatabaseUrl, create_engine

if TYPE_CHECKING:
    from triage.learning.training import ThresholdRule

__all__ = ["COMMANDS", "add_commands", "run"]

COMMANDS = frozenset({"labels", "train", "models", "evaluate"})

_RAW = argparse.RawDescriptionHelpFormatter


def add_commands(commands: Any) -> None:
    """Add the learning commands to ``commands`` (``ArgumentParser.add_subparsers()``)."""
    labels = commands.add_parser(
        "labels",
        help="labelled examples (ground truth for the learned classifier)",
        formatter_class=_RAW,
        description="Labelled examples: the ground truth the learned classifier trains on.",
    )
    actions = labels.add_subparsers(dest="labels_action", required=True, metavar="ACTION")
    imported = actions.add_parser(
        "import",
        help="import a JSON-lines file of labelled documents",
        formatter_class=_RAW,
        description='Import FILE: one document per line as the JSONL inbox takes it, plus "label":\n'
        '  {"id": "T-1", "subject": "...", "body": "...", "received_at": "2026-11-01T09:30:00Z", "label": "billing"}\n'
        "(received_at is optional here). Each bad line, and each label outside the taxonomy\n"
        "($TRIAGE_TAXONOMY), is refused with its line number and reason; the good lines are kept.\n"
        "Idempotent by (source, id): importing the same file again adds nothing.\n"
        "Exit status 1 when any line was refused.",
    )
    imported.add_argument("file", metavar="FILE.jsonl", type=Path)
    imported.add_argument("--source", default="import", help="the examples' source name (default: import)")
    imported.add_argument("--payload-base", metavar="DIR_OR_URL", help="the payload store (default: the deployment's)")
    imported.add_argument("--json", action="store_true", help="print the report as JSON")

    train = commands.add_parser(
        "train",
        help="train a learned classifier from the labelled examples",
        formatter_class=_RAW,
        description="Train a candidate model from every labelled example, hold out a fixed share (by a hash\n"
        "of each example's id), choose per-label thresholds for the target precision (its margin\n"
        "taken on all accepted held-out predictions together, certified on held-out examples that\n"
        "did not choose them), and make it champion if it beats\n"
        "the champion's macro-F1 on the same held-out examples without falling below the target\n"
        "precision (the first model becomes champion).",
    )
    train.add_argument("--target-precision", type=float, default=0.97, help="of auto-accepted labels (default 0.97)")
    train.add_argument("--holdout-percent", type=int, default=20, help="share held out, in percent (default 20)")
    train.add_argument(
        "--min-examples", type=int, default=20, help="training examples a label needs to auto-accept (default 20)"
    )
    train.add_argument(
        "--margin-z",
        type=float,
        default=0.5,
        help="how sure a threshold's held-out precision must be: the Wilson lower bound at Z (default 0.5; 0: as seen)",
    )
    # One or the other: argparse refuses both (with a default, an explicit --thresholds equal to it
    # would pass unnoticed, hence None and threshold_rule()).
    rule = train.add_mutually_exclusive_group()
    rule.add_argument(
        "--thresholds",
        choices=("verified", "pooled", "per-label"),
        default=None,
        help="how thresholds are chosen on the held-out examples (default verified: the margin on all accepted "
        "together, proposed by one half of them and certified on the other; pooled: chosen and judged on the same "
        "ones; per-label: each label's margin on its own)",
    )
    rule.add_argument(
        "--per-label-margin",
        action="store_true",
        help="the same as --thresholds per-label (not with --thresholds)",
    )
    train.add_argument("--payload-base", metavar="DIR_OR_URL", help="the payload store (default: the deployment's)")
    train.add_argument("--json", action="store_true", help="print the result as JSON")

    models = commands.add_parser(
        "models", help="the learned classifier's versions", formatter_class=_RAW, description="The model registry."
    )
    model_actions = models.add_subparsers(dest="models_action", required=True, metavar="ACTION")
    listed = model_actions.add_parser("list", help="every version, newest first", formatter_class=_RAW)
    listed.add_argument("--json", action="store_true", help="print the versions as JSON")
    promoted = model_actions.add_parser(
        "promote",
        help="make a version champion (the champion retires)",
        formatter_class=_RAW,
        description="Make VERSION champion by hand, whatever the rule said; the champion retires.",
    )
    promoted.add_argument("version", metavar="VERSION")
    promoted.add_argument("--note", default="promoted by hand", help="why (recorded with your user name)")

    evaluate = commands.add_parser(
        "evaluate",
        help="score a classifier on a labelled file",
        formatter_class=_RAW,
        description="Score a classifier on FILE (the labels import format): accuracy, macro-F1, per-label\n"
        "precision and recall, the most confused pairs, and the coverage and precision of what it\n"
        "would accept (the learned model at its thresholds, keyword at --confidence-threshold).",
    )
    evaluate.add_argument("file", metavar="FILE.jsonl", type=Path)
    evaluate.add_argument("--model", default=None, help="a version, or keyword (default: the champion)")
    evaluate.add_argument(
        "--confidence-threshold", type=float, default=0.7, help="the keyword classifier's (default 0.7, as a run's)"
    )
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")


def threshold_rule(args: argparse.Namespace) -> ThresholdRule:
    """The threshold rule ``triage train``'s ``args`` name: ``--per-label-margin``'s, else
    ``--thresholds``' (default: the training settings' default); the parser refuses the two together."""
    from triage.learning.training import DEFAULT_SETTINGS

    if args.per_label_margin:
        return "per-label"
    return args.thresholds or DEFAULT_SETTINGS.thresholds


def _payloads(base: str | None) -> Any:
    from triage import settings
    from triage.payloads import PayloadStore

    return PayloadStore(settings.payload_base(base))


def run(args: argparse.Namespace, url: DatabaseUrl, prog: str) -> int:
    """Run the learning command ``args``; its exit code."""
    from triage.classifiers.taxonomy import Taxonomy, TaxonomyError

    try:
        taxonomy = Taxonomy.load()
    except TaxonomyError as exc:
        print(f"{prog} {args.command}: {exc}", file=sys.stderr)
        return 2
    engine = create_engine(url, pool_size=1)
    try:
        if args.command == "labels":
            return _import(engine, args, taxonomy, prog)
        if args.command == "train":
            return _train(engine, args, taxonomy, prog)
        if args.command == "models":
            return _models(engine, args, prog)
        return _evaluate(engine, args, taxonomy, prog)
    finally:
        engine.dispose()


def _import(engine: Any, args: argparse.Namespace, taxonomy: Any, prog: str) -> int:
    from triage.learning.examples import (
        InvalidSource,
        TaxonomyNotMigrated,
        check_source,
        import_examples,
        read_examples,
    )

    try:
        check_source(args.source)
        stream = args.file.open("rb")
    except (InvalidSource, OSError) as exc:
        print(f"{prog} labels import: {exc}", file=sys.stderr)
        return 2
    with stream:
        try:
            report = import_examples(
                engine,
                _payloads(args.payload_base),
                read_examples(stream, taxonomy.names),
                source=args.source,
                labelled_by=getpass.getuser(),
            )
        except TaxonomyNotMigrated as exc:
            print(f"{prog} labels import: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        for refusal in report.refused:
            print(f"{args.file}: {refusal.message()}", file=sys.stderr)
        print(
            f"labels import {args.file} (source {report.source}): {report.added} added, "
            f"{report.already} already present, {len(report.refused)} refused"
        )
    return 1 if report.refused else 0


def _train(engine: Any, args: argparse.Namespace, taxonomy: Any, prog: str) -> int:
    from triage.learning.registry import train_candidate
    from triage.learning.training import TrainingRefused, TrainSettings

    try:
        settings = TrainSettings(
            target_precision=args.target_precision,
            holdout_percent=args.holdout_percent,
            min_examples=args.min_examples,
            margin_z=args.margin_z,
            thresholds=threshold_rule(args),
        )
        report = train_candidate(
            engine,
            _payloads(args.payload_base),
            taxonomy_names=sorted(taxonomy.names),
            taxonomy_sha256=taxonomy.content_hash,
            settings=settings,
            actor=getpass.getuser(),
        )
    except (TrainingRefused, ValueError) as exc:
        print(f"{prog} train: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    m = report.metrics
    print(f"model {report.version} ({'new' if report.new else 'not new'}): {report.status}; {report.reason}")
    print(
        f"held out {m['n']}: accuracy {m['accuracy']}, macro-F1 {m['macro_f1']}, coverage {m['coverage']} "
        f"at accepted precision {m['accepted_precision']} (target {args.target_precision})"
    )
    if report.champion_metrics is not None:
        c = report.champion_metrics
        print(f"champion {report.champion_version} on the same examples: macro-F1 {c['macro_f1']}")
    never = sorted(label for label, threshold in report.thresholds.items() if threshold is None)
    if never:
        print(f"never auto-accepted (too few examples or precision out of reach): {', '.join(never)}")
    skipped = {k: v for k, v in report.skipped.items() if v}
    if skipped:
        print(f"examples skipped: {skipped}")
    return 0


def _models(engine: Any, args: argparse.Namespace, prog: str) -> int:
    from triage.learning.registry import UnknownModel, list_models, promote

    if args.models_action == "promote":
        try:
            changed = promote(engine, args.version, actor=getpass.getuser(), reason=args.note)
        except UnknownModel as exc:
            print(f"{prog} models promote: {exc}", file=sys.stderr)
            return 1
        retired = [version for version, status in changed.items() if status == "retired"]
        print(f"{args.version} is champion" + (f"; {', '.join(retired)} retired" if retired else ""))
        return 0
    rows = list_models(engine)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    if not rows:
        print("no models yet: triage train makes one")
        return 0
    print(
        f"{'version':<22}{'status':<11}{'created':<22}{'examples':>9}{'macro-F1':>10}{'coverage':>10}{'acc.prec':>10}"
    )
    for row in rows:
        m = row["metrics"]
        print(
            f"{row['version']:<22}{row['status']:<11}{row['created_at']:%Y-%m-%d %H:%M:%S}  "
            f"{row['params'].get('examples', 0):>9}{m.get('macro_f1')!s:>10}{m.get('coverage')!s:>10}"
            f"{m.get('accepted_precision')!s:>10}"
        )
    return 0


def _evaluate(engine: Any, args: argparse.Namespace, taxonomy: Any, prog: str) -> int:
    from triage.classifiers.keyword import KeywordClassifier
    from triage.classifiers.taxonomy import TaxonomyError
    from triage.learning.evaluation import evaluate, keyword_predictor, render
    from triage.learning.examples import LabelledDocument, read_examples
    from triage.learning.model import ArtifactRefused
    from triage.learning.registry import NoChampion, UnknownModel, load_champion, load_model

    try:
        with args.file.open("rb") as stream:
            parsed = list(read_examples(stream, taxonomy.names))
    except OSError as exc:
        print(f"{prog} evaluate: {exc}", file=sys.stderr)
        return 2
    examples = [e for e in parsed if isinstance(e, LabelledDocument)]
    refused = len(parsed) - len(examples)
    if not examples:
        print(f"{prog} evaluate: {args.file} holds no usable labelled example", file=sys.stderr)
        return 1
    try:
        if args.model == "keyword":
            classifier = KeywordClassifier(taxonomy)
            thresholds: dict[str, float | None] = {name: args.confidence_threshold for name in taxonomy.names}
            result = evaluate(
                examples, keyword_predictor(classifier), thresholds, model_version=classifier.version, refused=refused
            )
        else:
            loaded = load_champion(engine) if args.model is None else load_model(engine, args.model)
            result = evaluate(
                examples, loaded.model.predict, loaded.thresholds, model_version=loaded.version, refused=refused
            )
    except (TaxonomyError, NoChampion, UnknownModel, ArtifactRefused) as exc:
        print(f"{prog} evaluate: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else render(result))
    return 0
