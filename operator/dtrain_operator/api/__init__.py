"""The DistributedTraining API (`dtrain.dev/v1alpha1`): the single source of truth.

The CRD (`dtrain crd`), `dtrain validate`, the operator and the trainer all read
these models. Every field's docstring becomes its `kubectl explain` text, so it is
written for the person who types the YAML. Names follow Kubernetes conventions
(camelCase on the wire); core Kubernetes types (volumes, affinity, ...) are passed
through untouched and validated by the API server's own schemas.

This package is the API layer: it imports only pydantic, PyYAML, google-re2 (failure rules' patterns) and the
standard library, and it is the only part of dtrain_operator that the trainer and the engine builder import. The
model lives in `common`, `spec`, `failure_rules`, `scheduling`, `storage`, `artifacts`, `status` and `job`, and
is re-exported here.

The re-exports are lazy (PEP 562): a name is imported from its module when first used. The supervisor, which
starts every pod's torchrun, needs only `contract` and `launches`; importing every model first cost each start
about a quarter of a second.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtrain_operator.api.artifacts import (
        MAX_AXIS_LENGTH,
        ArtifactSettings,
        EngineLayerPrecision,
        EngineProfile,
        EngineSettings,
        ExportSettings,
        HardwareCompatibilityLevel,
        InputShapeRange,
        OnnxExport,
        PrecisionConstraints,
        ShapeList,
    )
    from dtrain_operator.api.builtin_classes import BUILTIN_IMAGE_FOLDER_DATA, BUILTIN_MODEL, BUILTIN_SYNTHETIC_DATA
    from dtrain_operator.api.common import (
        CLASS_PATH_PATTERN,
        DNS1035_PATTERN,
        ENV_NAME_PATTERN,
        FINISHED_PHASES,
        INT32_MAX,
        MAX_BATCH,
        MAX_CLASS_PATH_LENGTH,
        MAX_DURATION_SECONDS,
        MAX_ENV_NAME_LENGTH,
        MAX_ENV_VALUE_LENGTH,
        MAX_IMAGE_LENGTH,
        MAX_LABEL_VALUE_LENGTH,
        MAX_MAP_ENTRIES,
        MAX_NAME_LENGTH,
        MAX_OBJECT_NAME,
        MAX_PATH_LENGTH,
        MAX_SEED,
        MAX_TIMEOUT_SECONDS,
        ApiModel,
        EnginePrecision,
        EnvVar,
        InitArgs,
        LocalObjectReference,
        Phase,
        Precision,
        Quantity,
        Resources,
    )
    from dtrain_operator.api.failure_rules import FailureAction, FailureRule, restart_policy_rules
    from dtrain_operator.api.job import (
        ENV_VALUE_PLACEHOLDER,
        MUTABLE_RUN_POLICY_FIELDS,
        DistributedTraining,
        ObjectMeta,
        TrainerConfig,
        immutable_spec,
        with_env_values,
    )
    from dtrain_operator.api.kubernetes import QUANTITY_PATTERN
    from dtrain_operator.api.scheduling import GangProvider, GangScheduling, SchedulingSettings, TopologySettings
    from dtrain_operator.api.spec import (
        CheckpointSettings,
        ClassSpec,
        DistributedTrainingSpec,
        LoggingSettings,
        NcclDebug,
        NcclSettings,
        RunPolicy,
        StragglerSettings,
        TrainerSettings,
    )
    from dtrain_operator.api.status import (
        CheckpointInfo,
        Condition,
        DistributedTrainingStatus,
        ElasticStatus,
        Goodput,
        HangStacks,
        LastHang,
        LastRestart,
        NodeCounts,
        Preflight,
        PreflightRank,
        Progress,
        RankStepBreakdown,
        StackFrame,
        StackGroup,
        StatusModel,
        StepBreakdown,
        StepTimes,
    )
    from dtrain_operator.api.storage import CheckpointOwner, S3Settings, Storage, SurvivorMark


def _module_of_each_name() -> dict[str, str]:
    """Each re-exported name's module, read from the `TYPE_CHECKING` imports above: the one list of them."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {
        alias.name: statement.module
        for statement in block.body
        if isinstance(statement, ast.ImportFrom) and statement.module is not None
        for alias in statement.names
    }


_MODULE_OF = _module_of_each_name()


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BUILTIN_IMAGE_FOLDER_DATA",
    "BUILTIN_MODEL",
    "BUILTIN_SYNTHETIC_DATA",
    "CLASS_PATH_PATTERN",
    "DNS1035_PATTERN",
    "ENV_NAME_PATTERN",
    "ENV_VALUE_PLACEHOLDER",
    "FINISHED_PHASES",
    "INT32_MAX",
    "MAX_AXIS_LENGTH",
    "MAX_BATCH",
    "MAX_CLASS_PATH_LENGTH",
    "MAX_DURATION_SECONDS",
    "MAX_ENV_NAME_LENGTH",
    "MAX_ENV_VALUE_LENGTH",
    "MAX_IMAGE_LENGTH",
    "MAX_LABEL_VALUE_LENGTH",
    "MAX_MAP_ENTRIES",
    "MAX_NAME_LENGTH",
    "MAX_OBJECT_NAME",
    "MAX_PATH_LENGTH",
    "MAX_SEED",
    "MAX_TIMEOUT_SECONDS",
    "MUTABLE_RUN_POLICY_FIELDS",
    "QUANTITY_PATTERN",
    "ApiModel",
    "ArtifactSettings",
    "CheckpointInfo",
    "CheckpointOwner",
    "CheckpointSettings",
    "ClassSpec",
    "Condition",
    "DistributedTraining",
    "DistributedTrainingSpec",
    "DistributedTrainingStatus",
    "ElasticStatus",
    "EngineLayerPrecision",
    "EnginePrecision",
    "EngineProfile",
    "EngineSettings",
    "EnvVar",
    "ExportSettings",
    "FailureAction",
    "FailureRule",
    "GangProvider",
    "GangScheduling",
    "Goodput",
    "HangStacks",
    "HardwareCompatibilityLevel",
    "InitArgs",
    "InputShapeRange",
    "LastHang",
    "LastRestart",
    "LocalObjectReference",
    "LoggingSettings",
    "NcclDebug",
    "NcclSettings",
    "NodeCounts",
    "ObjectMeta",
    "OnnxExport",
    "Phase",
    "Precision",
    "PrecisionConstraints",
    "Preflight",
    "PreflightRank",
    "Progress",
    "Quantity",
    "RankStepBreakdown",
    "Resources",
    "RunPolicy",
    "S3Settings",
    "SchedulingSettings",
    "ShapeList",
    "StackFrame",
    "StackGroup",
    "StatusModel",
    "StepBreakdown",
    "StepTimes",
    "Storage",
    "StragglerSettings",
    "SurvivorMark",
    "TopologySettings",
    "TrainerConfig",
    "TrainerSettings",
    "immutable_spec",
    "restart_policy_rules",
    "with_env_values",
]
