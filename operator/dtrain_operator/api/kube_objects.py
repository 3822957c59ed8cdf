"""The core Kubernetes objects a job passes through to its pods (volumes, mounts, tolerations, affinity, env
sources), free-form and bounded: the API server judges them, when the operator sends the job's pods as a
server-side dry run on accepting the job (core/server_check.py), and `dtrain validate --server` and `dtrain
submit` do the same with the user's credentials. Of a volume and a mount only what dtrain itself reads is
typed here: the names and the path it checks against its own (api/pod_volumes.py).

A check returns the first problem it finds as (the path below the value checked, what is wrong), which
`refusal` turns into a pydantic error that validation.format_error prints at its full path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from dtrain_operator.api import kubernetes
from dtrain_operator.api.free_form import check_free_form
from dtrain_operator.api.safe_yaml import echo

# (path below the checked value, e.g. ".persistentVolumeClaim.claimName"; what is wrong)
Problem = tuple[str, str]
# The pydantic error type of a refusal; its context carries the path below the field and the message.
FIELD_ERROR = "field_error"


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


def _strings_problem(*fields: str) -> Callable[[dict[str, Any]], Problem | None]:
    def problem(value: dict[str, Any]) -> Problem | None:
        for field in fields:
            if value.get(field) is None:
                return f".{field}", "required field is missing"
            if not isinstance(value[field], str) or not value[field]:
                return f".{field}", f"must be a non-empty string (got {echo(value[field])})"
        return None

    return problem


Volume = Annotated[KubeObject, AfterValidator(_raise_problem(_strings_problem("name")))]
VolumeMount = Annotated[KubeObject, AfterValidator(_raise_problem(_strings_problem("name", "mountPath")))]


def quantity_problem(value: Any, path: str = "") -> Problem | None:
    if kubernetes.parse_quantity(value) is None:
        return path, f"{echo(value)} is not a Kubernetes quantity: an integer or a string such as 500m, 16Gi or 1e3"
    return None


