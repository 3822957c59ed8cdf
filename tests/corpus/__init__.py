"""Job files as careful and careless users write them, each with the verdict it must get.

Each file under wrong_jobs/ holds YAML documents separated by `---` lines, one case each: a whole
DistributedTraining as a user would write it (the text matters: YAML 1.1 keys, byte sizes), with a
first comment line that says what it must get:

    # expect: refused <text>   `dtrain validate` refuses it, its message containing <text>
    # expect: server <text>    only the API server can tell: the operator refuses it before anything
                               runs (the server's dry run of its children), its message containing <text>
    # expect: accepted         it is a working job

A case's metadata.name names it (unique over the corpus). The unit tier checks the offline verdicts
(tests/unit/test_wrong_jobs.py); `make e2e`'s scenario `wrong-jobs` sends every case to the real API
server and the operator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

CORPUS = Path(__file__).parent / "wrong_jobs"
_EXPECT = re.compile(r"^# expect: (refused|server|accepted)\b ?(.*)$", re.MULTILINE)
MAX_MESSAGE_BYTES = 16 * 1024  # every verdict's message is shorter than this


@dataclass(frozen=True)
class Case:
    file: str
    name: str
    text: str
    verdict: str  # refused, server or accepted
    needle: str  # what the message must contain ("" for accepted)

    @property
    def id(self) -> str:
        return f"{self.file}:{self.name}"


def load_cases() -> list[Case]:
    cases: list[Case] = []
    for path in sorted(CORPUS.glob("*.yaml")):
        for text in re.split(r"^---[ \t]*$", path.read_text(), flags=re.MULTILINE):
            if not text.strip():
                continue
            expect = _EXPECT.search(text)
            if expect is None:
                raise ValueError(f"{path.name}: a case without '# expect:' line:\n{text[:300]}")
            name = (yaml.safe_load(text) or {}).get("metadata", {}).get("name", "")
            cases.append(Case(path.stem, name, text.lstrip("\n"), expect.group(1), expect.group(2).strip()))
    names = [case.name for case in cases]
    duplicates = {name for name in names if names.count(name) > 1}
    if duplicates or "" in names:
        raise ValueError(f"corpus case names must be unique and present: {sorted(duplicates)}")
    return cases
