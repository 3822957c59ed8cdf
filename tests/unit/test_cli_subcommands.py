"""A subcommand whose package an image leaves out says so in one line (the trainer image has no operator)."""

from __future__ import annotations

import argparse

from dtrain_operator.cli.subcommands import EXIT_NOT_IN_THIS_IMAGE, in_this_image


def _missing():
    from dtrain_operator.not_in_this_image import main  # as the trainer image imports dtrain_operator.controller

    return main


def test_a_subcommand_whose_package_is_missing_says_so(capsys):
    code = in_this_image(_missing)(argparse.Namespace(command="operator"))
    assert code == EXIT_NOT_IN_THIS_IMAGE
    err = capsys.readouterr().err
    assert err.startswith("dtrain operator: not in this image (dtrain_operator.not_in_this_image is not installed here)")
    assert "Traceback" not in err
