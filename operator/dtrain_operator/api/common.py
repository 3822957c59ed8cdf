"""The API's building blocks: the wire conventions of every type (`ApiModel`), the bounds on
what a user may write, and the core Kubernetes-like types dtrain looks into."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic.alias_generators import to_camel

from dtrain_operator.api import contract, kubernetes
from dtrain_operator.api.free_form import check_free_form
from dtrain_operator.api.kube_objects import KubeObject, quantity_problem, refusal
from dtrain_operator.api.safe_yaml import key_step

# Free-form arguments for a user's class (LightningCLI's init_args).
InitArgs = Annotated[
    dict[str, Any],
    AfterValidator(check_free_form),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
# A resource quantity as Kubernetes writes it: 4, "500m", "16Gi". A fraction is a string ("0.5"):
# the API server takes an integer or a string here, as the CRD says.
Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": kubernetes.QUANTITY_PATTERN,
        }
    ),
]
# One GPU's memory: a Kubernetes quantity with its unit (a bare number would be bytes, never meant).
MEMORY_SIZE_PATTERN = r"^[0-9]{1,9}(\.[0-9]{1,3})?(Ki|Mi|Gi|Ti|K|M|G|T)$"
MAX_MEMORY_SIZE_LENGTH = 16
DNS1035_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Pods are named `<name>-<rank>` and must be valid DNS labels (63 characters);
# the engine Job's pods add `-engine-xxxxx`. 45 leaves room for both.
MAX_NAME_LENGTH = 45
CLASS_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

# Bounds on what a user may write. The API server estimates the worst-case cost of each CEL rule
# from the schema's maxLength/maxItems/maxProperties (an unbounded string counts as the whole 3 MiB
# request), so every string, list and map gets one; every integer gets a maximum so that no value
# that passes validation can overflow a datetime or a timedelta in the operator.
MAX_OBJECT_NAME = 253  # a DNS-1123 subdomain: Secrets, PVCs, service accounts, priority classes, schedulers
MAX_IMAGE_LENGTH = 1024
MAX_PATH_LENGTH = 4096
MAX_ENV_NAME_LENGTH = 256
MAX_ENV_VALUE_LENGTH = 32768
MAX_CLASS_PATH_LENGTH = 512
MAX_LABEL_VALUE_LENGTH = 63
MAX_MAP_ENTRIES = 64
INT32_MAX = 2**31 - 1
MAX_SEED = 2**32 - 1  # numpy's seed range, which Lightning's seed_everything uses
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600  # a week
MAX_DURATION_SECONDS = 10 * 365 * 24 * 3600  # ten years
MAX_BATCH = 65536


def _format(error: Callable[[str], str | None]) -> AfterValidator:
    """A check of a string by one of api.kubernetes' rules, with that rule's message."""

    def check(value: str) -> str:
        problem = error(value)
        if problem:
            raise ValueError(problem)
        return value

    return AfterValidator(check)


# Names that Kubernetes checks where a pod uses them. json_schema_extra gives the CRD each pattern;
# pydantic checks the rule itself, so as to say in words what is wrong.
DnsSubdomain = Annotated[
    str,
    Field(min_length=1, max_length=kubernetes.MAX_DNS1123_SUBDOMAIN_LENGTH,
          json_schema_extra={"pattern": kubernetes.DNS1123_SUBDOMAIN_PATTERN}),
    _format(kubernetes.dns_subdomain_error),
]
LabelKey = Annotated[
    str,
    Field(min_length=1, max_length=kubernetes.MAX_DNS1123_SUBDOMAIN_LENGTH + 64,
          json_schema_extra={"pattern": kubernetes.QUALIFIED_NAME_PATTERN}),
    _format(kubernetes.qualified_name_error),
]
LabelValue = Annotated[
    str,
    Field(max_length=kubernetes.MAX_LABEL_VALUE_LENGTH, json_schema_extra={"pattern": kubernetes.LABEL_VALUE_PATTERN}),
    _format(kubernetes.label_value_error),
]
ImageReference = Annotated[
    str,
    Field(min_length=1, max_length=MAX_IMAGE_LENGTH, json_schema_extra={"pattern": kubernetes.IMAGE_PATTERN}),
    _format(kubernetes.image_error),
]



def _meetable_progress_deadline(seconds: int) -> int:
    if 0 < seconds < contract.MIN_PROGRESS_DEADLINE_SECONDS:
        raise ValueError(
            f"under {contract.MIN_PROGRESS_DEADLINE_SECONDS} s, twice how often rank 0 reports progress (every "
            f"{contract.DEFAULT_PROGRESS_INTERVAL_SECONDS:g} s), the deadline runs out between the reports of a healthy "
            f"gang and restarts it until BackoffLimitExceeded: set at least {contract.MIN_PROGRESS_DEADLINE_SECONDS}, "
            "or 0 to turn it off"
        )
    return seconds


# runPolicy.progressDeadlineSeconds: 0 (off) or at least contract.MIN_PROGRESS_DEADLINE_SECONDS, in the CRD as here.
ProgressDeadlineSeconds = Annotated[
    int,
    Field(ge=0, le=MAX_TIMEOUT_SECONDS, json_schema_extra={"x-kubernetes-validations": [{
        "rule": f"self == 0 || self >= {contract.MIN_PROGRESS_DEADLINE_SECONDS}",
        "message": f"0 (off) or at least {contract.MIN_PROGRESS_DEADLINE_SECONDS}: twice how often rank 0 reports "
        "progress, so that a healthy gang is not restarted between its reports",
    }]}),
    AfterValidator(_meetable_progress_deadline),
]

Precision = Literal["64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"]
EnginePrecision = Literal["fp32", "fp16", "bf16", "int8"]
Phase = Literal[
    "Pending", "Queued", "Starting", "Running", "Restarting", "Exporting", "BuildingEngine", "Succeeded", "Failed", "Suspended"
]
FINISHED_PHASES = ("Succeeded", "Failed")


class ApiModel(BaseModel):
    """Base of every API type: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=False,
        # JSON, and so the API server, has no infinity or NaN.
        allow_inf_nan=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it is written in YAML and sent to the API server."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --- Core types that dtrain looks into ----------------------------------------------


