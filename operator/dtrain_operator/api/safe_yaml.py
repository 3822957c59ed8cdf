"""Read job files the way the API server would accept them, and refuse hostile ones cheaply.

PyYAML's `safe_load` is safe from code execution but not from a file built to hurt:
an alias bomb ("billion laughs") expands to billions of nodes, deep nesting ends in a
RecursionError, a duplicate key silently wins over the first, and YAML 1.1 reads
`1:30` as the integer 90. `kubectl apply` rejects duplicate keys and caps alias
expansion; the API server caps a request at 3 MiB. This loader does the same before
anything is constructed: it composes the node graph, measures it (the alias-expanded
size is counted with shared subtrees memoised, so a bomb costs no more than its text),
and constructs Python objects only when every limit holds.

Values are read as kubectl reads them: an implicit timestamp (`2024-02-30`, `2024-01-01`) stays
the string it is written as, `y` and `n` are YAML 1.1's booleans as `yes` and `no` are, and a
value that cannot be what its tag says (`!!int abc`, `0x_`, an integer beyond 64 bits) is
refused in one line instead of raising whatever exception the constructor happens to raise.
An unquoted key that YAML 1.1 reads as a boolean (`n: 96` in initArgs) is refused: kubectl
sends it as the key "false", which no one meant.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from dtrain_operator.api.redaction import redact_text

# The API server refuses requests over 3 MiB (--max-request-bytes' default for
# resources is 3 MiB); a job file larger than that could never be applied.
MAX_FILE_BYTES = 3 * 1024 * 1024
# Deeper than any Kubernetes object needs (a pod spec is about 12 levels deep).
MAX_DEPTH = 64
# Nodes after alias expansion: a generous pod-spec-sized document is a few thousand.
MAX_EXPANDED_NODES = 100_000
# How much of a bad value an error message echoes.
ECHO_LIMIT = 60
# How many items of a list (node counts, keys) a message names before it counts the rest.
LISTED_ITEMS = 5

# The integers the API server stores exactly (JSON numbers decode to int64, or else to float64).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_INT_TAG = "tag:yaml.org,2002:int"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_DECIMAL = re.compile(r"[-+]?[0-9][0-9_]*")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass
class YamlRefused(Exception):
    """A document that is not valid YAML, or that breaks one of the limits above."""

    message: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        return self.message


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (newlines, escape sequences, bidi
    overrides, lone surrogates) written as its escape, so that echoed input cannot forge a line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape", "backslashreplace").decode() for ch in text)


def key_step(key: Any) -> str:
    """One key of a path as it is shown: `.key` for a plain name, `["key"]` (escaped, and shortened past
    ECHO_LIMIT characters) for any other, so that a key such as `nodes[0]` or `a.b` reads as the one key it is."""
    if isinstance(key, str) and len(key) <= ECHO_LIMIT and _PLAIN_KEY.fullmatch(key):
        return f".{key}"
    quoted = shortened(printable(str(key).replace("\\", "\\\\").replace('"', '\\"')))
    return f'["{quoted}"]'


def key_path(parent: str, key: Any) -> str:
    """`parent` and one key more, e.g. `spec.nodes`, `spec.scheduling.nodeSelector["nvidia.com/gpu"]`."""
    step = key_step(key)
    return parent + step if parent else step.removeprefix(".")


def echo(value: Any, limit: int = ECHO_LIMIT) -> str:
    """`repr(value)` with credentials redacted, cut to `limit` characters so that a 100 KB value
    prints as one short line."""
    try:
        text = redact_text(printable(repr(value)))
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        text = f"an integer of {value.bit_length()} bits"
    return shortened(text, limit)


def shortened(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text`, or its first characters and its length where it is longer than `limit`."""
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"


def first_few(items: Sequence[object], shown: int = LISTED_ITEMS) -> str:
    """`a, b, c`, or past `shown` items `a, b, c, d, e and 2,995 more`, each item shortened: a list that a
    message can hold whatever its length."""
    named = ", ".join(shortened(str(item)) for item in items[:shown])
    return named if len(items) <= shown else f"{named} and {len(items) - shown:,} more"


