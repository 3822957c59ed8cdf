"""The size gate of `make lint`: no module over 400 lines and no function over 60 without a reason.

A module or function that is longer for a reason says so in a `# layout: <why>` comment: a module
in its header (the comment lines before its first statement after the docstring and `from __future__`
imports), a function on its `def` line, on one of its decorators or on the line just above them.

    python tools/check_layout.py [FOLDER ...]   (default: operator trainer_image tools tests bench)

prints one line for each module or function over its limit without a reason and exits 1 if there is one.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MODULE_MAX_LINES = 400
FUNCTION_MAX_LINES = 60
DEFAULT_FOLDERS = ("operator", "trainer_image", "tools", "tests", "bench")
REASON = re.compile(r"#\s*layout:\s*\S")


@dataclass(frozen=True)
class Oversize:
    """A module or a function over its limit, with no `# layout:` reason."""

    path: Path
    line: int
    what: str
    lines: int
    limit: int

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.what} has {self.lines} lines (limit {self.limit}): "
            "split it, or say why in a '# layout: <why>' comment"
        )


def _has_reason(lines: list[str], first: int, last: int) -> bool:
    """Whether one of the 1-based lines first..last carries a `# layout:` reason."""
    return any(REASON.search(line) for line in lines[max(first, 1) - 1 : last])


def _header_end(tree: ast.Module, line_count: int) -> int:
    """The last line of the module's header: what comes before its first real statement."""
    for index, node in enumerate(tree.body):
        is_docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if not (is_docstring or is_future):
            return node.lineno - 1
    return line_count


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method, nested ones too, with its qualified name."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def oversizes(path: Path) -> Iterator[Oversize]:
    """The module at `path` and its functions where they are over their limits without a reason."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source, filename=str(path))
    if len(lines) > MODULE_MAX_LINES and not _has_reason(lines, 1, _header_end(tree, len(lines))):
        yield Oversize(path, 1, "module", len(lines), MODULE_MAX_LINES)
    for name, function in _functions(tree):
        length = (function.end_lineno or function.lineno) - function.lineno + 1
        first = min([function.lineno, *(decorator.lineno for decorator in function.decorator_list)])
        if length > FUNCTION_MAX_LINES and not _has_reason(lines, first - 1, function.lineno):
            yield Oversize(path, function.lineno, f"function {name}", length, FUNCTION_MAX_LINES)


def main(argv: list[str]) -> int:
    folders = [Path(folder) for folder in argv] or [Path(folder) for folder in DEFAULT_FOLDERS]
    found = [oversize for folder in folders for path in sorted(folder.rglob("*.py")) for oversize in oversizes(path)]
    for oversize in found:
        print(oversize)
    if found:
        print(f"{len(found)} over the size limits", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
