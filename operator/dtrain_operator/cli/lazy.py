"""Subcommands imported only when run, so that each image imports only what it has."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def lazy(module: str, function: str = "main") -> Callable[[argparse.Namespace], int]:
    """A subcommand whose implementation lives in another module, imported only when run."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        return int(getattr(importlib.import_module(module), function)(args) or 0)

    return run
