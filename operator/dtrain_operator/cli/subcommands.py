"""Subcommands imported only when run, so that each image imports only what it has."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

EXIT_NOT_IN_THIS_IMAGE = 127


def lazy(module: str, function: str = "main") -> Callable[[argparse.Namespace], int]:
    """A subcommand whose implementation lives in another module, imported only when run. In an image
    that leaves its package out (the trainer image has no operator, the operator image no trainer),
    it says so in one line instead of a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            implementation = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            print(f"dtrain {args.command}: not in this image ({exc.name} is not installed here); "
                  "run it where dtrain is installed whole (a checkout, or the image that has it)", file=sys.stderr)
            return EXIT_NOT_IN_THIS_IMAGE
        return int(getattr(implementation, function)(args) or 0)

    return run
