"""docs/troubleshooting.md is generated from the records declared beside each name (api/reasons.py): the committed
page is the generated one, and every condition type, reason and Event reason the operator's code writes is on it
(found in the code itself: the literals and constants at each place a condition is set or an Event posted)."""

from __future__ import annotations

import ast
import importlib
import typing
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from dtrain_operator.api import reasons
from dtrain_operator.api.common import Phase
from dtrain_operator.cli.troubleshooting import load_declarations, troubleshooting_reference
from dtrain_operator.core.status.events import QUIET_PHASES, WARNING_CONDITIONS

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "troubleshooting.md"
PACKAGE = REPO / "operator" / "dtrain_operator"
# Where a condition is set or an Event posted: the callable's name and the position of its reason argument
# (a `reason=` keyword counts anywhere), and of its condition type.
REASON_ARGUMENT = {
    "set": 2, "clear": 1, "_set": 3, "Ending": 1, "FailureDecision": 1, "Resize": 1, "Refusal": 3, "Verdict": 1,
    "JobEvent": 1, "warn": 2,
}
TYPE_ARGUMENT = {"set": 0, "clear": 0, "_set": 1}


def _called(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def _values(node: ast.expr, module: ModuleType) -> list[str]:
    """The names an argument can be: a literal, a template (Invalid<Kind>), or a constant of the module or of a
    module it imported; [] for what only the run knows (a decision's reason, the phase)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(p.value if isinstance(p, ast.Constant) else f"<{ast.unparse(p.value).title()}>"
                        for p in node.values)]
    if isinstance(node, ast.Subscript):
        return _values(node.value, module)
    value: object = None
    if isinstance(node, ast.Name):
        value = vars(module).get(node.id)
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner = vars(module).get(node.value.id)
        value = getattr(owner, node.attr, None) if isinstance(owner, ModuleType) else None
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, str)]
    return [value] if isinstance(value, str) else []


def written_names() -> Iterator[tuple[str, str, str]]:
    """(where, "reason" or "condition", name) for each name the operator's code writes into a status or an Event."""
    for path in sorted([*(PACKAGE / "core").rglob("*.py"), *(PACKAGE / "controller").rglob("*.py")]):
        dotted = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        module = importlib.import_module(dotted)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            called = _called(node)
            arguments = [k.value for k in node.keywords if k.arg == "reason"]
            if called in REASON_ARGUMENT and len(node.args) > REASON_ARGUMENT[called]:
                arguments.append(node.args[REASON_ARGUMENT[called]])
            for argument in arguments:
                yield from ((where, "reason", name) for name in _values(argument, module))
            if called in TYPE_ARGUMENT and len(node.args) > REASON_ARGUMENT[called]:
                yield from ((where, "condition", n) for n in _values(node.args[TYPE_ARGUMENT[called]], module))


def test_the_committed_page_is_the_generated_one():
    assert PAGE.read_text() == troubleshooting_reference(), "docs/troubleshooting.md is stale: run `make manifests`"


def test_every_name_the_code_writes_is_declared_and_on_the_page():
    load_declarations()
    page = PAGE.read_text()
    declared = {kind: {r.name for r in reasons.declared(kind)} for kind in ("condition", "reason", "event")}
    found = list(written_names())
    assert len(found) > 80  # the scan sees the code
    missing = [
        (where, kind, name) for where, kind, name in found
        # An Event's reason is one of a reason's, an Event's or (a warning) a condition type's.
        if name not in (declared[kind] | declared["event"] if kind == "reason" else declared[kind])
        and name not in declared["condition"]
    ]
    assert not missing, f"declare these with api/reasons.py where they are defined: {missing}"
    not_on_page = [name for _, _, name in found if f"| `{name}` |" not in page]
    assert not not_on_page


def test_every_event_reason_is_declared():
    """Every phase but the first steps of a start is an Event's reason, and so is every condition that warns."""
    load_declarations()
    events = {r.name for r in reasons.declared("event")}
    assert set(typing.get_args(Phase)) - set(QUIET_PHASES) <= events
    assert not set(QUIET_PHASES) & events
    assert set(WARNING_CONDITIONS) <= {r.name for r in reasons.declared("condition")}


@pytest.mark.parametrize("kind", ["condition", "reason", "event"])
def test_every_record_says_what_it_means(kind):
    load_declarations()
    records = reasons.declared(kind)
    assert records
    assert all(r.meaning and not r.meaning.endswith(".") for r in records), [r.name for r in records]


def test_a_name_declared_twice_with_other_words_is_refused(monkeypatch):
    monkeypatch.setattr(reasons, "_DECLARED", {})  # the page's records stay as the code declares them
    reasons.reason("ReasonOfThisTest", "a reason", "nothing")
    assert reasons.reason("ReasonOfThisTest", "a reason", "nothing") == "ReasonOfThisTest"
    with pytest.raises(ValueError, match="declared twice"):
        reasons.reason("ReasonOfThisTest", "other words")