# libyaml's parser where PyYAML was built with it: ten times faster on a 3 MiB file than the pure-Python one.
_Parser: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _JobFileLoader(_Parser):  # type: ignore[valid-type,misc]
    """SafeLoader without YAML 1.1's base-60 numbers (`1:30` stays a string, as in YAML 1.2
    and for the API server's JSON) and without implicit timestamps (kubectl keeps them strings);
    a scalar its tag cannot hold is refused with its line and column."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
            line, column = _mark(node)
            what = echo(node.value) if isinstance(node, ScalarNode) else "this value"
            raise YamlRefused(f"{what} is not a valid !!{node.tag.rsplit(':', 1)[-1]}", line, column) from None

    def construct_yaml_int(self, node: ScalarNode) -> int:
        try:
            value: int = super().construct_yaml_int(node)
        except ValueError:
            if not _DECIMAL.fullmatch(node.value):
                raise
            value = INT64_MAX + 1  # past Python's 4,300-digit limit for decimal text
        if not INT64_MIN <= value <= INT64_MAX:
            line, column = _mark(node)
            raise YamlRefused(
                f"{echo(node.value, 30)} is beyond the 64-bit integers the API server stores exactly", line, column
            )
        return value

    # kubectl's reader (go-yaml v2) takes every YAML 1.1 boolean, PyYAML all but these.
    bool_values: ClassVar[dict[str, bool]] = {**yaml.SafeLoader.bool_values, "y": True, "n": False}

    def construct_yaml_timestamp(self, node: ScalarNode) -> str:
        super().construct_yaml_timestamp(node)  # refuses a date that does not exist
        return str(node.value)


_JobFileLoader.add_constructor(_INT_TAG, _JobFileLoader.construct_yaml_int)
_JobFileLoader.add_constructor(_TIMESTAMP_TAG, _JobFileLoader.construct_yaml_timestamp)
_JobFileLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL_TAG, _INT_TAG, _FLOAT_TAG, _TIMESTAMP_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_JobFileLoader.add_implicit_resolver(
    _BOOL_TAG,
    re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"),
)
_JobFileLoader.add_implicit_resolver(
    _INT_TAG,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$", re.VERBOSE),
    list("-+0123456789"),
)
_JobFileLoader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)


def _mark(node: Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _check_graph(root: Node) -> None:
    """Depth, alias-expanded size, duplicate and boolean keys and non-finite numbers, without recursion."""
    expanded: dict[int, int] = {}
    # Iterative post-order walk: (node, depth, children_done).
    stack: list[tuple[Node, int, bool]] = [(root, 1, False)]
    on_path: set[int] = set()
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            expanded[key] = 1 + sum(expanded[id(child)] for child in children)
            if expanded[key] > MAX_EXPANDED_NODES:
                line, column = _mark(node)
                raise YamlRefused(
                    f"the document expands to more than {MAX_EXPANDED_NODES} values (aliases that repeat "
                    "aliases); write it out or make it smaller",
                    line,
                    column,
                )
            continue
        if key in expanded:
            continue
        if key in on_path:
            line, column = _mark(node)
            raise YamlRefused("a recursive alias (an anchor that contains itself)", line, column)
        if depth > MAX_DEPTH:
            line, column = _mark(node)
            raise YamlRefused(f"nested deeper than {MAX_DEPTH} levels", line, column)
        _check_node(node, root)
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in _children(node) if id(child) not in expanded)


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def _check_node(node: Node, root: Node) -> None:
    if isinstance(node, MappingNode):
        seen: set[str] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
                continue
            if key_node.tag == _BOOL_TAG:
                raise _boolean_key_refused(root, node, key_node)
            if key_node.value in seen:
                line, column = _mark(key_node)
                raise YamlRefused(
                    f"duplicate key {echo(key_node.value)} (kubectl rejects duplicate keys); keep one", line, column
                )
            seen.add(key_node.value)
    elif isinstance(node, ScalarNode) and node.tag == _FLOAT_TAG and node.value.lower().lstrip("+-") in (".inf", ".nan"):
        line, column = _mark(node)
        raise YamlRefused(
            f"{node.value} is not a number the API server accepts (JSON has no infinity or NaN)", line, column
        )


def _boolean_key_refused(root: Node, mapping: MappingNode, key: ScalarNode) -> YamlRefused:
    """A key that YAML 1.1 reads as a boolean (`n`, `yes`, `on`, `True`, ...), named where it is and as written."""
    meaning = str(_JobFileLoader.bool_values[key.value.lower()]).lower()
    line, column = _mark(key)
    return YamlRefused(
        f"{_path_to(root, mapping) or '(document)'}: the key {key.value} (unquoted) is YAML 1.1's boolean {meaning} "
        f'to kubectl, which sends it as the key "{meaning}"; quote it: "{key.value}"',
        line,
        column,
    )


def _path_to(root: Node, target: Node) -> str:
    """Where `target` sits under `root`, as key_path writes it: looked for only when a message needs it."""
    stack: list[tuple[Node, str]] = [(root, "")]
    seen: set[int] = set()
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            stack.extend((value, key_path(path, key.value if isinstance(key, ScalarNode) else "?"))
                         for key, value in node.value)
        elif isinstance(node, SequenceNode):
            stack.extend((item, f"{path}[{index}]") for index, item in enumerate(node.value))
    return ""


def read_job_file(path: str | os.PathLike[str]) -> str:
    """The text of the regular file at `path`, or YamlRefused. Anything else is refused before a byte is
    read (a FIFO with no writer would block for ever, /dev/zero never ends), and no more than
    MAX_FILE_BYTES + 1 bytes are read from a file that grows meanwhile."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise YamlRefused(f"not a regular file ({_file_kind(mode)}): give a job file")
        # O_NONBLOCK: should the path become a FIFO after the stat, the open does not wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise YamlRefused("not a regular file: give a job file")
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise YamlRefused(f"cannot read the file: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise YamlRefused(f"the file is over {MAX_FILE_BYTES // (1024 * 1024)} MiB, the API server's request limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise YamlRefused("not a text (UTF-8) file") from None


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a file")


def load_documents(text: str) -> list[Any]:
    """The non-empty documents of `text`, or YamlRefused naming the line and what to change."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise YamlRefused(f"the file is over {MAX_FILE_BYTES // (1024 * 1024)} MiB, the API server's request limit")
    documents: list[Any] = []
    loader = None
    try:
        loader = _JobFileLoader(text)
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            _check_graph(node)
            document = loader.construct_document(node)
            if document is not None:
                documents.append(document)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        # libyaml stops at 1,000 levels itself, before _check_graph sees the document.
        message = f"nested deeper than {MAX_DEPTH} levels" if "nesting depth" in problem else f"YAML syntax error: {problem}"
        raise YamlRefused(message, mark.line + 1 if mark else None, mark.column + 1 if mark else None) from None
    except RecursionError:
        raise YamlRefused(f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        if loader is not None:
            loader.dispose()
    return documents
