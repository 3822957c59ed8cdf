"""A CEL rule's checked expression read from its protobuf (cel/expr/checked.proto and syntax.proto), for
tests/celrules.py's cost estimate: the wire format decoded by hand, as the CEL engine gives no other view
of the type-checked, macro-expanded AST."""

from __future__ import annotations

import dataclasses
from typing import Any


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def protobuf_fields(data: bytes) -> dict[int, list[Any]]:
    """A protobuf message as {field number: [values]} (varints as int, the rest as bytes)."""
    out: dict[int, list[Any]] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


@dataclasses.dataclass
class Node:
    """One cel.expr.Expr (cel/expr/syntax.proto): kind is const, ident, select, call, list or comprehension."""

    kind: str
    name: str = ""  # ident name, selected field, function name
    test_only: bool = False
    target: Node | None = None
    args: list[Node] = dataclasses.field(default_factory=list)
    literal: Any = None
    comp: dict[str, Any] = dataclasses.field(default_factory=dict)


def _string(fields: dict[int, list[Any]], number: int) -> str:
    return fields[number][0].decode() if number in fields else ""


def decoded_node(data: bytes) -> Node:
    f = protobuf_fields(data)
    if 3 in f:  # const_expr: null 1, bool 2, int64 3, uint64 4, double 5, string 6, bytes 7
        c = protobuf_fields(f[3][0])
        if 6 in c:
            return Node("const", literal=c[6][0].decode())
        if 2 in c:
            return Node("const", literal=bool(c[2][0]))
        if 3 in c:
            value = c[3][0]
            return Node("const", literal=value - 2**64 if value >= 2**63 else value)
        return Node("const", literal=None)
    if 4 in f:  # ident_expr: name 1
        return Node("ident", name=_string(protobuf_fields(f[4][0]), 1))
    if 5 in f:  # select_expr: operand 1, field 2, test_only 3
        s = protobuf_fields(f[5][0])
        return Node("select", name=_string(s, 2), test_only=bool(s.get(3, [0])[0]), target=decoded_node(s[1][0]))
    if 6 in f:  # call_expr: target 1, function 2, args 3
        c = protobuf_fields(f[6][0])
        return Node(
            "call",
            name=_string(c, 2),
            target=decoded_node(c[1][0]) if 1 in c else None,
            args=[decoded_node(a) for a in c.get(3, [])],
        )
    if 7 in f:  # list_expr: elements 1
        return Node("list", args=[decoded_node(e) for e in protobuf_fields(f[7][0]).get(1, [])])
    if 9 in f:  # comprehension_expr
        c = protobuf_fields(f[9][0])
        return Node(
            "comprehension",
            comp={
                "iter_var": _string(c, 1),
                "iter_range": decoded_node(c[2][0]),
                "accu_var": _string(c, 3),
                "accu_init": decoded_node(c[4][0]),
                "loop_condition": decoded_node(c[5][0]),
                "loop_step": decoded_node(c[6][0]),
                "result": decoded_node(c[7][0]),
            },
        )
    raise ValueError(f"an expression kind this estimator does not know: fields {sorted(f)}")
