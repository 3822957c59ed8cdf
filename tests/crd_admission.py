"""What kube-apiserver does to a custom resource before it stores it, for the unit tests of the
CRD's rules (tests/unit/test_crd_cel.py): prune or refuse unknown fields, fill in defaults, check
the structural schema, then run the CRD's CEL rules (x-kubernetes-validations, with oldSelf on
update) with a real CEL engine (tests/celrules.py). A refused object raises `Refused`: 400
BadRequest for an unknown field under strict field validation, 422 Invalid with the API server's
message shape otherwise:

    DistributedTraining.dtrain.dev "job" is invalid: spec.engine: Invalid value: "object": need minBatch <= ...

The real API server's refusals of the same rules are `make e2e`'s `crd-refusals` scenario
(tests/cluster/scenarios/crd_refusals.py): the create-time ones over the whole table of bad specs, the
transition rules over a few edits; this module runs every rule, on create and on update, in
the unit tests' time.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

from tests import celrules


class Refused(Exception):
    """The API server's refusal of an object: its HTTP status, reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclasses.dataclass
class Cause:
    field: str
    type: str  # FieldValueInvalid, FieldValueRequired, ...
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _go_search(pattern: str, value: str) -> bool:
    """re.search with Go's `$` (the API server's): the end of the text, not also the place before a
    final newline, so that "16Gi\\n" fails a quantity's pattern here as it does there."""
    return re.search(re.sub(r"(?<!\\)\$", r"\\Z", pattern), value) is not None


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return f'"{_json_type(value)}"'
    return str(value)


def _type_ok(schema: dict[str, Any], value: Any) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    kind = schema.get("type")
    actual = _json_type(value)
    if kind is None:
        return True
    if kind == "number":
        return actual in ("number", "integer")
    return actual == kind


class StructuralSchema:
    """Pruning, defaulting and OpenAPI validation of one structural schema."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema

    def prune(self, value: Any, schema: dict[str, Any] | None = None, path: str = "") -> list[str]:
        """Drop fields the schema does not declare (in place); returns their paths."""
        schema = self.schema if schema is None else schema
        dropped: list[str] = []
        if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
            return dropped
        if isinstance(value, dict) and schema.get("type") == "object":
            props = schema.get("properties")
            extra = schema.get("additionalProperties")
            for key in list(value):
                child_path = f"{path}.{key}" if path else key
                if not path and key == "metadata":
                    continue  # ObjectMeta: the API server's own schema, not the CRD's
                if props is not None and key in props:
                    dropped += self.prune(value[key], props[key], child_path)
                elif isinstance(extra, dict):
                    dropped += self.prune(value[key], extra, child_path)
                elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                    del value[key]
                    dropped.append(child_path)
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for index, item in enumerate(value):
                dropped += self.prune(item, schema["items"], f"{path}[{index}]")
        return dropped

    def default(self, value: Any, schema: dict[str, Any] | None = None) -> None:
        """Fill in `default` of absent properties of the objects present (in place)."""
        schema = self.schema if schema is None else schema
        if isinstance(value, dict):
            for key, prop in (schema.get("properties") or {}).items():
                if key not in value and "default" in prop:
                    value[key] = copy.deepcopy(prop["default"])
                if key in value:
                    self.default(value[key], prop)
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                for item in value.values():
                    self.default(item, extra)
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for item in value:
                self.default(item, schema["items"])

    def validate(self, value: Any, schema: dict[str, Any] | None = None, path: str = "") -> list[Cause]:
        schema = self.schema if schema is None else schema
        if not _type_ok(schema, value):
            kind = schema.get("type") or "integer or string"
            return [Cause(path, "FieldValueTypeInvalid",
                          f'Invalid value: "{_json_type(value)}": {path} in body must be of type {kind}: "{_json_type(value)}"')]
        causes: list[Cause] = []
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(_shown(v) for v in schema["enum"])
            causes.append(Cause(path, "FieldValueNotSupported", f"Unsupported value: {_shown(value)}: supported values: {allowed}"))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            low, high = schema.get("minimum"), schema.get("maximum")
            if low is not None and (value <= low if schema.get("exclusiveMinimum") else value < low):
                word = "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
                causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {_shown(value)}: {path} in body should be {word} {low}"))
            if high is not None and value > high:
                causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {_shown(value)}: {path} in body should be less than or equal to {high}"))
        if isinstance(value, str):
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                causes.append(Cause(path, "FieldValueTooLong", f"Too long: may not be more than {schema['maxLength']} bytes"))
            if "minLength" in schema and len(value) < schema["minLength"]:
                causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {_shown(value)}: {path} in body should be at least {schema['minLength']} chars long"))
            if "pattern" in schema and not _go_search(schema["pattern"], value):
                causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {_shown(value)}: {path} in body should match '{schema['pattern']}'"))
        if isinstance(value, list):
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                causes.append(Cause(path, "FieldValueTooMany", f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
            if "minItems" in schema and len(value) < schema["minItems"]:
                causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {len(value)}: {path} in body should have at least {schema['minItems']} items"))
            if isinstance(schema.get("items"), dict):
                for index, item in enumerate(value):
                    causes += self.validate(item, schema["items"], f"{path}[{index}]")
        if isinstance(value, dict) and schema.get("type") == "object":
            if "maxProperties" in schema and len(value) > schema["maxProperties"]:
                causes.append(Cause(path, "FieldValueTooMany", f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"))
            for key in schema.get("required", []):
                if key not in value:
                    causes.append(Cause(f"{path}.{key}" if path else key, "FieldValueRequired", "Required value"))
            for key, prop in (schema.get("properties") or {}).items():
                if key in value and not (not path and key == "metadata"):
                    causes += self.validate(value[key], prop, f"{path}.{key}" if path else key)
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                for key, item in value.items():
                    causes += self.validate(item, extra, f"{path}[{key}]")
        return causes


def cel_value(schema: dict[str, Any], value: Any) -> Any:
    """The value as CEL sees it: a `number` field is a double even when written as 1."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        return {k: cel_value(props.get(k) or (extra if isinstance(extra, dict) else {}), v) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [cel_value(schema["items"], v) for v in value]
    return value


