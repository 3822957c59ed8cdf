"""Every `make` target and every `dtrain` command and option that the README and docs/ quote exists, and the README's
job is valid as pasted: a renamed target or flag, or a field the job lacks, fails here, not in a newcomer's shell."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from dtrain_operator.api.validation import validate_text
from dtrain_operator.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "helm" / "dtrain-operator" / "README.md"]
# `make X` at the start of a command or in backticks; a word after it that is a variable (NODES=3) is no target.
MAKE = re.compile(r"(?:^|`|\$ )make ((?:[a-z][a-z0-9-]*)(?: [a-z][a-z0-9-]*)*)", re.MULTILINE)
# `dtrain COMMAND ...` in backticks or as a command line of a code block, up to a comment or the backtick.
DTRAIN = re.compile(r"(?:^|`)dtrain ([a-z][a-z-]*)((?: [^`#\n|]*)?)", re.MULTILINE)
# Words that follow "dtrain " in prose ("dtrain runs multi-node ...").
PROSE = {"runs", "is", "and", "restarts", "creates", "has", "does", "keeps", "counts", "reads", "takes", "uses",
         "writes", "sets", "knows", "needs", "trains", "sends", "refuses", "asks", "starts", "checks", "stops"}
OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def _targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (REPO / "Makefile").read_text(), re.MULTILINE))


def _commands() -> dict[str, set[str]]:
    (subcommands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: {option for action in sub._actions for option in action.option_strings}
            for name, sub in subcommands.choices.items()}


def _quoted(pattern: re.Pattern[str]) -> list[tuple[str, re.Match[str]]]:
    return [(page.relative_to(REPO).as_posix(), match) for page in PAGES for match in pattern.finditer(page.read_text())]


@pytest.mark.parametrize("page,match", _quoted(MAKE), ids=lambda value: getattr(value, "group", lambda: value)())
def test_a_quoted_make_target_exists(page: str, match: re.Match[str]) -> None:
    first = match.group(1).split()[0]
    assert first in _targets(), f"{page} quotes `make {first}`, which the Makefile has no target for"


@pytest.mark.parametrize("page,match", [(page, m) for page, m in _quoted(DTRAIN) if m.group(1) not in PROSE], ids=lambda value: getattr(value, "group", lambda: value)())
def test_a_quoted_dtrain_command_and_its_options_exist(page: str, match: re.Match[str]) -> None:
    command, rest = match.group(1), match.group(2)
    commands = _commands()
    assert command in commands, f"{page} quotes `dtrain {command}`, which is no command of dtrain"
    for option in OPTION.findall(rest):
        assert option in commands[command], f"{page} quotes `dtrain {command} {option}`, which it does not take"


def test_the_readme_job_is_valid_as_pasted() -> None:
    """The job the README shows is one `dtrain validate` takes for a cluster, as it stands on the page."""
    (job,) = re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    result = validate_text(job, "README.md")
    assert not result.errors, result.errors
