"""The build plan: every decision `dtrain build-engine` makes before TensorRT runs, in one function.

`plan_build(model, options, tensorrt_version)`, with spec.engine's build options as the command
read them (api.engine_options), decides the network creation flags, the
builder flags set and cleared, the memory-pool limits (bytes), every optimisation profile's
shapes per input, the plugins, the precision and its accuracy bound, and why. `--dry-run`
prints `BuildPlan.to_json()` without TensorRT or a GPU; the real build
(engine_tensorrt.build_engine) carries the same plan out and decides nothing itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dtrain_engine.onnx_model import (
    ACCURACY_BOUNDS,
    EXIT_UNAVAILABLE,
    SUPPORTED_TENSORRT_MAJORS,
    BatchSizes,
    EngineError,
    OnnxModelInfo,
    Shape,
    resolve_batch_sizes,
    usage_error,
)
from dtrain_engine.precision_plan import PrecisionPlan, plan_precision
from dtrain_operator.api.engine_options import SHAPE_FLAGS, EngineBuildOptions

# What a dry run plans for when no TensorRT is installed: the API tensorrt-stubs describes.
DEFAULT_TENSORRT_VERSION = "10.13"
# trtexec's spelling -> TensorRT's HardwareCompatibilityLevel member.
HARDWARE_COMPATIBILITY = {"none": "NONE", "ampere+": "AMPERE_PLUS", "same-compute-capability": "SAME_COMPUTE_CAPABILITY"}
PRECISION_CONSTRAINT_FLAGS = {"prefer": "PREFER_PRECISION_CONSTRAINTS", "obey": "OBEY_PRECISION_CONSTRAINTS"}
# A layer precision -> (TensorRT DataType member, the builder flag a weakly typed build needs for it).
LAYER_PRECISIONS: dict[str, tuple[str, str | None]] = {"fp32": ("FLOAT", None), "fp16": ("HALF", "FP16"), "bf16": ("BF16", "BF16")}


@dataclass(frozen=True)
class ShapeRange:
    min: Shape
    opt: Shape
    max: Shape

    def to_json(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


@dataclass(frozen=True)
class ShapePoint:
    """One set of input shapes the engine is checked and timed at: a profile's min, opt or max."""

    profile: int
    label: str  # "min", "opt", "max", or e.g. "opt/max" where they coincide
    shapes: Mapping[str, Shape]

    @property
    def batch_size(self) -> int:
        return next(iter(self.shapes.values()))[0]

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "point": self.label, "shapes": {k: list(v) for k, v in self.shapes.items()}}


