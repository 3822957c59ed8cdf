"""mypy checks the TensorRT builder against tensorrt-stubs (TensorRT 10.13's typed API), so that
API drift (a removed attribute such as `Builder.max_batch_size`, a renamed method, a wrong
argument) fails `make test` on machines that cannot import TensorRT."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from repaired_tensorrt_stubs import installed_stub_root, write_repaired_stubs

from dtrain_engine import main as engine

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("mypy-tensorrt.ini")
ENGINE_TENSORRT = Path(engine.__file__).with_name("tensorrt_runtime.py")
# Where the engine's imports live: the editable install's import hook is not a path mypy can follow.
SOURCES = (REPO / "operator", REPO / "trainer_image")


@pytest.fixture(scope="module")
def mypy(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("mypy", reason="mypy is a dev dependency")
    if installed_stub_root() is None:
        pytest.skip("tensorrt-stubs is not installed (pip install --no-deps tensorrt-stubs)")
    workdir = tmp_path_factory.mktemp("mypy")
    stubs = write_repaired_stubs(workdir / "stubs")

    def run(*paths: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(CONFIG), "--cache-dir", str(workdir / "cache"),
             "--no-error-summary", *map(str, paths)],
            capture_output=True, text=True, cwd=REPO, env={**os.environ, "MYPYPATH": os.pathsep.join(map(str, (stubs, *SOURCES)))}, timeout=300,
            check=False,
        )

    return run


def test_the_tensorrt_builder_type_checks_against_the_stubs(mypy) -> None:
    result = mypy(ENGINE_TENSORRT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_catches_api_that_tensorrt_10_removed(mypy, tmp_path: Path) -> None:
    """The seed's builder code: the same check must reject it, or a pass above would mean nothing."""
    seed = tmp_path / "seed_builder.py"
    seed.write_text(
        "import tensorrt as trt\n"
        "builder = trt.Builder(trt.Logger(trt.Logger.WARNING))\n"
        "builder.max_batch_size = 32\n"
        "config = builder.create_builder_config()\n"
        "config.max_workspace_size = 1 << 30\n"
        "engine = builder.build_engine(builder.create_network(0), config)\n"
    )
    result = mypy(seed)
    assert result.returncode == 1
    assert '"Builder" has no attribute "max_batch_size"' in result.stdout
    assert '"IBuilderConfig" has no attribute "max_workspace_size"' in result.stdout
    assert '"Builder" has no attribute "build_engine"' in result.stdout


def test_the_stub_repair_touches_only_the_signatures_python_cannot_parse(tmp_path: Path) -> None:
    import ast

    root = installed_stub_root()
    if root is None:
        pytest.skip("tensorrt-stubs is not installed (pip install --no-deps tensorrt-stubs)")
    stubs = write_repaired_stubs(tmp_path)
    for package in ("tensorrt", "tensorrt_bindings"):
        for original in (root / package).glob("*.pyi"):
            before = original.read_text().splitlines()
            after = (stubs / package / original.name).read_text().splitlines()
            assert len(before) == len(after)
            changed = [(old, new) for old, new in zip(before, after) if old != new]
            for old, new in changed:
                assert new.lstrip().startswith("def ")
                with pytest.raises(SyntaxError):
                    ast.parse(old.strip() + " ...")
                ast.parse(new.strip() + " ...")
            ast.parse("\n".join(after))
