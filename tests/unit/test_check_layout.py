"""tools/check_layout.py, the size gate of `make lint`: run as `make` runs it, on folders made here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "check_layout.py"


def check_layout(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(folder)], capture_output=True, text=True, check=False, timeout=60
    )


def function(name: str, body_lines: int, above: str = "", on_def: str = "") -> str:
    return f"{above}def {name}():{on_def}\n" + "    x = 1\n" * body_lines


def test_a_folder_within_the_limits_passes(tmp_path: Path) -> None:
    (tmp_path / "small.py").write_text('"""A small module."""\n\n' + function("short", 59))
    result = check_layout(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_a_long_function_is_named_with_its_line_and_length(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("class Job:\n    def plan(self):\n" + "        x = 1\n" * 60)
    result = check_layout(tmp_path)
    assert result.returncode == 1
    assert f"{tmp_path / 'long.py'}:2: function Job.plan has 61 lines (limit 60)" in result.stdout


def test_a_long_module_is_named_with_its_length(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text('"""A big module."""\n' + "x = 1\n" * 400)
    result = check_layout(tmp_path)
    assert result.returncode == 1
    assert f"{tmp_path / 'big.py'}:1: module has 401 lines (limit 400)" in result.stdout


def test_a_reason_on_the_def_line_or_above_it_lets_a_function_be_long(tmp_path: Path) -> None:
    (tmp_path / "reasons.py").write_text(
        function("on_def", 70, on_def="  # layout: one table of cases, read top to bottom")
        + function("above", 70, above="# layout: the argparse tree, one flag per line\n")
        + function("decorated", 70, above="# layout: a generated schema\n@staticmethod\n")
    )
    result = check_layout(tmp_path)
    assert result.returncode == 0, result.stdout


def test_a_reason_needs_words_and_a_place_in_the_header(tmp_path: Path) -> None:
    (tmp_path / "empty_reason.py").write_text(function("f", 70, on_def="  # layout:"))
    (tmp_path / "late_reason.py").write_text("import os\n# layout: too late, after the first statement\n" + "x = 1\n" * 400)
    (tmp_path / "header_reason.py").write_text(
        '"""A module."""\n\nfrom __future__ import annotations\n\n# layout: the whole CRD schema in one place\n'
        "import os\n" + "x = 1\n" * 400
    )
    result = check_layout(tmp_path)
    assert result.returncode == 1
    assert "empty_reason.py:1: function f has 71 lines" in result.stdout
    assert "late_reason.py:1: module has 402 lines" in result.stdout
    assert "header_reason.py" not in result.stdout
