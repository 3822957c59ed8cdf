"""The `dtrain` command's reference, docs/cli.md, generated from its argument parser (`dtrain cli-docs`), so that
what the page says of a command is what `dtrain COMMAND --help` says."""

from __future__ import annotations

import argparse

HEADER = """# The `dtrain` command

Generated from the command's own parser by `dtrain cli-docs` (`make manifests` writes this file; a test
checks it is current). `dtrain COMMAND --help` says the same.

The cluster commands behave as kubectl does: `-n/--namespace` (default: the kubeconfig context's
namespace), `--context`, `--kubeconfig`, `-o json|yaml` where an object is printed; credentials come from
`$KUBECONFIG` or `~/.kube/config`, or from the pod's service account in a cluster.
"""


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """Each subcommand's name, one-line help and parser, in the order `dtrain --help` lists them."""
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return {name: (helps.get(name, ""), sub) for name, sub in action.choices.items()}
    return {}


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    shown = action.metavar or ("{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper())
    metavar = "" if action.nargs == 0 else f" {shown}"
    return ", ".join(f"`{option}{metavar}`" for option in action.option_strings)


def _help(action: argparse.Action) -> str:
    text = (action.help or "").replace("%%", "%")
    if "%(" in (action.help or ""):
        text = (action.help or "") % {"default": action.default, "prog": "dtrain"}
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        text += f" (one of: {', '.join(str(choice) for choice in action.choices)})"
    if action.required and action.option_strings:
        text += " (required)"
    return text.replace("|", "\\|").replace("\n", " ")


def cli_reference(parser: argparse.ArgumentParser) -> str:
    """docs/cli.md: for each subcommand, what it does, its usage and every argument."""
    parts = [HEADER]
    for name, (summary, sub) in _subcommands(parser).items():
        parts.append(f"\n## `dtrain {name}`\n\n{summary[:1].upper() + summary[1:]}.\n")
        if sub.description:
            parts.append(f"\n{sub.description}\n")
        usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
        parts.append(f"\n```\n{usage}\n```\n")
        rows = [action for action in sub._actions if not isinstance(action, argparse._HelpAction)]
        if rows:
            parts.append("\n| argument | what it does |\n|---|---|\n")
            parts.extend(f"| {_argument(action)} | {_help(action)} |\n" for action in rows)
    return "".join(parts)
