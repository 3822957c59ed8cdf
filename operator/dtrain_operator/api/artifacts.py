"""What is built from the trained model: the artifacts directory, the ONNX export and the TensorRT engine."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from dtrain_operator.api import contract
from dtrain_operator.api.common import (
    MAX_BATCH,
    MAX_MAP_ENTRIES,
    MAX_OBJECT_NAME,
    MAX_PATH_LENGTH,
    ApiModel,
    EnginePrecision,
    ImageReference,
    Resources,
)
from dtrain_operator.api.kube_objects import refusal
from dtrain_operator.api.safe_yaml import key_step
from dtrain_operator.api.storage import StorageDir


class ArtifactSettings(ApiModel):
    """Where the exported model and the engine go."""

    dir: StorageDir | None = None
    """Directory for model.onnx, artifacts.json, the TensorRT engine and its report: an absolute path on a volume the engine Job mounts too, or s3://bucket/prefix or gs://bucket/prefix (default: <spec.storage.url or mountPath>/<namespace>/<name>/artifacts)."""


class OnnxExport(ApiModel):
    """ONNX export by rank 0 at the end of training."""

    enabled: bool = True
    """Export model.onnx and check it with ONNX Runtime."""
    opset: Annotated[int, Field(ge=17, le=23)] = 17
    """ONNX opset version (17 or newer)."""
    dynamic_batch: bool = True
    """Make the batch axis dynamic, so that the engine can be built for a range of batch sizes."""
    input_shape: Annotated[list[Annotated[int, Field(ge=1, le=MAX_BATCH)]], Field(min_length=1, max_length=4)] | None = None
    """Shape of one sample without the batch axis, e.g. [3, 224, 224], for a model without example_input_array (which is used first: a tensor, tuple or dict, dtypes kept). Default: the data module's sample_shape."""
    input_dtype: Literal["float32", "float16", "bfloat16", "int64", "int32", "bool"] = "float32"
    """Data type of the input given by inputShape, e.g. int64 for a text model's token ids."""


class ExportSettings(ApiModel):
    """Exports written at the end of training."""

    onnx: OnnxExport = Field(default_factory=OnnxExport)
    """ONNX export."""


@dataclass(frozen=True)
class BuildFlag:
    """Marks a spec.engine field as a `dtrain build-engine` option (api.engine_options writes, adds and
    reads the flags); pydantic keeps it in the field's metadata and leaves it out of the schema."""

    name: str | None = None  # default: the field's name as --kebab-case


DEFAULT_MIN_BATCH = 1
DEFAULT_MAX_BATCH = 32
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH)]
EngineLayerPrecision = Literal["fp32", "fp16", "bf16"]
HardwareCompatibilityLevel = Literal["none", "ampere+", "same-compute-capability"]
PrecisionConstraints = Literal["none", "prefer", "obey"]
# An axis as long as 16 Mi elements: long enough for any sequence length a GPU holds.
MAX_AXIS_LENGTH = 2**24
MAX_RANK = 8
ShapeList = Annotated[list[Annotated[int, Field(ge=1, le=MAX_AXIS_LENGTH)]], Field(min_length=1, max_length=MAX_RANK)]
# A name as `dtrain build-engine` reads it in its NAME:VALUE lists (--min-shapes images:1x3x224x224,mask:1x224,
# --layer-precisions fc1:fp16,fc*:fp32; trtexec's syntax): ',' separates the items, each loses its spaces at either
# end, and the last ':' ends the name, so that ONNX names such as `input:0` pass. No ',', no space at either end.
LISTED_NAME_PATTERN = r"^[^,\s]([^,]*[^,\s])?$"


def _listable_layer_pattern(pattern: str) -> str:
    if not re.fullmatch(LISTED_NAME_PATTERN, pattern):
        raise ValueError(
            "cannot be passed to dtrain build-engine, whose --layer-precisions list separates NAME:PRECISION pairs "
            "with ',' and trims each: give a pattern that is not empty, and match a ',' or a space at either end "
            "with '?' (e.g. fc1?fc2)"
        )
    return pattern


