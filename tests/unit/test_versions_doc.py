"""docs/versions.md reads each version from the file that pins it: every `pin` (`file`) pair of its tables is
found, as written, in that file, so that a pin changed without the page fails here; and the page names each
part a user asks about."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "versions.md"
PIN = re.compile(r"`([^`]+)` \(`([^`]+)`\)")


def pins() -> list[tuple[str, str]]:
    """Every (pin, file) the page's tables name, including those listed before one file: `a`, `b` (`file`)."""
    found = []
    for row in (line for line in PAGE.read_text().splitlines() if line.startswith("| ")):
        for cell in row.split(" | "):
            for listed, path in re.findall(r"((?:`[^`]+`,? )+)\(`([^`]+)`\)", cell):
                found += [(pin, path) for pin in re.findall(r"`([^`]+)`", listed)]
    return found


def test_every_pin_is_in_its_file():
    found = pins()
    assert len(found) >= 25
    missing = [(pin, path) for pin, path in found if pin not in (REPO / path).read_text()]
    assert not missing, f"docs/versions.md names pins its files no longer hold: {missing}"


def test_the_page_covers_what_users_ask_about():
    text = PAGE.read_text()
    named = {path for _, path in pins()}
    for part in ("Kubernetes", "Kueue", "scheduler-plugins", "PyTorch", "Lightning", "ONNX Runtime", "Python"):
        assert f"| {part}" in text, part
    for pin_file in ("pyproject.toml", "Makefile", "tools/cluster/controlplane/go.mod", "tools/cluster/kueue/go.mod",
                     "tools/cluster/coscheduling/go.mod", "tools/install-k8s-tools.sh"):
        assert pin_file in named, pin_file