@dataclass(frozen=True)
class BuildPlan:
    tensorrt_version: str
    tensorrt_major: int
    tensorrt_assumed: bool  # no TensorRT here: the plan is for DEFAULT_TENSORRT_VERSION or --tensorrt-version
    strongly_typed: bool
    builder_flags: tuple[str, ...]  # BuilderFlag members to set
    cleared_flags: tuple[str, ...]  # BuilderFlag members on by default to clear
    workspace_bytes: int
    builder_optimization_level: int
    hardware_compatibility: str  # HardwareCompatibilityLevel member
    profiles: tuple[Mapping[str, ShapeRange], ...]
    plugin_libraries: tuple[str, ...]
    requested_precision: str
    executed_precision: str
    bound: float
    quantized_types: tuple[str, ...]
    onnx_conversion: str | None  # "float16": the ONNX model is converted before parsing
    layer_precisions: tuple[tuple[str, str], ...]  # (pattern, DataType member)
    precision_reasons: tuple[str, ...]
    exact_outputs: tuple[str, ...]
    data_dependent_outputs: tuple[str, ...]
    cuda_graph: bool
    refit_from_onnx: bool  # a weight-stripped engine is refitted from the ONNX model before it runs
    engine_host_code_allowed: bool  # a version-compatible engine carries its lean runtime
    timing_cache: str | None
    notes: tuple[str, ...] = field(default=())

    @property
    def network_flags(self) -> tuple[str, ...]:
        return ("STRONGLY_TYPED",) if self.strongly_typed else ()

    def points(self) -> list[ShapePoint]:
        """Each profile's distinct min/opt/max shapes, in profile order."""
        points = []
        for index, profile in enumerate(self.profiles):
            labels: dict[tuple[tuple[str, Shape], ...], list[str]] = {}
            for label in ("min", "opt", "max"):
                key = tuple((name, getattr(shape_range, label)) for name, shape_range in profile.items())
                labels.setdefault(key, []).append(label)
            points += [ShapePoint(index, "/".join(names), dict(key)) for key, names in labels.items()]
        return points

    def to_json(self) -> dict[str, Any]:
        return {
            "tensorrt": {"version": self.tensorrt_version, "major": self.tensorrt_major, "assumed": self.tensorrt_assumed},
            "network": {"creation_flags": list(self.network_flags), "strongly_typed": self.strongly_typed},
            "builder": {
                "flags_set": list(self.builder_flags),
                "flags_cleared": list(self.cleared_flags),
                "builder_optimization_level": self.builder_optimization_level,
                "hardware_compatibility_level": self.hardware_compatibility,
                "profiling_verbosity": "DETAILED",
            },
            "memory_pools_bytes": {"WORKSPACE": self.workspace_bytes},
            "profiles": [{name: r.to_json() for name, r in profile.items()} for profile in self.profiles],
            "plugins": {"init_libnvinfer_plugins": True, "libraries": list(self.plugin_libraries)},
            "precision": {
                "requested": self.requested_precision,
                "executed": self.executed_precision,
                "accuracy_bound": self.bound,
                "quantized_types": list(self.quantized_types),
                "onnx_conversion": self.onnx_conversion,
                "layer_precisions": {pattern: dtype for pattern, dtype in self.layer_precisions},
                "why": list(self.precision_reasons),
            },
            "outputs": {"compared_exactly": list(self.exact_outputs), "data_dependent": list(self.data_dependent_outputs)},
            "runtime": {
                "cuda_graph": self.cuda_graph,
                "refit_from_onnx": self.refit_from_onnx,
                "engine_host_code_allowed": self.engine_host_code_allowed,
            },
            "timing_cache": self.timing_cache,
            "checked_at": [point.to_json() for point in self.points()],
            "notes": list(self.notes),
        }


# --- Shapes -------------------------------------------------------------------------------


def _explicit_profiles(model: OnnxModelInfo, options: EngineBuildOptions) -> tuple[dict[str, ShapeRange], ...]:
    by_name = {tensor.name: tensor for tensor in model.inputs}
    profiles = []
    for index, engine_profile in enumerate(options.profiles or []):
        given = engine_profile.inputs
        where = f"profile {index} ({SHAPE_FLAGS} occurrence {index + 1})"
        unknown = sorted(set(given) - set(by_name))
        if unknown:
            raise usage_error(f"{where} names input(s) {unknown} that the model does not have; its inputs: {sorted(by_name)}")
        profile: dict[str, ShapeRange] = {}
        for tensor in model.inputs:
            if tensor.name not in given:
                if tensor.dynamic_axes:
                    raise usage_error(
                        f"{where} gives no shape for input {tensor.describe()}, which has dynamic axes {tensor.dynamic_axes}"
                    )
                static = tuple(int(d) for d in tensor.shape)
                profile[tensor.name] = ShapeRange(static, static, static)
                continue
            shapes = given[tensor.name]
            low, opt, high = tuple(shapes.min), tuple(shapes.opt), tuple(shapes.max)
            for shape in (low, opt, high):
                if len(shape) != len(tensor.shape):
                    raise usage_error(f"{where}: {tensor.name}:{'x'.join(map(str, shape))} has rank {len(shape)}, the input {tensor.describe()} {len(tensor.shape)}")
                fixed = [(axis, d) for axis, d in enumerate(tensor.shape) if isinstance(d, int) and shape[axis] != d]
                if fixed:
                    raise usage_error(f"{where}: input {tensor.describe()} has axis {fixed[0][0]} fixed at {fixed[0][1]}, not {shape[fixed[0][0]]}")
            profile[tensor.name] = ShapeRange(low, opt, high)
        profiles.append(profile)
    return tuple(profiles)


