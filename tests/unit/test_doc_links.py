"""Every link between the README, the CHANGELOG, docs/ and the chart's README leads somewhere: the file exists, and a
`#heading` names a heading of that page (as GitHub makes its anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md")), REPO / "helm" / "dtrain-operator" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`[^`\n]*`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def links(page: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", page.read_text()))
    return [target for target in LINK.findall(text) if not target.startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_link_leads_to_a_file_and_a_heading(page: Path):
    broken = []
    for target in links(page):
        path, _, heading = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif heading and linked.suffix == ".md" and heading not in anchors(linked):
            broken.append(f"{target}: no such heading")
    assert broken == []
