"""The core Kubernetes objects a job passes through to its pods (volumes, mounts, tolerations,
affinity, env sources, metadata), checked as the API server checks them when it creates the pods.

Their shapes (types, required and unknown fields) come from Kubernetes' own schemas
(kubernetes_schemas.json, generated from kubernetes-validate by tools/generate_manifests.py); what a
schema cannot say (one volume source, supported fieldRef paths, toleration operators) is ported
from k8s.io/kubernetes/pkg/apis/core/validation. A check returns the first problem it finds as
(the path below the value checked, what is wrong), which `refusal` turns into a pydantic error
that validation.format_error prints at its full path.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any

from pydantic import AfterValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from dtrain_operator.api import kubernetes
from dtrain_operator.api.free_form import check_free_form
from dtrain_operator.api.safe_yaml import echo, key_step

# (path below the checked value, e.g. ".persistentVolumeClaim.claimName"; what is wrong)
Problem = tuple[str, str]
# The pydantic error type of a refusal; its context carries the path below the field and the message.
FIELD_ERROR = "field_error"

_QUANTITY_DEFINITION = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict, "array": list, "string": str, "boolean": bool, "null": type(None), "number": (int, float),
    "integer": int,
}
_ARTICLES = {"object": "an object", "array": "a list", "string": "a string", "boolean": "true or false",
             "number": "a number", "integer": "an integer"}
_INTEGER_BITS = {"int32": 31, "int64": 63}


def refusal(path: str, message: str) -> PydanticCustomError:
    """A validation error `message` about the value at `path` below the field being validated."""
    return PydanticCustomError(FIELD_ERROR, "{path}: {message}", {"path": path, "message": message})


def _raise_problem(check: Callable[[dict[str, Any]], Problem | None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def validate(value: dict[str, Any]) -> dict[str, Any]:
        problem = check(value)
        if problem is not None:
            raise refusal(*problem)
        return value

    return validate


# A core Kubernetes object passed through to the pods, bounded as free-form values are. The CRD keeps
# it free-form: its full schema would outgrow the CRD's size and CEL-cost limits.
KubeObject = Annotated[
    dict[str, Any],
    AfterValidator(check_free_form),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


# --- Kubernetes' schemas ---------------------------------------------------------------------------


@functools.cache
def _definitions() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("kubernetes_schemas.json").read_text(encoding="utf-8")
    definitions: dict[str, Any] = json.loads(text)["definitions"]
    return definitions


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind != "boolean":
        return False
    return isinstance(value, _JSON_TYPES[kind])


def schema_problem(value: Any, schema: dict[str, Any], path: str = "") -> Problem | None:
    """The first place where `value` does not fit a Kubernetes schema: a type, a required or unknown field."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name == _QUANTITY_DEFINITION:
            return quantity_problem(value, path) if value is not None else None
        return schema_problem(value, _definitions()[name], path)
    if "oneOf" in schema:
        if all(schema_problem(value, branch, path) for branch in schema["oneOf"]):
            return path, f"must be an integer or a string (got {echo(value)})"
        return None
    kinds = [schema["type"]] if isinstance(schema.get("type"), str) else schema.get("type", [])
    if kinds and not any(_is(value, kind) for kind in kinds):
        wanted = " or ".join(_ARTICLES[kind] for kind in kinds if kind != "null")
        return path, f"must be {wanted} (got {echo(value)})"
    bits = _INTEGER_BITS.get(schema.get("format", ""))
    if bits and _is(value, "integer") and not -(2**bits) <= value < 2**bits:
        return path, f"{echo(value)} does not fit in {bits + 1} bits"
    if isinstance(value, dict):
        return _object_problem(value, schema, path)
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problem = schema_problem(item, schema["items"], f"{path}[{index}]")
            if problem:
                return problem
    return None


def _object_problem(value: dict[str, Any], schema: dict[str, Any], path: str) -> Problem | None:
    properties: dict[str, Any] = schema.get("properties", {})
    for key in schema.get("required", []):
        if value.get(key) is None:
            return path + key_step(key), "required field is missing"
    extra = schema.get("additionalProperties")
    for key, child in value.items():
        if key in properties:
            problem = schema_problem(child, properties[key], path + key_step(key))
        elif isinstance(extra, dict):
            problem = schema_problem(child, extra, path + key_step(key))
        elif extra is False or properties:
            hint = difflib.get_close_matches(str(key), list(properties), n=1)
            return path + key_step(key), "unknown field" + (f"; did you mean '{hint[0]}'?" if hint else "")
        else:
            problem = None
        if problem:
            return problem
    return None


def _schema_check(definition: str) -> Callable[[dict[str, Any]], Problem | None]:
    return lambda value: schema_problem(value, {"$ref": definition})


def quantity_problem(value: Any, path: str = "") -> Problem | None:
    if kubernetes.parse_quantity(value) is None:
        return path, f"{echo(value)} is not a Kubernetes quantity: an integer or a string such as 500m, 16Gi or 1e3"
    return None