def _batch_profile(model: OnnxModelInfo, batches: BatchSizes) -> dict[str, ShapeRange]:
    """The default profile: min/opt/max on the batch axis, every other axis as the model fixes it."""
    profile = {}
    for tensor in model.inputs:
        other = [axis for axis in tensor.dynamic_axes if axis > 0]
        if other:
            raise usage_error(
                f"input {tensor.describe()} has dynamic axes {other} besides the batch axis: give their range with "
                f"--min-shapes/--opt-shapes/--max-shapes (spec.engine.profiles), e.g. --opt-shapes "
                f"{tensor.name}:{'x'.join(str(d) if isinstance(d, int) else '8' for d in tensor.shape)}"
            )
        sample = tuple(int(d) for d in tensor.shape[1:])
        profile[tensor.name] = ShapeRange(*((batch, *sample) for batch in (batches.min, batches.opt, batches.max)))
    return profile


def plan_profiles(model: OnnxModelInfo, options: EngineBuildOptions) -> tuple[dict[str, ShapeRange], ...]:
    if options.profiles:
        given = [flag for flag, value in (("--min-batch", options.min_batch), ("--opt-batch", options.opt_batch), ("--max-batch", options.max_batch)) if value is not None]
        if given:
            raise usage_error(f"{'/'.join(given)} and {SHAPE_FLAGS} both given: the shapes set the batch axis too; give one or the other")
        return _explicit_profiles(model, options)
    return (_batch_profile(model, resolve_batch_sizes(model, options.min_batch, options.opt_batch, options.max_batch)),)


# --- Precision -----------------------------------------------------------------------------


def _version(text: str) -> tuple[int, int]:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise usage_error(f"TensorRT version {text!r}: expected MAJOR.MINOR, e.g. 10.13") from None


def _loosest(*precisions: str) -> str:
    return max(precisions, key=lambda name: ACCURACY_BOUNDS[name])


# --- The plan ------------------------------------------------------------------------------


def check_options(options: EngineBuildOptions) -> None:
    """The checks that need no model and that the options model cannot make: the plugins are there."""
    for library in options.plugin_libraries or []:
        if not os.path.isfile(library):
            raise usage_error(f"--plugin-library {library}: no such file")


def _plan_layer_precisions(
    options: EngineBuildOptions, precision: PrecisionPlan, version: tuple[int, int], model: OnnxModelInfo
) -> tuple[list[tuple[str, str]], str]:
    """--layer-precisions as (pattern, DataType member), and the precision the engine is judged by with them.

    The builder flags they need, and the reason, are added to `precision`'s."""
    flags, reasons, executed = precision.flags, precision.reasons, precision.executed
    layer_precisions: list[tuple[str, str]] = []
    if options.layer_precisions:
        if precision.strongly_typed:
            raise usage_error(
                "--layer-precisions needs a weakly typed build, and this one is strongly typed "
                f"(TensorRT {version[0]}.{version[1]}{', a Q/DQ model' if model.quantized else ''}): the ONNX types decide "
                "there; put Cast nodes in the model instead"
            )
        for pattern, layer_precision in options.layer_precisions.items():
            data_type, needed_flag = LAYER_PRECISIONS[layer_precision]
            layer_precisions.append((pattern, data_type))
            if needed_flag and needed_flag not in flags:
                flags.append(needed_flag)
            executed = _loosest(executed, layer_precision)
        constraint = options.precision_constraints if options.precision_constraints != "none" else "prefer"
        flags.append(PRECISION_CONSTRAINT_FLAGS[constraint])
        reasons.append(
            f"per-layer precisions {options.layer_precisions} with {constraint} precision constraints"
            + (" (trtexec's choice when --layer-precisions comes without --precision-constraints)" if options.precision_constraints == "none" else "")
            + f": judged against {executed}'s bound"
        )
    elif options.precision_constraints != "none":
        flags.append(PRECISION_CONSTRAINT_FLAGS[options.precision_constraints])
    return layer_precisions, executed


