"""``triage train``'s threshold rule options: ``--thresholds`` or ``--per-label-margin``, never
both (the second used to win silently), parsed as the command line parses them (no database);
and ``train_classifier``'s ``thresholds`` param offers the same rules."""

from __future__ import annotations

import argparse

import pytest

from triage import cli
from triage.learning.commands import threshold_rule


def parse(*options: str) -> argparse.Namespace:
    top = cli.parser("triage")
    cli.add_commands(top.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return top.parse_args(["train", *options])


@pytest.mark.parametrize(
    ("options", "rule"),
    [
        pytest.param((), "verified", id="default"),
        pytest.param(("--thresholds", "verified"), "verified", id="verified"),
        pytest.param(("--thresholds", "pooled"), "pooled", id="pooled"),
        pytest.param(("--thresholds", "per-label"), "per-label", id="per-label"),
        pytest.param(("--per-label-margin",), "per-label", id="per-label-margin"),
    ],
)
def test_one_option_names_the_rule(options: tuple[str, ...], rule: str) -> None:
    assert threshold_rule(parse(*options)) == rule


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(("--thresholds", "pooled", "--per-label-margin"), id="pooled-then-margin"),
        pytest.param(("--per-label-margin", "--thresholds", "pooled"), id="margin-then-pooled"),
        pytest.param(("--thresholds", "verified", "--per-label-margin"), id="the-default-said-out-loud"),
        pytest.param(("--thresholds", "per-label", "--per-label-margin"), id="even-when-they-agree"),
    ],
)
def test_both_options_are_a_usage_error(options: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        parse(*options)
    assert refused.value.code == 2  # argparse's usage error: nothing trained
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_dag_param_offers_the_rules_training_knows() -> None:
    from triage.contracts.train_params import THRESHOLD_RULES, TrainParams, param_schemas
    from triage.learning.training import DEFAULT_SETTINGS
    from triage.learning.training import THRESHOLD_RULES as TRAINING_RULES

    assert THRESHOLD_RULES == TRAINING_RULES
    assert param_schemas()["thresholds"]["enum"] == list(TRAINING_RULES)
    assert TrainParams().thresholds == DEFAULT_SETTINGS.thresholds