# --- Rules no schema can say ------------------------------------------------------------------------


def _one_of(value: dict[str, Any], fields: list[str], what: str) -> str | None:
    given = [field for field in fields if value.get(field) is not None]
    if not given:
        return f"must set one {what}: {', '.join(fields)}"
    if len(given) > 1:
        return f"sets {' and '.join(given)}: one {what} only"
    return None


def volume_problem(volume: dict[str, Any]) -> Problem | None:
    problem = _schema_check("io.k8s.api.core.v1.Volume")(volume)
    if problem:
        return problem
    error = kubernetes.dns_label_error(volume["name"])
    if error:
        return ".name", f"{echo(volume['name'])} {error}"
    sources = [name for name in _definitions()["io.k8s.api.core.v1.Volume"]["properties"] if name != "name"]
    error = _one_of(volume, sources, "volume source")
    return ("", error) if error else None


def volume_mount_problem(mount: dict[str, Any]) -> Problem | None:
    problem = _schema_check("io.k8s.api.core.v1.VolumeMount")(mount)
    if problem:
        return problem
    for field in ("subPath", "subPathExpr"):
        sub = mount.get(field) or ""
        if sub.startswith("/") or ".." in sub.split("/"):
            return f".{field}", f"{echo(sub)} must be a relative path inside the volume, without '..'"
    return None


_TOLERATION_OPERATORS = ("Exists", "Equal")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def toleration_problem(toleration: dict[str, Any]) -> Problem | None:
    problem = _schema_check("io.k8s.api.core.v1.Toleration")(toleration)
    if problem:
        return problem
    key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
    value, effect = toleration.get("value") or "", toleration.get("effect") or ""
    error = kubernetes.qualified_name_error(key) if key else None
    if error:
        return ".key", f"{echo(key)} {error}"
    if operator not in _TOLERATION_OPERATORS:
        return ".operator", f"{echo(operator)} is not allowed; use one of {', '.join(_TOLERATION_OPERATORS)}"
    if not key and operator != "Exists":
        return ".operator", "must be Exists when key is empty (which matches every taint)"
    if operator == "Exists" and value:
        return ".value", "must be empty when operator is Exists"
    error = kubernetes.label_value_error(value)
    if error:
        return ".value", f"{echo(value)} {error}"
    if effect and effect not in _TAINT_EFFECTS:
        return ".effect", f"{echo(effect)} is not allowed; use one of {', '.join(_TAINT_EFFECTS)}"
    if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
        return ".effect", "must be NoExecute when tolerationSeconds is set"
    return None


_NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def _requirement_problem(requirement: dict[str, Any], operators: tuple[str, ...]) -> Problem | None:
    operator, values = requirement["operator"], requirement.get("values") or []
    if operator not in operators:
        return ".operator", f"{echo(operator)} is not allowed; use one of {', '.join(operators)}"
    if operator in ("In", "NotIn") and not values:
        return ".values", f"must list at least one value for operator {operator}"
    if operator in ("Exists", "DoesNotExist") and values:
        return ".values", f"must be empty for operator {operator}"
    if operator in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"-?[0-9]+", values[0])):
        return ".values", f"must be one integer for operator {operator}"
    error = kubernetes.qualified_name_error(requirement["key"])
    return (".key", f"{echo(requirement['key'])} {error}") if error else None


def _requirements(node: Any, path: str, fields: tuple[str, ...]) -> list[tuple[dict[str, Any], str]]:
    """Every requirement (a dict under one of `fields`) below `node`, with its path."""
    found: list[tuple[dict[str, Any], str]] = []
    if isinstance(node, dict):
        for key, child in node.items():
            child_path = path + key_step(key)
            if key in fields and isinstance(child, list):
                found.extend((item, f"{child_path}[{i}]") for i, item in enumerate(child))
            else:
                found.extend(_requirements(child, child_path, fields))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found.extend(_requirements(item, f"{path}[{index}]", fields))
    return found


def affinity_problem(affinity: dict[str, Any]) -> Problem | None:
    problem = _schema_check("io.k8s.api.core.v1.Affinity")(affinity)
    if problem:
        return problem
    checks = (
        (("matchExpressions", "matchFields"), _NODE_OPERATORS, "nodeAffinity"),
        (("matchExpressions",), _LABEL_OPERATORS, "podAffinity"),
        (("matchExpressions",), _LABEL_OPERATORS, "podAntiAffinity"),
    )
    for fields, operators, section in checks:
        for requirement, path in _requirements(affinity.get(section), f".{section}", fields):
            problem = _requirement_problem(requirement, operators)
            if problem:
                return path + problem[0], problem[1]
    for term, path in _requirements(affinity, "", ("preferredDuringSchedulingIgnoredDuringExecution",)):
        if not 1 <= term["weight"] <= 100:
            return f"{path}.weight", f"{echo(term['weight'])} must be between 1 and 100"
    node = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if node is not None and not node["nodeSelectorTerms"]:
        return ".nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", "must hold a term"
    for section in ("podAffinity", "podAntiAffinity"):
        terms = _requirements(affinity.get(section), f".{section}", ("requiredDuringSchedulingIgnoredDuringExecution",))
        weighted = _requirements(affinity.get(section), f".{section}", ("preferredDuringSchedulingIgnoredDuringExecution",))
        terms += [(term["podAffinityTerm"], f"{path}.podAffinityTerm") for term, path in weighted]
        for term, path in terms:
            if not term.get("topologyKey"):
                return f"{path}.topologyKey", "required field is missing"
    return None


