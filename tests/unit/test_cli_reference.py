"""docs/cli.md, generated from the `dtrain` parser: every command has its section, its usage and each of its
arguments, and the committed page is the generated one (tests/chart runs tools/generate_manifests.py --check)."""

from __future__ import annotations

import argparse

from dtrain_operator.cli.main import build_parser
from dtrain_operator.cli.reference import cli_reference


def test_every_command_and_argument_is_in_the_reference():
    parser = build_parser()
    page = cli_reference(parser)
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sub in commands.choices.items():
        assert f"\n## `dtrain {name}`\n" in page
        assert f"\n```\ndtrain {name} [-h]" in page
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page.split(f"## `dtrain {name}`")[1].split("\n## ")[0], (name, option)
