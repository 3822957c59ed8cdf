from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# engine_test_models must be importable by its classPath, whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))

from engine_test_models import make_model, write_training_artifacts

from dtrain_operator.api import contract
from dtrain_operator.cli import main as cli

# Few, short timed runs: the tests check the report, not the numbers.
FAST_TIMING = ["--warmup", "1", "--iterations", "5", "--max-seconds", "0.2", "--seed", "7"]


@dataclass
class EngineCommand:
    exit_code: int
    stdout: str
    stderr: str
    out: Path
    report_path: Path

    @property
    def report(self) -> dict[str, Any]:
        return json.loads(self.report_path.read_text())

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


@pytest.fixture
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the summary goes (the operator sets the same variable's default path in a pod)."""
    path = tmp_path / "termination-log"
    monkeypatch.setenv(contract.ENV_TERMINATION_LOG, str(path))
    return path


def _command_runner(capsys: pytest.CaptureFixture[str], tmp_path: Path, platform_factory=None):
    """`dtrain build-engine` with fast timing settings: through the real CLI entry point, or, with a
    platform, through engine.run on it (the TensorRT double and its host device)."""

    def run(onnx: Path | str, *extra: str, out: Path | None = None, timing: bool = True) -> EngineCommand:
        out = out or tmp_path / "out" / contract.ENGINE_FILE_NAME
        argv = ["build-engine", "--onnx", str(onnx), "--out", str(out), *extra]
        if timing:
            argv += FAST_TIMING
        capsys.readouterr()
        if platform_factory is None:
            exit_code = cli.main(argv)
        else:
            from dtrain_engine import main as engine

            exit_code = engine.run(cli.build_parser().parse_args(argv), platform_factory())
        captured = capsys.readouterr()
        out = Path(out)  # an s3:// URL too: its report is read from the bucket
        return EngineCommand(exit_code, captured.out, captured.err, out, out.parent / contract.ENGINE_REPORT_FILE_NAME)

    return run


@pytest.fixture
def build_engine(capsys: pytest.CaptureFixture[str], tmp_path: Path, termination_log: Path):
    """Run `dtrain build-engine` through the real CLI entry point, with fast timing settings."""
    return _command_runner(capsys, tmp_path)


@pytest.fixture
def tensorrt_double(monkeypatch: pytest.MonkeyPatch):
    """The TensorRT double in place of the `tensorrt` module.

    Only the import is redirected: `import tensorrt` in dtrain_engine.tensorrt_runtime
    finds the double, as it would find the real package, and tensorrt_runtime is imported
    afresh with it (and dropped afterwards, so no other test sees it). Nothing in the code
    under test is patched."""
    import tensorrt_double

    import dtrain_engine

    tensorrt_double.reset()
    monkeypatch.setitem(sys.modules, "tensorrt", tensorrt_double)
    monkeypatch.delitem(sys.modules, "dtrain_engine.tensorrt_runtime", raising=False)
    monkeypatch.delattr(dtrain_engine, "tensorrt_runtime", raising=False)
    yield tensorrt_double
    sys.modules.pop("dtrain_engine.tensorrt_runtime", None)
    if hasattr(dtrain_engine, "tensorrt_runtime"):
        delattr(dtrain_engine, "tensorrt_runtime")


@pytest.fixture
def build_with_double(capsys: pytest.CaptureFixture[str], tmp_path: Path, termination_log: Path, tensorrt_double):
    """`dtrain build-engine` on the TensorRT double and its host device: the whole TensorRT path runs."""
    from dtrain_engine import main as engine

    return _command_runner(
        capsys, tmp_path, lambda: engine.Platform(tensorrt_double.__version__, tensorrt_double.HostDevice())
    )


@pytest.fixture(scope="session")
def trained_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifacts.dir as training leaves it, for a dynamic-batch model (made once per session)."""
    return write_training_artifacts(make_model(), tmp_path_factory.mktemp("artifacts") / "run")


@pytest.fixture
def artifacts_copy(trained_artifacts: Path, tmp_path: Path) -> Path:
    """A private copy of the artifacts directory; returns its model.onnx."""
    directory = tmp_path / "artifacts"
    shutil.copytree(trained_artifacts.parent, directory)
    return directory / contract.ONNX_FILE_NAME


@pytest.fixture(scope="session")
def static_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model exported with a fixed batch of 4."""
    return write_training_artifacts(make_model(), tmp_path_factory.mktemp("static") / "run", static_batch=4)
