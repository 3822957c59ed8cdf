"""The subcommands whose implementations live in other packages, each imported only when it runs, so that
each image imports only what it has. The imports are written out (not module names in strings), so that
the layering contracts (pyproject.toml's import-linter) see what the command depends on."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

EXIT_NOT_IN_THIS_IMAGE = 127

Command = Callable[[argparse.Namespace], int]


def in_this_image(load: Callable[[], Command]) -> Command:
    """The subcommand that `load` imports when it runs. In an image that leaves its package out (the
    trainer image has no operator, the operator image no trainer), it says so in one line instead of a
    traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            implementation = load()
        except ModuleNotFoundError as exc:
            print(f"dtrain {args.command}: not in this image ({exc.name} is not installed here); "
                  "run it where dtrain is installed whole (a checkout, or the image that has it)", file=sys.stderr)
            return EXIT_NOT_IN_THIS_IMAGE
        return int(implementation(args) or 0)

    return run


def submit() -> Command:
    from dtrain_operator.cli.cluster import submit

    return submit


def get() -> Command:
    from dtrain_operator.cli.cluster import get

    return get


def watch() -> Command:
    from dtrain_operator.cli.cluster import watch

    return watch


def logs() -> Command:
    from dtrain_operator.cli.cluster import logs

    return logs


def delete() -> Command:
    from dtrain_operator.cli.cluster import delete

    return delete


def run_locally() -> Command:
    from dtrain_operator.local.run import main

    return main


def build_engine() -> Command:
    from dtrain_engine.main import main

    return main


def operator() -> Command:
    from dtrain_operator.controller.main import main

    return main
