"""Generate the CustomResourceDefinition from the pydantic model.

The model is the single source of truth: this turns its JSON schema into a
structural OpenAPI v3 schema (refs inlined, nullable unions collapsed, no
`additionalProperties: false`), adds the CEL rules the API server enforces
at `kubectl apply`, and wraps it in an `apiextensions.k8s.io/v1` CRD. The CRD
sets no defaults (the API reference shows them): a field a job leaves unset is
filled by the operator, from the cluster's job defaults first (api.job_defaults),
then the model's; a default stored by the API server would pass for the job's
own word and hide them.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from dtrain_operator import api
from dtrain_operator.api import contract

# JSON-schema keywords a structural CRD schema accepts (besides the ones handled below).
_KEPT_KEYWORDS = (
    "type",
    "description",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "format",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
    "x-kubernetes-validations",
)
# The columns of `kubectl get dtr` after NAME; `dtrain get` prints the same ones, then LOSS and ETA.
PRINTER_COLUMNS: tuple[dict[str, str], ...] = (
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Nodes",
        "type": "string",
        "jsonPath": ".status.nodesReady",
        "description": "Running worker pods / all",
    },
    {"name": "Epoch", "type": "integer", "jsonPath": ".status.progress.epoch"},
    {"name": "Img/s", "type": "number", "jsonPath": ".status.progress.imagesPerSecond"},
    {
        "name": "Val",
        "type": "string",
        "jsonPath": ".status.progress.validation",
        "description": "The first validation metric, e.g. val_loss=0.412",
    },
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {
        "name": "Goodput",
        "type": "number",
        "jsonPath": ".status.goodput.ratio",
        "description": "Productive seconds over all of the job's (status.goodput)",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON-schema node of pydantic's output as a structural CRD schema node."""
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        # A field's own description wins over the referenced model's docstring.
        target.update({k: v for k, v in node.items() if k not in ("$ref",)})
        node = target
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        outer = {k: v for k, v in node.items() if k != "anyOf"}
        if len(branches) == 1:
            merged = dict(branches[0])
            merged.update(outer)
            return _structural(merged, defs)
        types = {b.get("type") for b in branches}
        if types <= {"integer", "number"}:
            # An integer count or a fractional number: one `number`, bounded below by the loosest branch.
            lows = [b.get("minimum", b.get("exclusiveMinimum")) for b in branches]
            merged = {"type": "number", **outer}
            if all(low is not None for low in lows):
                merged["minimum"] = min(lows)
                merged["exclusiveMinimum"] = any("exclusiveMinimum" in b for b in branches)
            highs = [b.get("maximum") for b in branches]
            if all(high is not None for high in highs):
                merged["maximum"] = max(highs)
            return _finish(merged, defs)
        raise ValueError(f"cannot express union {branches} in a structural schema")
    return _finish(dict(node), defs)


def _finish(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: node[k] for k in _KEPT_KEYWORDS if k in node}
    if "const" in node:
        out["enum"] = [node["const"]]
    if "exclusiveMinimum" in node:
        if isinstance(node["exclusiveMinimum"], bool):
            out["exclusiveMinimum"] = node["exclusiveMinimum"]
        else:  # JSON Schema 2020-12 spells it as a number; OpenAPI v3.0 as a flag on minimum.
            out["minimum"] = node["exclusiveMinimum"]
            out["exclusiveMinimum"] = True
    default = node.get("default")
    if isinstance(default, (str, int, float, bool)):
        out["default"] = default  # for the API reference; the CRD stores none (without_defaults)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return out
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {name: _structural(prop, defs) for name, prop in node["properties"].items()}
        if node.get("required"):
            out["required"] = list(node["required"])
        if node.get("additionalProperties") is True:
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(node.get("additionalProperties"), dict) or "patternProperties" in node:
        # A map. Structural schemas have no patternProperties: the key pattern becomes a CEL rule.
        patterns: dict[str, dict[str, Any]] = node.get("patternProperties", {})
        if len(patterns) > 1:
            raise ValueError(f"cannot express several key patterns {list(patterns)} in a structural schema")
        key_pattern = next(iter(patterns), None)
        values = patterns[key_pattern] if key_pattern is not None else node["additionalProperties"]
        out["type"] = "object"
        out["additionalProperties"] = _structural(values, defs)
        if key_pattern:
            out.setdefault("x-kubernetes-validations", []).append(
                {
                    "rule": f"self.all(k, k.matches({_cel_string(key_pattern)}))",
                    "message": f"every key must match {key_pattern}",
                }
            )
    if "items" in node:
        out["items"] = _structural(node["items"], defs)
    return out