def cel_causes(schema: dict[str, Any], value: Any, old: Any = None, path: str = "",
               transitions: bool = True) -> list[Cause]:
    """Run every x-kubernetes-validations rule on the value it applies to (oldSelf where the
    old object has that value; transition rules are skipped where it does not)."""
    causes: list[Cause] = []
    for rule in schema.get("x-kubernetes-validations", []):
        uses_old = "oldSelf" in rule["rule"]
        if uses_old and (old is None or not transitions):
            continue
        try:
            ok = celrules.evaluate(rule["rule"], cel_value(schema, value), cel_value(schema, old))
        except celrules.RuleError as error:
            # apiextensions-apiserver's schema/cel/validation.go: "%v evaluating rule: %v", the error and the
            # rule's message.
            causes.append(Cause(path or "<nil>", "FieldValueInvalid",
                                f"Invalid value: \"{_json_type(value)}\": {error} evaluating rule: {rule['message']}"))
            continue
        if not ok:
            causes.append(Cause(path or "<nil>", "FieldValueInvalid", f'Invalid value: "{_json_type(value)}": {rule["message"]}'))
    if isinstance(value, dict):
        for key, prop in (schema.get("properties") or {}).items():
            if key in value:
                child_old = old.get(key) if isinstance(old, dict) else None
                causes += cel_causes(prop, value[key], child_old, f"{path}.{key}" if path else key, transitions)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                child_old = old.get(key) if isinstance(old, dict) else None
                causes += cel_causes(extra, item, child_old, f"{path}[{key}]", transitions)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        # Only x-kubernetes-list-type: map lists correlate items with oldSelf; none here.
        for index, item in enumerate(value):
            causes += cel_causes(schema["items"], item, None, f"{path}[{index}]", transitions)
    return causes


class CrdAdmission:
    """Create and update of one custom resource, checked as kube-apiserver checks them."""

    def __init__(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        [version] = [v for v in spec["versions"] if v.get("storage")]
        self.group = spec["group"]
        self.kind = spec["names"]["kind"]
        self.schema = version["schema"]["openAPIV3Schema"]
        self.structural = StructuralSchema(self.schema)

    def check(self, obj: dict[str, Any], old: dict[str, Any] | None = None,
              field_validation: str = "Strict") -> dict[str, Any]:
        """The object as it would be stored, or Refused (400 or 422). `field_validation` as the
        request's parameter: Strict (kubectl apply's) refuses unknown fields, Ignore drops them."""
        new = copy.deepcopy(obj)
        name = (new.get("metadata") or {}).get("name", "")
        dropped = self.structural.prune(new)
        if dropped and field_validation == "Strict":
            raise Refused(
                400, "BadRequest",
                "strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in dropped),
            )
        self.structural.default(new)
        causes = self.structural.validate(new)
        if not causes:
            causes = cel_causes(celrules.with_object_meta(self.schema), new, old)
        if causes:
            raise self.invalid(name, causes)
        return new

    def invalid(self, name: str, causes: list[Cause]) -> Refused:
        listed = str(causes[0]) if len(causes) == 1 else "[" + ", ".join(str(c) for c in causes) + "]"
        return Refused(422, "Invalid", f'{self.kind}.{self.group} "{name}" is invalid: {listed}')
