"""Each image's build context holds only the packages it needs, and the dtrain wheel builds from it.

tests/images builds the real images; this checks, in seconds, what their first steps rely on:
the files each Dockerfile copies are what its .dockerignore lets in, and `pip wheel` of a copy
of just those files (pyproject.toml finds the packages) yields a wheel of those packages alone.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
API = {"dtrain_operator", "dtrain_operator.api"}
IMAGES = {
    "operator/Dockerfile": API | {"dtrain_operator.core", "dtrain_operator.controller", "dtrain_operator.core.status", "dtrain_operator.cli"},
    "trainer_image/Dockerfile": API | {"dtrain_operator.cli", "dtrain_trainer", "dtrain_common"},
    "trainer_image/engine.Dockerfile": API | {"dtrain_operator.cli", "dtrain_engine", "dtrain_common", "dtrain_trainer"},
}


def copied_sources(dockerfile: str) -> list[str]:
    """The repository paths the Dockerfile's COPY lines take from the build context."""
    sources = []
    for line in (ROOT / dockerfile).read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(word.startswith("--from") for word in words):
            *paths, destination = words[1:]
            for path in paths:
                # Each file lands where it is in the repository, which is what the wheel's build expects.
                parent = path.rpartition("/")[0]
                expected = path if len(paths) == 1 and not destination.endswith("/") else f"{parent or '.'}/"
                assert destination == expected, f"{dockerfile}: {line!r} puts {path} elsewhere than in the repository"
            sources += paths
    return sources


def admitted_paths(dockerfile: str) -> list[str]:
    """The paths the Dockerfile's .dockerignore lets into the build context (it ignores everything else)."""
    lines = (ROOT / f"{dockerfile}.dockerignore").read_text().splitlines()
    assert "*" in lines, f"{dockerfile}.dockerignore must start from ignoring everything (*)"
    return [line[1:].rstrip("/") for line in lines if line.startswith("!")]


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_the_dockerignore_admits_what_the_dockerfile_copies(dockerfile: str) -> None:
    assert sorted(admitted_paths(dockerfile)) == sorted(copied_sources(dockerfile))


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_the_wheel_builds_from_the_images_files_alone(dockerfile: str, tmp_path: Path) -> None:
    context = tmp_path / "context"
    for source in copied_sources(dockerfile):
        target = context / source
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / source, target)
    wheels = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(context)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = wheels.glob("dtrain-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packages = {name.rsplit("/", 1)[0].replace("/", ".") for name in archive.namelist() if name.endswith("/__init__.py")}
    assert packages == IMAGES[dockerfile]
