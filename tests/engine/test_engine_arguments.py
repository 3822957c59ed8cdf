"""Bad arguments and inputs: one clear line each on stderr, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain_operator.api import contract


@pytest.fixture
def not_onnx(tmp_path: Path) -> Path:
    path = tmp_path / "notes.onnx"
    path.write_text("this is a text file, not a protobuf\n" * 20)
    return path


@pytest.fixture
def empty_file(tmp_path: Path) -> Path:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    return path


CASES = {
    "min above opt": (["--min-batch", "4", "--opt-batch", "2", "--max-batch", "8"], "--min-batch 4 is larger than --opt-batch 2"),
    "opt above max": (["--opt-batch", "16", "--max-batch", "8"], "--opt-batch 16 is larger than --max-batch 8"),
    "min above max": (["--min-batch", "9", "--max-batch", "8"], "--min-batch 9 is larger than --max-batch 8"),
    "zero batch": (["--min-batch", "0"], "--min-batch 0: a batch size must be at least 1"),
    "zero workspace": (["--workspace-mib", "0"], "--workspace-mib 0"),
    "no timed runs": (["--iterations", "0"], "--iterations 0"),
    "engine-named report": (["--report", "REPORT_DIR/report.plan"], "is named like an engine"),
    "int8 without quantization": (["--precision", "int8"], "--precision int8 needs a quantized ONNX model"),
    "missing checkpoint": (["--pytorch-checkpoint", "/nonexistent/last.ckpt"], "--pytorch-checkpoint /nonexistent/last.ckpt: no such file"),
    "missing model config": (["--model-config", "/nonexistent/config.yaml"], "--model-config /nonexistent/config.yaml: no such file"),
}


@pytest.mark.parametrize("flags, expected", CASES.values(), ids=CASES.keys())
def test_bad_flags_give_one_line(build_engine, artifacts_copy: Path, tmp_path: Path, flags: list[str], expected: str) -> None:
    flags = [flag.replace("REPORT_DIR", str(tmp_path)) for flag in flags]

    result = build_engine(artifacts_copy, "--fallback", "onnxruntime", *flags, timing=False)

    assert result.exit_code == 2
    assert len(result.error_lines) == 1, result.stderr
    assert result.error_lines[0].startswith("dtrain build-engine: error: ")
    assert expected in result.error_lines[0]
    assert not result.report_path.exists() and not result.out.exists()


def test_missing_onnx_file(build_engine, tmp_path: Path) -> None:
    result = build_engine(tmp_path / "missing.onnx", "--fallback", "onnxruntime", timing=False)

    assert result.exit_code == 2
    assert result.error_lines == [f"dtrain build-engine: error: --onnx {tmp_path / 'missing.onnx'}: no such file"]


@pytest.mark.parametrize("fixture", ["not_onnx", "empty_file"])
def test_a_file_that_is_not_onnx(build_engine, request: pytest.FixtureRequest, fixture: str) -> None:
    path: Path = request.getfixturevalue(fixture)

    result = build_engine(path, "--fallback", "onnxruntime", timing=False)

    assert result.exit_code == 2
    assert len(result.error_lines) == 1
    assert f"--onnx {path} is not an ONNX model" in result.error_lines[0]


def test_a_directory_for_onnx_or_out(build_engine, artifacts_copy: Path, tmp_path: Path) -> None:
    result = build_engine(tmp_path, "--fallback", "onnxruntime", timing=False)
    assert result.exit_code == 2 and "is a directory" in result.error_lines[0]

    result = build_engine(artifacts_copy, "--fallback", "onnxruntime", out=tmp_path, timing=False)
    assert result.exit_code == 2 and len(result.error_lines) == 1
    assert f"--out {tmp_path} is a directory" in result.error_lines[0]


def test_the_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    """The real console entry point in a fresh process: a bad argument is one line on stderr."""
    onnx_path = tmp_path / "model.onnx"
    onnx_path.write_text("not a model")
    env = {**os.environ, contract.ENV_TERMINATION_LOG: str(tmp_path / "termination-log")}
    completed = subprocess.run(
        [sys.executable, "-m", "dtrain_operator.cli", "build-engine", "--onnx", str(onnx_path),
         "--out", str(tmp_path / "model.plan"), "--min-batch", "8", "--max-batch", "4"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        "dtrain build-engine: error: --min-batch 8 is larger than --max-batch 4: need --min-batch <= --opt-batch <= --max-batch"
    ]
    assert "Traceback" not in completed.stderr + completed.stdout
    assert not (tmp_path / "termination-log").exists()