_RESERVED_CEL_LIST = "[" + ", ".join(f"'{n}'" for n in sorted(contract.RESERVED_ENV_NAMES)) + "]"


class LocalObjectReference(ApiModel):
    """A reference to an object in the same namespace."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_OBJECT_NAME)]
    """Name of the referenced object."""


class EnvVar(ApiModel):
    """An environment variable for the trainer container (core/v1 EnvVar)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!(self.name in " + _RESERVED_CEL_LIST + ") && !self.name.startsWith('PET_') && !self.name.startsWith('DTRAIN_')", "message": 'this name is reserved: the operator sets it for torchrun and the trainer'},
        {"rule": "!self.name.matches('^(NCCL|TORCH_NCCL)_')", "message": 'NCCL variables go under spec.nccl (or spec.nccl.env)'},
    ]})

    name: Annotated[str, Field(pattern=ENV_NAME_PATTERN, min_length=1, max_length=MAX_ENV_NAME_LENGTH)]
    """Name of the variable. Names the operator sets (PET_*, DTRAIN_*, MASTER_ADDR, RANK, ...) are reserved."""
    value: Annotated[str, Field(max_length=MAX_ENV_VALUE_LENGTH)] | None = None
    """Value of the variable."""
    value_from: KubeObject | None = None
    """Source of the value (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef)."""

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if contract.is_reserved_env_name(name):
            raise ValueError(f"{name} is reserved: the operator sets it for torchrun and the trainer; remove it")
        if re.match(contract.NCCL_ENV_PATTERN, name):
            raise ValueError(f"{name} is an NCCL setting: put it under spec.nccl (or spec.nccl.env) instead")
        return name

    @model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if self.value and self.value_from is not None:
            raise refusal(".valueFrom", "may not be set when value is not empty: give one of value and valueFrom")
        return self


class Resources(ApiModel):
    """Compute resources of a container (core/v1 ResourceRequirements)."""

    limits: Annotated[dict[str, Annotated[Quantity, Field()]], Field(max_length=MAX_MAP_ENTRIES)] = Field(default_factory=dict)
    """Maximum resources, e.g. {cpu: 8, memory: 64Gi}."""
    requests: Annotated[dict[str, Annotated[Quantity, Field()]], Field(max_length=MAX_MAP_ENTRIES)] = Field(default_factory=dict)
    """Minimum resources the scheduler reserves, e.g. {cpu: 8, memory: 64Gi}."""

    @field_validator("limits", "requests")
    @classmethod
    def _quantities(cls, values: dict[str, Any]) -> dict[str, Any]:
        # The format the CRD's pattern says; the rest (names, signs, requests within limits, whole devices) is the
        # API server's, asked by the operator's dry run of the pods and the engine Job.
        for name, value in values.items():
            problem = quantity_problem(value)
            if problem:
                raise refusal(key_step(name) + problem[0], problem[1])
        return values
