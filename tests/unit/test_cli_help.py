"""The ``triage`` command's help (rich-argparse, as the ``airflow`` command's) and its shell
completion (argcomplete), both from packages that come with Airflow."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich_argparse import RichHelpFormatter

from triage_tools import cli


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += parsers(sub)
    return found


def test_every_command_is_formatted_by_rich_argparse() -> None:
    every = parsers(cli._parser())
    assert len(every) > 10  # the product's commands and the developer verbs

    def rich(parser: argparse.ArgumentParser) -> bool:
        return isinstance(parser.formatter_class, type) and issubclass(parser.formatter_class, RichHelpFormatter)

    assert all(rich(p) for p in every), [p.prog for p in every if not rich(p)]


def test_help_keeps_argparse_headings_and_line_breaks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: triage ")
    assert "\nexamples:\n  triage status " in out  # the epilog as written


def test_help_is_coloured_in_a_terminal() -> None:
    env = {**os.environ, "FORCE_COLOR": "1", "COLUMNS": "100"}
    env.pop("NO_COLOR", None)
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from triage_tools.cli import main; sys.exit(main())", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    assert "\x1b[" in out


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param("triage sta", {"status"}, id="command"),
        pytest.param("triage replay --rea", {"--reason"}, id="option"),
        pytest.param("triage db ", {"url", "start", "stop"}, id="sub-command"),
    ],
)
def test_shell_completion(line: str, expected: set[str], tmp_path: Path) -> None:
    """What bash's completion hook (``register-python-argcomplete triage``) asks and is told."""
    answer = tmp_path / "completions"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
    }
    subprocess.run(
        [sys.executable, "-c", "import sys; from triage_tools.cli import main; sys.exit(main())"],
        env=env,
        timeout=60,
        check=True,
    )
    assert {word.strip() for word in answer.read_text().split("\n") if word.strip()} >= expected