# The pod fields an env variable may read (the downward API's supported paths for env).
_ENV_FIELD_PATHS = (
    "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
    "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs",
)
_ENV_FIELD_KEYED = re.compile(r"metadata\.(labels|annotations)\['(.*)'\]")
_ENV_RESOURCES = tuple(f"{kind}.{name}" for kind in ("limits", "requests") for name in ("cpu", "memory", "ephemeral-storage"))
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")


def env_source_problem(source: dict[str, Any]) -> Problem | None:
    problem = _schema_check("io.k8s.api.core.v1.EnvVarSource")(source)
    if problem:
        return problem
    error = _one_of(source, list(_definitions()["io.k8s.api.core.v1.EnvVarSource"]["properties"]), "source")
    if error:
        return "", error
    field_ref, resource_ref = source.get("fieldRef"), source.get("resourceFieldRef")
    if field_ref is not None:
        return _field_ref_problem(field_ref)
    if resource_ref is not None:
        resource = resource_ref["resource"]
        if resource not in _ENV_RESOURCES and not resource.startswith(("limits.hugepages-", "requests.hugepages-")):
            return ".resourceFieldRef.resource", f"{echo(resource)} is not supported; use one of {', '.join(_ENV_RESOURCES)}"
        return None
    for ref in ("secretKeyRef", "configMapKeyRef"):
        selector = source.get(ref)
        if selector is not None:
            error = kubernetes.dns_subdomain_error(selector.get("name") or "")
            if error:
                return f".{ref}.name", f"{echo(selector.get('name') or '')} {error}"
            if not _CONFIG_KEY.fullmatch(selector["key"]):
                return f".{ref}.key", f"{echo(selector['key'])} must be letters, digits, '-', '_' and '.'"
    return None


def _field_ref_problem(field_ref: dict[str, Any]) -> Problem | None:
    if field_ref.get("apiVersion") not in (None, "v1"):
        return ".fieldRef.apiVersion", f"{echo(field_ref['apiVersion'])} is not supported; use v1"
    path = field_ref["fieldPath"]
    keyed = _ENV_FIELD_KEYED.fullmatch(path)
    if keyed:
        # As the API server (validateObjectFieldSelector): an annotation's key is checked lower-cased, a label's as is.
        kind, key = keyed.groups()
        error = kubernetes.qualified_name_error(key.lower() if kind == "annotations" else key)
        return (".fieldRef.fieldPath", f"{echo(path)}: the key {error}") if error else None
    if path not in _ENV_FIELD_PATHS:
        supported = ", ".join((*_ENV_FIELD_PATHS, "metadata.labels['KEY']", "metadata.annotations['KEY']"))
        return ".fieldRef.fieldPath", f"{echo(path)} is not supported; use one of {supported}"
    return None


def metadata_problem(metadata: dict[str, Any]) -> Problem | None:
    """An object's metadata as the API server checks it: types, namespace, label and annotation keys."""
    problem = _schema_check("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")(metadata)
    if problem:
        return problem
    namespace = metadata.get("namespace")
    error = kubernetes.dns_label_error(namespace) if namespace else None
    if error:
        return ".namespace", f"{echo(namespace)} {error}"
    for key, value in (metadata.get("labels") or {}).items():
        error = kubernetes.qualified_name_error(key)
        if error:
            return ".labels" + key_step(key), f"the key {error}"
        error = kubernetes.label_value_error(value or "")
        if error:
            return ".labels" + key_step(key), f"{echo(value)} {error}"
    annotations = metadata.get("annotations") or {}
    for key in annotations:
        error = kubernetes.qualified_name_error(key.lower())
        if error:
            return ".annotations" + key_step(key), f"the key {error}"
    size = kubernetes.annotations_bytes(annotations)
    if size > kubernetes.MAX_ANNOTATIONS_BYTES:
        return ".annotations", f"hold {size} bytes; the API server takes at most {kubernetes.MAX_ANNOTATIONS_BYTES}"
    return None


Volume = Annotated[KubeObject, AfterValidator(_raise_problem(volume_problem))]
VolumeMount = Annotated[KubeObject, AfterValidator(_raise_problem(volume_mount_problem))]
Toleration = Annotated[KubeObject, AfterValidator(_raise_problem(toleration_problem))]
Affinity = Annotated[KubeObject, AfterValidator(_raise_problem(affinity_problem))]
EnvVarSource = Annotated[KubeObject, AfterValidator(_raise_problem(env_source_problem))]