# A layer name or * pattern of spec.engine.layerPrecisions: the CRD carries the pattern, the model says the way out.
LayerPattern = Annotated[
    str,
    Field(max_length=MAX_OBJECT_NAME, json_schema_extra={"pattern": LISTED_NAME_PATTERN}),
    AfterValidator(_listable_layer_pattern),
]


class InputShapeRange(ApiModel):
    """The shapes one input takes in an optimisation profile (trtexec --minShapes/--optShapes/--maxShapes)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.min.size() == self.opt.size() && self.opt.size() == self.max.size() && [" + ", ".join(map(str, range(MAX_RANK))) + "].all(i, i >= self.min.size() || (self.min[i] <= self.opt[i] && self.opt[i] <= self.max[i]))", "message": "min, opt and max need the same rank and min <= opt <= max on every axis"},
    ]})

    min: ShapeList
    """Smallest shape, every axis, e.g. [1, 3, 224, 224]."""
    opt: ShapeList
    """Shape TensorRT tunes for."""
    max: ShapeList
    """Largest shape."""

    @model_validator(mode="after")
    def _ordered(self) -> InputShapeRange:
        if not len(self.min) == len(self.opt) == len(self.max):
            raise ValueError(f"min, opt and max have ranks {len(self.min)}, {len(self.opt)} and {len(self.max)}: "
                             "give every axis of the input in each")
        if not all(low <= opt <= high for low, opt, high in zip(self.min, self.opt, self.max)):
            raise ValueError(f"needs min <= opt <= max on every axis, got {self.min}, {self.opt}, {self.max}")
        return self


class EngineProfile(ApiModel):
    """One optimisation profile: a shape range for each input with a dynamic axis."""

    inputs: Annotated[
        dict[Annotated[str, Field(max_length=MAX_OBJECT_NAME, pattern=LISTED_NAME_PATTERN)], InputShapeRange],
        Field(min_length=1, max_length=MAX_MAP_ENTRIES),
    ]
    """Shape ranges by input name (the ONNX model's input names; no ',' and no space at either end)."""


class EngineSettings(ApiModel):
    """The follow-up Job that builds a TensorRT engine from model.onnx. The fields marked BuildFlag are
    `dtrain build-engine`'s options too, declared here once (api.engine_options)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        # The CRD stores no defaults (api.crd): an absent bound is its default here.
        {"rule": f'(has(self.minBatch) ? self.minBatch : {DEFAULT_MIN_BATCH}) <= (has(self.maxBatch) ? self.maxBatch : {DEFAULT_MAX_BATCH}) && (!has(self.optBatch) || ((has(self.minBatch) ? self.minBatch : {DEFAULT_MIN_BATCH}) <= self.optBatch && self.optBatch <= (has(self.maxBatch) ? self.maxBatch : {DEFAULT_MAX_BATCH})))', "message": 'need minBatch <= optBatch <= maxBatch'},
    ]})

    enabled: bool = True
    """Build the engine after training succeeds."""
    image: ImageReference = contract.DEFAULT_ENGINE_IMAGE
    """A TensorRT-capable image with dtrain's `tensorrt` extra installed."""
    precision: Annotated[EnginePrecision, BuildFlag()] = "fp16"
    """Engine precision: fp32, fp16, bf16 or int8 (int8 needs a quantized ONNX model)."""
    min_batch: Annotated[BatchSize, BuildFlag()] = DEFAULT_MIN_BATCH
    """Smallest batch size the engine accepts."""
    opt_batch: Annotated[BatchSize | None, BuildFlag()] = None
    """Batch size TensorRT tunes for (default: maxBatch)."""
    max_batch: Annotated[BatchSize, BuildFlag()] = DEFAULT_MAX_BATCH
    """Largest batch size the engine accepts."""
    workspace_mi_b: Annotated[int, Field(ge=16, le=1_048_576, alias="workspaceMiB"), BuildFlag("--workspace-mib")] = 4096
    """Builder workspace memory limit in MiB."""
    resources: Resources | None = None
    """Resources of the engine container (default: limits of one nvidia.com/gpu). Set, they replace that default: name nvidia.com/gpu in limits to keep a GPU."""
    backoff_limit: Annotated[int, Field(ge=0, le=100)] = 1
    """Retries of the engine Job before it is marked failed."""
    fallback: Annotated[Literal["none", "onnxruntime"], BuildFlag()] = "none"
    """Where the engine image has no TensorRT or its node no GPU: none fails the engine Job (exit 3); onnxruntime checks and times model.onnx with ONNX Runtime on the CPU instead and builds no engine (a cluster without TensorRT; `dtrain build-engine --fallback`)."""
    # The build options below have trtexec's defaults.
    profiles: Annotated[Annotated[list[EngineProfile], Field(min_length=1, max_length=8)] | None, BuildFlag()] = None
    """Optimisation profiles with per-input min/opt/max shapes (trtexec --minShapes/--optShapes/--maxShapes, once per profile); when set, minBatch/optBatch/maxBatch are not used. Needed for a dynamic axis besides the batch axis."""
    tf32: Annotated[bool, BuildFlag()] = False
    """Let fp32 builds use TF32 (trtexec's default; off here, as in polygraphy, so fp32 meets its 1e-3 bound)."""
    hardware_compatibility_level: Annotated[HardwareCompatibilityLevel, BuildFlag()] = "none"
    """GPUs the engine must run on besides the builder's (trtexec --hardwareCompatibilityLevel, default none)."""
    version_compatible: Annotated[bool, BuildFlag()] = False
    """Build an engine that later TensorRT versions can run (trtexec --versionCompatible)."""
    refit: Annotated[bool, BuildFlag()] = False
    """Build a refittable engine, for pipelines that retrain (trtexec --refit)."""
    strip_weights: Annotated[bool, BuildFlag()] = False
    """Build a weight-stripped engine, refitted from model.onnx before use (trtexec --stripWeights)."""
    builder_optimization_level: Annotated[int, Field(ge=0, le=5), BuildFlag()] = 3
    """Builder optimisation level 0-5: higher builds longer for a faster engine (trtexec --builderOptimizationLevel, default 3)."""
    layer_precisions: Annotated[Annotated[dict[LayerPattern, EngineLayerPrecision], Field(max_length=MAX_MAP_ENTRIES)] | None, BuildFlag()] = None
    """Per-layer precision by layer name or * pattern (trtexec --layerPrecisions); weakly typed builds only. A pattern cannot hold ',' nor begin or end with a space (the command's list cannot carry them): match those with '?'."""
    precision_constraints: Annotated[PrecisionConstraints, BuildFlag()] = "none"
    """How strictly layerPrecisions hold (trtexec --precisionConstraints, default none; prefer when layerPrecisions is set)."""
    plugin_libraries: Annotated[Annotated[list[Annotated[str, Field(pattern=r"^/", max_length=MAX_PATH_LENGTH)]], Field(max_length=16)] | None, BuildFlag("--plugin-library")] = None
    """TensorRT plugin libraries to load, absolute paths in the engine image (trtexec --dynamicPlugins)."""
    use_cuda_graph: Annotated[bool, BuildFlag()] = False
    """Also time the engine through a CUDA graph (trtexec --useCudaGraph)."""

    @model_validator(mode="after")
    def _batch_order(self) -> EngineSettings:
        opt = self.opt_batch if self.opt_batch is not None else self.max_batch
        if not self.min_batch <= opt <= self.max_batch:
            raise ValueError(
                f"need minBatch <= optBatch <= maxBatch, got {self.min_batch} <= {opt} <= {self.max_batch}"
            )
        return self

    @model_validator(mode="after")
    def _profiles_agree(self) -> EngineSettings:
        """TensorRT needs each dynamic input in every profile, and an input has one rank."""
        first = self.profiles[0].inputs if self.profiles else {}
        for index, profile in enumerate((self.profiles or [])[1:], start=1):
            if set(profile.inputs) != set(first):
                raise refusal(f".profiles[{index}].inputs", f"names {sorted(profile.inputs)}, profile 0 "
                              f"{sorted(first)}: every profile gives a shape range for the same inputs")
            for name, shapes in profile.inputs.items():
                if len(shapes.min) != len(first[name].min):
                    raise refusal(f".profiles[{index}].inputs{key_step(name)}", f"has rank {len(shapes.min)}, "
                                  f"{len(first[name].min)} in profile 0: an input has the same rank in every profile")
        return self

    @property
    def resolved_opt_batch(self) -> int:
        return self.opt_batch if self.opt_batch is not None else self.max_batch


