"""The CRD's CEL rules as an API server sees them: compiled and run by a real CEL engine
(cel-expr-python, Google's CEL runtime), and their worst-case cost estimated the way
kube-apiserver estimates it when the CRD is created.

Kubernetes-specific CEL functions: the rules use none (no quantity(), url(), isSorted(), ...).
`test_crd_cel.py::test_rules_use_only_standard_cel_functions` keeps it so; a rule that needs one
must have it implemented here, in KUBERNETES_FUNCTIONS, and named there.

The cost estimate follows, for the constructs these rules use:
- cel-go `checker/cost.go` (the estimator kube-apiserver runs): identifiers and field selections
  cost 1, `has()` 1, literals 0, a list literal 10, `&&`/`||` the sum of both sides, a call 1 plus
  its arguments, `startsWith` ceil(0.1 x prefix length), `in` over a list its size,
  `matches` ceil(0.1 x (string length + 1)) x ceil(0.25 x regex length), `==` on strings and
  lists ceil(0.1 x the smaller maximum size), a comprehension (`all`, `exists`) the size of its
  range times the cost of one step;
- apiextensions-apiserver `pkg/apiserver/schema/cel/compilation.go` (`sizeEstimator`): the size of
  a value is its schema's maxLength / maxItems / maxProperties; without one, a string counts as
  the whole request (3 MiB - 2, `estimateMaxStringLengthPerRequest`), a list as
  (3 MiB - 2) / (smallest item + 1) items and a map as (3 MiB - 2) / (smallest value + 6) entries
  (`k8s.io/apiserver/pkg/cel/limits.go`: MaxRequestSizeBytes = 3 * 1024 * 1024); an object has
  size 0, and a map's keys are the shared StringType (size 0);
- apiextensions-apiserver `pkg/apis/apiextensions/validation/validation.go`: a rule's cost is
  its estimated cost x the most times it can be evaluated (the product of maxItems/maxProperties
  of the lists and maps above it; where one is unbounded, `MaxCardinality`: 3 MiB / (smallest
  serialized value + 1)); a rule above StaticEstimatedCostLimit = 10,000,000 is refused
  ("estimated rule cost exceeds budget by factor of ..."), and so is a CRD whose rules add up to
  more than StaticEstimatedCRDCostLimit = 100,000,000.
- At run time each evaluation may cost at most PerCallLimit = 1,000,000 and all the rules of one
  object RuntimeCELCostBudget = 10,000,000 (`k8s.io/apiserver/pkg/apis/cel/config.go`).
See also https://kubernetes.io/docs/reference/using-api/cel/#resource-constraints and
https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#resource-use-by-validation-functions
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator
from typing import Any

from cel_expr_python import cel

from tests.celast import Node, decoded_node, protobuf_fields

MAX_REQUEST_SIZE_BYTES = 3 * 1024 * 1024
STATIC_ESTIMATED_COST_LIMIT = 10_000_000
STATIC_ESTIMATED_CRD_COST_LIMIT = 100_000_000
PER_CALL_LIMIT = 1_000_000
RUNTIME_CEL_COST_BUDGET = 10_000_000
UNBOUNDED = 2**64 - 1
# Calls whose result is a scalar (bool or int): cel-go sizes those 1.
SCALAR_RESULTS = {
    "_&&_", "_||_", "!_", "_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_", "@in", "@not_strictly_false",
    "size", "matches", "startsWith", "endsWith", "contains", "int", "double",
}

# Kubernetes' CEL libraries (quantity, url, regex find, lists, authz, ...): none is used.
KUBERNETES_FUNCTIONS: dict[str, Any] = {}
# CEL's standard functions and macros (after macro expansion) that the rules may use.
STANDARD_FUNCTIONS = {
    "_&&_", "_||_", "!_", "_?_:_", "_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_", "_+_", "_-_",
    "@in", "@not_strictly_false", "_[_]", "size", "matches", "startsWith", "endsWith", "contains", "int", "double",
}


# --- The rules of a schema ---------------------------------------------------------------------


@dataclasses.dataclass
class Rule:
    """One x-kubernetes-validations rule and where it sits."""

    path: str  # e.g. spec.env[*]
    schema: dict[str, Any]  # the schema node the rule is on (its `self`)
    rule: str
    message: str
    cardinality: int | None  # most evaluations per object; None: unbounded

    @property
    def transition(self) -> bool:
        return "oldSelf" in self.rule


def _bound(schema: dict[str, Any]) -> int | None:
    if schema.get("type") == "array":
        return schema.get("maxItems")
    return schema.get("maxProperties")


def with_object_meta(schema: dict[str, Any]) -> dict[str, Any]:
    """The root schema as CEL sees it: metadata holds only name and generateName, plain strings
    (apiextensions-apiserver's WithTypeAndObjectMeta)."""
    string = {"type": "string"}
    meta = {"type": "object", "properties": {"name": string, "generateName": string}}
    return {**schema, "properties": {**schema.get("properties", {}), "metadata": meta}}


def rules(schema: dict[str, Any], path: str = "", cardinality: int | None = 1) -> Iterator[Rule]:
    """Every rule under `schema` with the number of times it may run for one object."""
    if not path:
        schema = with_object_meta(schema)
    for rule in schema.get("x-kubernetes-validations", []):
        yield Rule(path or "<root>", schema, rule["rule"], rule["message"], cardinality)
    for name, child in schema.get("properties", {}).items():
        yield from rules(child, f"{path}.{name}" if path else name, cardinality)
    for key, suffix in (("items", "[*]"), ("additionalProperties", "[*]")):
        child = schema.get(key)
        if isinstance(child, dict):
            bound = _bound(schema)
            inner = None if cardinality is None or bound is None else cardinality * bound
            yield from rules(child, path + suffix, inner)


# --- Running the rules ---------------------------------------------------------------------------


@functools.cache
def _env() -> Any:
    return cel.NewEnv(variables={"self": cel.Type.DYN, "oldSelf": cel.Type.DYN})


@functools.cache
def compile_rule(rule: str) -> Any:
    """Parse and type-check a rule (raises on a syntax or type error)."""
    return _env().compile(rule)


class RuleError(Exception):
    """The rule could not be evaluated (e.g. a field it reads is absent)."""


def evaluate(rule: str, self_value: Any, old_self: Any = None) -> bool:
    """The rule's verdict on `self` (and `oldSelf` for a transition rule)."""
    data = {"self": self_value}
    if "oldSelf" in rule:
        data["oldSelf"] = old_self
    result = compile_rule(rule).eval(data=data)
    if result.type() == cel.Type.ERROR:
        raise RuleError(str(result.value()))
    value = result.value()
    if not isinstance(value, bool):
        raise RuleError(f"the rule gave {value!r}, not a bool")
    return value


# --- The checked expression, read from its protobuf by celast.py -----------------------------


def checked_ast(rule: str) -> Node:
    """The type-checked, macro-expanded AST of a rule, as the CEL engine compiled it."""
    wrapper = protobuf_fields(compile_rule(rule).serialize())  # google.protobuf.Any: type_url 1, value 2
    checked = protobuf_fields(wrapper[2][0])  # cel.expr.CheckedExpr: expr 4
    return decoded_node(checked[4][0])


def functions(node: Node) -> set[str]:
    found = {node.name} if node.kind == "call" else set()
    children = [node.target, *node.args, *[v for v in node.comp.values() if isinstance(v, Node)]]
    for child in children:
        if child is not None:
            found |= functions(child)
    return found


# --- Sizes, as kube-apiserver's sizeEstimator gives them ---------------------------------------------


def _is_dyn(schema: dict[str, Any]) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields")) and "properties" not in schema


def min_serialized_size(schema: dict[str, Any]) -> int:
    """DeclType.MinSerializedSize (k8s.io/apiserver/pkg/cel/schemas.go)."""
    if schema.get("x-kubernetes-int-or-string") or _is_dyn(schema):
        return 1
    kind = schema.get("type")
    if kind == "string":
        return 2
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return 4
    if kind == "array":
        return 2
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return 2
    size = 2
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        if name in required and "default" not in prop:
            size += len(name) + min_serialized_size(prop) + 4
    return size


def max_elements(schema: dict[str, Any]) -> int:
    """DeclType.MaxElements: the most characters, items or entries a value of this schema may have."""
    if schema.get("x-kubernetes-int-or-string"):
        return MAX_REQUEST_SIZE_BYTES - 2
    if _is_dyn(schema):
        return UNBOUNDED  # free-form: no bound the estimator could know
    kind = schema.get("type")
    if kind == "string":
        if "maxLength" in schema:
            return schema["maxLength"]
        if "enum" in schema:
            return max(len(v) for v in schema["enum"])
        return MAX_REQUEST_SIZE_BYTES - 2
    if kind == "array":
        if "maxItems" in schema:
            return schema["maxItems"]
        return (MAX_REQUEST_SIZE_BYTES - 2) // (min_serialized_size(schema["items"]) + 1)
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        if "maxProperties" in schema:
            return schema["maxProperties"]
        return (MAX_REQUEST_SIZE_BYTES - 2) // (min_serialized_size(schema["additionalProperties"]) + 6)
    return 0  # objects, numbers, booleans


_STRING_KEY = {"type": "string", "x-dtrain-map-key": True}  # the shared StringType: MaxElements 0


def schema_at(root: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    node: dict[str, Any] | None = root
    for name in path:
        if node is None:
            return None
        if name in ("@items", "@values"):
            node = node.get("items") if node.get("type") == "array" else node.get("additionalProperties")
            node = node if isinstance(node, dict) else None
        elif name == "@keys":
            node = _STRING_KEY if isinstance(node.get("additionalProperties"), dict) else None
        else:
            node = node.get("properties", {}).get(name)
    return node


def _size_of_schema(schema: dict[str, Any] | None) -> int:
    if schema is None:
        return UNBOUNDED
    if schema is _STRING_KEY:
        return 0
    return max_elements(schema)


def _sat(value: float) -> int:
    return UNBOUNDED if value >= UNBOUNDED else int(value)


def _factor(size: int, factor: float) -> int:
    return _sat(math.ceil(size * factor))


class CostEstimator:
    """cel-go's static cost estimate (the maximum) of one rule on one schema node."""

    def __init__(self, self_schema: dict[str, Any]) -> None:
        self.self_schema = self_schema
        self.locals: dict[str, list[list[str] | None]] = {}

    def path(self, node: Node) -> list[str] | None:
        if node.kind == "ident":
            if self.locals.get(node.name):
                return self.locals[node.name][-1]
            return [] if node.name in ("self", "oldSelf") else None
        if node.kind == "select" and not node.test_only:
            base = self.path(node.target)
            return None if base is None else base + [node.name]
        return None

    def size(self, node: Node) -> int:
        if node.kind == "const":
            return len(node.literal) if isinstance(node.literal, str) else 1  # a scalar has size 1
        if node.kind == "list":
            return len(node.args)
        if node.kind == "select" and node.test_only or node.kind == "call" and node.name in SCALAR_RESULTS:
            return 1  # has(), comparisons, size(): a bool or an int
        path = self.path(node)
        if path is None:
            return UNBOUNDED
        return _size_of_schema(schema_at(self.self_schema, path))

    def is_list(self, node: Node) -> bool:
        if node.kind == "list":
            return True
        path = self.path(node)
        schema = schema_at(self.self_schema, path) if path is not None else None
        return bool(schema and schema.get("type") == "array")

    def cost(self, node: Node) -> int:
        if node.kind == "const":
            return 0
        if node.kind == "ident":
            return 1
        if node.kind == "select":
            return 1 + self.cost(node.target)  # presence test or field selection: 1 each
        if node.kind == "list":
            return 10 + sum(self.cost(a) for a in node.args)
        if node.kind == "comprehension":
            return self._comprehension(node)
        return self._call(node)

    def _comprehension(self, node: Node) -> int:
        c = node.comp
        total = self.cost(c["iter_range"]) + self.cost(c["accu_init"])
        range_path = self.path(c["iter_range"])
        sub = "@items" if self.is_list(c["iter_range"]) else "@keys"
        self.locals.setdefault(c["iter_var"], []).append(None if range_path is None else range_path + [sub])
        self.locals.setdefault(c["accu_var"], []).append(None)
        step = self.cost(c["loop_condition"]) + self.cost(c["loop_step"])
        self.locals[c["iter_var"]].pop()
        total += self.cost(c["result"])
        self.locals[c["accu_var"]].pop()
        return _sat(total + _sat(self.size(c["iter_range"]) * step))

    def _call(self, node: Node) -> int:
        args = node.args
        arg_costs = sum(self.cost(a) for a in args)
        target_cost = self.cost(node.target) if node.target is not None else 0
        name = node.name
        if name in ("_&&_", "_||_"):
            return _sat(arg_costs)
        if name == "_?_:_":
            return _sat(self.cost(args[0]) + max(self.cost(args[1]), self.cost(args[2])))
        if name in ("startsWith", "endsWith"):
            return _sat(target_cost + arg_costs + _factor(self.size(args[0]), 0.1))
        if name == "@in":
            if self.is_list(args[1]):
                return _sat(arg_costs + self.size(args[1]))
            return _sat(arg_costs + 1)
        if name == "matches":
            string = self.size(node.target) if node.target is not None else self.size(args[0])
            regex = self.size(args[0] if node.target is not None else args[1])
            return _sat(target_cost + arg_costs + _sat(_factor(_sat(string + 1), 0.1) * _factor(regex, 0.25)))
        if name == "contains":
            return _sat(target_cost + arg_costs + _sat(_factor(self.size(node.target), 0.1) * _factor(self.size(args[0]), 0.1)))
        if name in ("_==_", "_!=_"):
            return _sat(arg_costs + _factor(min(self.size(args[0]), self.size(args[1])), 0.1))
        return _sat(1 + target_cost + arg_costs)


def estimated_cost(rule: Rule) -> int:
    """The rule's MaxCost for one evaluation."""
    return CostEstimator(rule.schema).cost(checked_ast(rule.rule))


def max_cardinality(rule: Rule) -> int:
    if rule.cardinality is not None:
        return rule.cardinality
    return MAX_REQUEST_SIZE_BYTES // (min_serialized_size(rule.schema) + 1)


def total_cost(rule: Rule) -> int:
    """What kube-apiserver compares with StaticEstimatedCostLimit: cost x cardinality."""
    return _sat(estimated_cost(rule) * max_cardinality(rule))
