"""docs/layout.md names every module of the operator package and of the trainer image, so that it cannot fall
behind the code, and every file its table of decisions points to exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYOUT = REPO / "docs" / "layout.md"
PACKAGES = [REPO / "operator" / "dtrain_operator", *(REPO / "trainer_image").glob("dtrain_*")]


def modules() -> list[Path]:
    return sorted(
        path for package in PACKAGES for path in package.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py") and "__pycache__" not in path.parts
    )


def test_every_module_is_named():
    text = LAYOUT.read_text()
    missing = [str(path.relative_to(REPO)) for path in modules() if f"`{path.name}`" not in text and
               f"/{path.name}`" not in text]
    assert not missing, f"docs/layout.md does not name {missing}"


def test_each_decision_points_to_a_file_that_exists():
    table = LAYOUT.read_text().split("## Where it is decided", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`((?:api|core|controller|dtrain_engine)/[\w/]+\.py)`", table)
    assert len(named) >= 15
    roots = {"dtrain_engine": REPO / "trainer_image"}
    missing = [n for n in named if not (roots.get(n.split("/")[0], REPO / "operator" / "dtrain_operator") / n).exists()]
    assert not missing, missing
