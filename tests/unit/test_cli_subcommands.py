"""A subcommand whose package an image leaves out says so in one line (the trainer image has no operator)."""

from __future__ import annotations

import argparse

from dtrain_operator.cli.lazy import EXIT_NOT_IN_THIS_IMAGE, lazy


def test_a_subcommand_whose_package_is_missing_says_so(capsys):
    code = lazy("dtrain_operator.not_in_this_image")(argparse.Namespace(command="operator"))
    assert code == EXIT_NOT_IN_THIS_IMAGE
    err = capsys.readouterr().err
    assert err.startswith("dtrain operator: not in this image (dtrain_operator.not_in_this_image is not installed here)")
    assert "Traceback" not in err


