"""The API's building blocks: the wire conventions of every type (`ApiModel`), the bounds on
what a user may write, and the core Kubernetes-like types dtrain looks into."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, field_validator
from pydantic.alias_generators import to_camel

from dtrain_operator.api import contract
from dtrain_operator.api.free_form import check_free_form

# A Kubernetes object or list item whose schema the API server knows (Volume,
# Affinity, Toleration, ...). We pass it through and let the API server validate it.
KubeObject = Annotated[
    dict[str, Any],
    AfterValidator(check_free_form),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
# Free-form arguments for a user's class (LightningCLI's init_args).
InitArgs = Annotated[
    dict[str, Any],
    AfterValidator(check_free_form),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# A resource quantity as Kubernetes writes it: 4, "500m", "16Gi".
Quantity = Annotated[
    int | float | str,
    WithJsonSchema({"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}),
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

Precision = Literal["64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"]
EnginePrecision = Literal["fp32", "fp16", "bf16", "int8"]
Phase = Literal[
    "Pending", "Starting", "Running", "Restarting", "Exporting", "BuildingEngine", "Succeeded", "Failed", "Suspended"
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


class Resources(ApiModel):
    """Compute resources of a container (core/v1 ResourceRequirements)."""

    limits: Annotated[dict[str, Annotated[Quantity, Field()]], Field(max_length=MAX_MAP_ENTRIES)] = Field(default_factory=dict)
    """Maximum resources, e.g. {cpu: 8, memory: 64Gi}. GPUs (nvidia.com/gpu) are set from devicesPerNode."""
    requests: Annotated[dict[str, Annotated[Quantity, Field()]], Field(max_length=MAX_MAP_ENTRIES)] = Field(default_factory=dict)
    """Minimum resources the scheduler reserves, e.g. {cpu: 8, memory: 64Gi}."""

    @field_validator("limits", "requests")
    @classmethod
    def _quantities(cls, values: dict[str, Any]) -> dict[str, Any]:
        for key, value in values.items():
            if isinstance(value, bool) or not re.match(QUANTITY_PATTERN, str(value)):
                raise ValueError(f"{key}: {value!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
        return values