def _cel_string(text: str) -> str:
    """`text` as a CEL string literal (a regex's backslashes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _unchanged(field: str) -> str:
    """CEL: the field is as it was (both absent, or both present and equal)."""
    return f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})"


def _immutability_rules(spec_schema: dict[str, Any]) -> list[dict[str, str]]:
    """Transition rules that keep the spec the operator runs (core.accepted): it records the spec at
    creation and applies no later edit, except runPolicy.suspend and ttlSecondsAfterFinished at any
    time and `scheduling` (where the pods run) while the job is suspended, as for a suspended
    Kubernetes Job, so that Kueue can place a job and resume it in one update.

    Free-form values (initArgs, volumes, affinity) are compared whole: kube-apiserver estimates `==`
    at a tenth of the smaller operand's size bound, which is 0 for an object and maxItems for a
    list, and at run time compares the fields its schema does not name as well.
    """
    rules = []
    for field in spec_schema["properties"]:
        if field == "runPolicy":
            continue
        if field == "scheduling":
            rules.append(
                {
                    "rule": f"({_unchanged(field)}) || (has(oldSelf.runPolicy) && has(oldSelf.runPolicy.suspend) "
                    "&& oldSelf.runPolicy.suspend)",
                    "message": "spec.scheduling may change only while the job is suspended: set runPolicy.suspend "
                    "to true first; the change may resume the job in the same update",
                }
            )
            continue
        rules.append(
            {
                "rule": _unchanged(field),
                "message": f"spec.{field} is immutable: delete and re-create the DistributedTraining to change it",
            }
        )
    run_policy = spec_schema["properties"]["runPolicy"]
    # The API server runs a transition rule only where the old object has the value: with
    # runPolicy defaulted to {} (its fields then take their defaults), every stored job has one,
    # so that adding runPolicy.backoffLimit to a job created without runPolicy is an edit too.
    run_policy["default"] = {}
    for field in run_policy["properties"]:
        if field in api.MUTABLE_RUN_POLICY_FIELDS:
            continue
        run_policy.setdefault("x-kubernetes-validations", []).append(
            {
                "rule": _unchanged(field),
                "message": f"spec.runPolicy.{field} is immutable (only suspend and ttlSecondsAfterFinished may change)",
            }
        )
    return rules


def without_defaults(schema: Any) -> Any:
    """`schema` without the fields' scalar defaults: the operator fills what a job leaves unset (the cluster's job
    defaults first), and a default the API server stored would pass for the job's own word."""
    if isinstance(schema, dict):
        return {key: without_defaults(value) for key, value in schema.items()
                if not (key == "default" and not isinstance(value, dict))}
    if isinstance(schema, list):
        return [without_defaults(item) for item in schema]
    return schema


def openapi_schema() -> dict[str, Any]:
    """The CRD's `openAPIV3Schema`."""
    raw = api.DistributedTraining.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    props = raw["properties"]
    spec = _structural(props["spec"], defs)
    spec.setdefault("x-kubernetes-validations", []).extend(_immutability_rules(spec))
    status = _structural(props["status"], defs)
    status["x-kubernetes-preserve-unknown-fields"] = True
    return {
        "type": "object",
        "description": api.DistributedTraining.__doc__,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.size() <= {api.MAX_NAME_LENGTH} "
                f"&& self.metadata.name.matches('{api.DNS1035_PATTERN}')",
                "message": f"metadata.name must be a DNS-1035 label of at most {api.MAX_NAME_LENGTH} characters "
                "(lowercase letters, digits, '-', starting with a letter): pods are named <name>-<rank>",
            }
        ],
    }


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{contract.PLURAL}.{contract.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "dtrain"},
        },
        "spec": {
            "group": contract.GROUP,
            "names": {
                "kind": contract.KIND,
                "listKind": f"{contract.KIND}List",
                "plural": contract.PLURAL,
                "singular": contract.SINGULAR,
                "shortNames": [contract.SHORT_NAME],
                "categories": ["dtrain"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": contract.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(column) for column in PRINTER_COLUMNS],
                    "schema": {"openAPIV3Schema": without_defaults(openapi_schema())},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `dtrain crd` from dtrain_operator/api. Do not edit: change the model and regenerate.\n"
    body: str = yaml.safe_dump(crd(), sort_keys=False, width=120)
    return header + body