def _plan_runtime(options: EngineBuildOptions, model: OnnxModelInfo) -> tuple[list[str], list[str], bool]:
    """The builder flags for version compatibility, refit and stripped weights, the notes on them, and the CUDA graph."""
    flags: list[str] = []
    notes: list[str] = []
    if options.version_compatible:
        flags.append("VERSION_COMPATIBLE")
        notes.append("version compatible: the engine carries a lean runtime, so the runtime must allow host code")
    if options.refit:
        flags.append("REFIT")
    if options.strip_weights:
        flags += ["STRIP_PLAN"] + ([] if options.refit else ["REFIT_IDENTICAL"])
        notes.append("weight-stripped: the plan holds no refittable weights; the check refits it from the ONNX model first")

    data_dependent = model.data_dependent_outputs
    cuda_graph = options.use_cuda_graph
    if cuda_graph and data_dependent:
        cuda_graph = False
        notes.append(f"no CUDA graph: outputs {list(data_dependent)} have data-dependent shapes, which a graph cannot capture")
    return flags, notes, cuda_graph


def plan_build(
    model: OnnxModelInfo, options: EngineBuildOptions, tensorrt_version: str | None = None, timing_cache: str | None = None
) -> BuildPlan:
    """The whole build plan for `model` on TensorRT `tensorrt_version` (None: DEFAULT_TENSORRT_VERSION, assumed),
    reading and writing the timing cache file `timing_cache` (None: none)."""
    check_options(options)
    assumed = tensorrt_version is None
    version = _version(tensorrt_version or DEFAULT_TENSORRT_VERSION)
    if version[0] not in SUPPORTED_TENSORRT_MAJORS:
        raise EngineError(f"TensorRT {version[0]} is not supported: dtrain builds with TensorRT 10 or 11", EXIT_UNAVAILABLE)
    profiles = plan_profiles(model, options)
    precision = plan_precision(version, options.precision, options.tf32, model)
    layer_precisions, executed = _plan_layer_precisions(options, precision, version, model)
    runtime_flags, notes, cuda_graph = _plan_runtime(options, model)
    flags, cleared, reasons = precision.flags + runtime_flags, precision.cleared, precision.reasons
    data_dependent = model.data_dependent_outputs

    return BuildPlan(
        tensorrt_version=f"{version[0]}.{version[1]}" if assumed else str(tensorrt_version),
        tensorrt_major=version[0],
        tensorrt_assumed=assumed,
        strongly_typed=precision.strongly_typed,
        builder_flags=tuple(dict.fromkeys(flags)),
        cleared_flags=tuple(cleared),
        workspace_bytes=options.workspace_mi_b << 20,
        builder_optimization_level=options.builder_optimization_level,
        hardware_compatibility=HARDWARE_COMPATIBILITY[options.hardware_compatibility_level],
        profiles=profiles,
        plugin_libraries=tuple(options.plugin_libraries or []),
        requested_precision=options.precision,
        executed_precision=executed,
        bound=ACCURACY_BOUNDS[executed],
        quantized_types=tuple(sorted(model.quantized_types)),
        onnx_conversion=precision.conversion,
        layer_precisions=tuple(layer_precisions),
        precision_reasons=tuple(reasons),
        exact_outputs=tuple(t.name for t in model.outputs if t.exact),
        data_dependent_outputs=data_dependent,
        cuda_graph=cuda_graph,
        refit_from_onnx=options.strip_weights,
        engine_host_code_allowed=options.version_compatible,
        timing_cache=timing_cache,
        notes=tuple(notes),
    )
