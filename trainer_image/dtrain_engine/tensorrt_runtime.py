# layout: one module over 400 lines on purpose. It is the whole TensorRT surface and the only
# module that imports tensorrt: TENSORRT_API (about 100 lines) lists every member used, and
# tests/engine checks that table against the real module and the stubs, type-checks this file
# by path with mypy, and re-imports it with the TensorRT double in place. Split in two, the
# surface would be two files for each of those checks to keep in step; the build and run halves
# are each under 200 lines and each function is short.
"""Everything that touches TensorRT: carry out a BuildPlan (parse, configure, build), then run
the engine on a Device.

Written against the TensorRT 10 Python API and type-checked with mypy against
tensorrt-stubs (tests/engine/test_engine_mypy.py); TensorRT 11 takes the same calls
except the precision builder flags it removed, which engine_plan never asks of it.
Import this module only after `probe_tensorrt()` said TensorRT is there (the tests import
it with their TensorRT double in its place).

Nothing here decides: flags, pools, profiles, plugins and precisions all come from the plan.
Memory, the stream, events and CUDA graphs come from the Device (engine_device), so the same
code runs on torch.cuda for real and on host memory under the test suite's double.
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import tensorrt as trt

from dtrain_engine.build_plan import BuildPlan
from dtrain_engine.check import (
    GPU_CLOCK,
    GRAPH_CLOCK,
    HOST_CLOCK,
    Arrays,
    Timing,
    TimingSettings,
    measure_samples,
    wall_clock_sample,
)
from dtrain_engine.device import Device, DeviceBuffer
from dtrain_engine.onnx_model import EXIT_USAGE, EngineError, describe_parser_error

# Every module attribute, enum member and method this module uses, by the TensorRT majors
# that have it. tests/engine walks these on the real module where TensorRT imports (API
# drift such as the removed `Builder.max_batch_size` fails there) and in the stubs here;
# the builder flags and enum members looked up by a plan's names are listed too.
TENSORRT_API: dict[str, tuple[int, ...]] = {
    "__version__": (10, 11),
    "ILogger": (10, 11),
    "ILogger.__init__": (10, 11),
    "ILogger.Severity.INTERNAL_ERROR": (10, 11),
    "ILogger.Severity.ERROR": (10, 11),
    "ILogger.Severity.WARNING": (10, 11),
    "init_libnvinfer_plugins": (10, 11),
    "get_plugin_registry": (10, 11),
    "IPluginRegistry.load_library": (10, 11),
    "Builder": (10, 11),
    "Builder.create_network": (10, 11),
    "Builder.create_builder_config": (10, 11),
    "Builder.create_optimization_profile": (10, 11),
    "Builder.build_serialized_network": (10, 11),
    "NetworkDefinitionCreationFlag.STRONGLY_TYPED": (10, 11),
    "INetworkDefinition.num_inputs": (10, 11),
    "INetworkDefinition.get_input": (10, 11),
    "INetworkDefinition.num_layers": (10, 11),
    "INetworkDefinition.get_layer": (10, 11),
    "ILayer.name": (10, 11),
    "ILayer.precision": (10, 11),
    "ITensor.name": (10, 11),
    "OnnxParser": (10, 11),
    "OnnxParser.parse_from_file": (10, 11),
    "OnnxParser.num_errors": (10, 11),
    "OnnxParser.get_error": (10, 11),
    "ParserError.node": (10, 11),
    "ParserError.node_name": (10, 11),
    "ParserError.node_operator": (10, 11),
    "ParserError.desc": (10, 11),
    "IBuilderConfig.set_memory_pool_limit": (10, 11),
    "IBuilderConfig.set_flag": (10, 11),
    "IBuilderConfig.clear_flag": (10, 11),
    "IBuilderConfig.add_optimization_profile": (10, 11),
    "IBuilderConfig.create_timing_cache": (10, 11),
    "IBuilderConfig.set_timing_cache": (10, 11),
    "IBuilderConfig.get_timing_cache": (10, 11),
    "IBuilderConfig.builder_optimization_level": (10, 11),
    "IBuilderConfig.hardware_compatibility_level": (10, 11),
    "IBuilderConfig.profiling_verbosity": (10, 11),
    "IBuilderConfig.plugins_to_serialize": (10, 11),
    "ITimingCache.serialize": (10, 11),
    "IOptimizationProfile.set_shape": (10, 11),
    "MemoryPoolType.WORKSPACE": (10, 11),
    "ProfilingVerbosity.DETAILED": (10, 11),
    "HardwareCompatibilityLevel": (10, 11),
    "HardwareCompatibilityLevel.NONE": (10, 11),
    "HardwareCompatibilityLevel.AMPERE_PLUS": (10, 11),
    "HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY": (10, 11),
    "BuilderFlag": (10, 11),
    "BuilderFlag.FP16": (10,),
    "BuilderFlag.BF16": (10,),
    "BuilderFlag.INT8": (10,),
    "BuilderFlag.FP8": (10,),
    "BuilderFlag.INT4": (10,),
    "BuilderFlag.FP4": (10,),
    "BuilderFlag.PREFER_PRECISION_CONSTRAINTS": (10,),
    "BuilderFlag.OBEY_PRECISION_CONSTRAINTS": (10,),
    "BuilderFlag.TF32": (10, 11),
    "BuilderFlag.VERSION_COMPATIBLE": (10, 11),
    "BuilderFlag.REFIT": (10, 11),
    "BuilderFlag.REFIT_IDENTICAL": (10, 11),
    "BuilderFlag.STRIP_PLAN": (10, 11),
    "Dims": (10, 11),
    "Runtime": (10, 11),
    "Runtime.deserialize_cuda_engine": (10, 11),
    "Runtime.engine_host_code_allowed": (10, 11),
    "Refitter": (10, 11),
    "Refitter.refit_cuda_engine": (10, 11),
    "OnnxParserRefitter": (10, 11),
    "OnnxParserRefitter.refit_from_file": (10, 11),
    "ICudaEngine.num_io_tensors": (10, 11),
    "ICudaEngine.get_tensor_name": (10, 11),
    "ICudaEngine.get_tensor_mode": (10, 11),
    "ICudaEngine.get_tensor_dtype": (10, 11),
    "ICudaEngine.create_execution_context": (10, 11),
    "ICudaEngine.create_engine_inspector": (10, 11),
    "ICudaEngine.device_memory_size_v2": (10, 11),
    "EngineInspector.execution_context": (10, 11),
    "EngineInspector.get_engine_information": (10, 11),
    "LayerInformationFormat.JSON": (10, 11),
    "IOutputAllocator": (10, 11),
    "IOutputAllocator.__init__": (10, 11),
    "TensorIOMode.INPUT": (10, 11),
    "IExecutionContext.set_optimization_profile_async": (10, 11),
    "IExecutionContext.set_input_shape": (10, 11),
    "IExecutionContext.get_tensor_shape": (10, 11),
    "IExecutionContext.set_tensor_address": (10, 11),
    "IExecutionContext.set_output_allocator": (10, 11),
    "IExecutionContext.execute_async_v3": (10, 11),
    "DataType": (10, 11),
    "DataType.FLOAT": (10, 11),
    "DataType.HALF": (10, 11),
    "DataType.BF16": (10, 11),
    "DataType.INT8": (10, 11),
    "DataType.INT32": (10, 11),
    "DataType.INT64": (10, 11),
    "DataType.BOOL": (10, 11),
    "DataType.UINT8": (10, 11),
}

MAX_LOGGED_WARNINGS = 50


def tensorrt_version() -> str:
    version: str = trt.__version__
    return version


class TensorRTLog(trt.ILogger):
    """TensorRT's own warnings and errors, kept for the error message and the report.

    TensorRT reports API misuse (a shape outside the profile, a tensor without an address)
    only here, with a False or None return beside it: every failure below quotes it."""

    def __init__(self) -> None:
        trt.ILogger.__init__(self)
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
        if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
            self.errors.append(msg.strip())
        elif severity == trt.ILogger.Severity.WARNING and len(self.warnings) < MAX_LOGGED_WARNINGS:
            self.warnings.append(msg.strip())

    def failure(self, action: str, since: int = 0) -> str:
        said = self.errors[since:][-5:]
        return f"TensorRT could not {action}: " + ("; ".join(said) if said else "it logged no error")

    def check(self, action: str, since: int) -> None:
        """Raise when TensorRT logged an error since `since` (a len(errors) taken before the calls)."""
        if len(self.errors) > since:
            raise EngineError(self.failure(action, since))

    def to_json(self) -> dict[str, list[str]]:
        return {"errors": list(self.errors), "warnings": list(self.warnings)}


@dataclass(frozen=True)
class BuildResult:
    plan: bytes
    seconds: float
    timing_cache: str | None  # what happened to the timing cache, for the report


# --- Build ----------------------------------------------------------------------------------


def _builder_flag(name: str) -> trt.BuilderFlag:
    # By name: TensorRT 11 has no FP16/INT8 members, and plans for it never name them (TENSORRT_API lists each).
    flag: trt.BuilderFlag = getattr(trt.BuilderFlag, name)
    return flag


def _load_plugins(plan: BuildPlan, log: TensorRTLog) -> None:
    """TensorRT's own plugins (what onnx-tensorrt maps RoiAlign, NMS and friends to), then the user's libraries."""
    # The stubs type the logger argument as a capsule; the bindings take the ILogger itself.
    if not trt.init_libnvinfer_plugins(cast(Any, log), ""):
        raise EngineError(log.failure("initialise its plugin library (libnvinfer_plugin)"))
    registry = trt.get_plugin_registry()
    for library in plan.plugin_libraries:
        if registry.load_library(library) is None:
            raise EngineError(log.failure(f"load the plugin library {library}"))


def _parse(parser: trt.OnnxParser, onnx_path: str) -> None:
    if parser.parse_from_file(onnx_path):
        return
    lines = []
    for index in range(parser.num_errors):
        error = parser.get_error(index)
        lines.append(describe_parser_error(index, error.node(), error.node_name(), error.node_operator(), error.desc()))
    raise EngineError(
        f"TensorRT's ONNX parser rejected {onnx_path} with {len(lines)} error(s):\n" + "\n".join(lines)
        if lines
        else f"TensorRT's ONNX parser rejected {onnx_path} without saying why"
    )


def _constrain_layers(network: trt.INetworkDefinition, plan: BuildPlan) -> None:
    layers = [network.get_layer(index) for index in range(network.num_layers)]
    for pattern, data_type_name in plan.layer_precisions:
        data_type: trt.DataType = getattr(trt.DataType, data_type_name)
        matched = [layer for layer in layers if fnmatch.fnmatchcase(layer.name, pattern)]
        if not matched:
            examples = ", ".join(repr(layer.name) for layer in layers[:3])
            raise EngineError(f"--layer-precisions {pattern}: no layer of the network is named like it (e.g. {examples})", EXIT_USAGE)
        for layer in matched:
            layer.precision = data_type


def _add_profiles(
    builder: trt.Builder, network: trt.INetworkDefinition, config: trt.IBuilderConfig, plan: BuildPlan, log: TensorRTLog
) -> None:
    names = [network.get_input(index).name for index in range(network.num_inputs)]
    for index, shapes in enumerate(plan.profiles):
        unknown = [name for name in names if name not in shapes]
        if unknown:
            raise EngineError(f"TensorRT sees input(s) {unknown} that the ONNX model does not declare")
        profile = builder.create_optimization_profile()
        for name in names:
            bounds = shapes[name]
            profile.set_shape(name, trt.Dims(list(bounds.min)), trt.Dims(list(bounds.opt)), trt.Dims(list(bounds.max)))
        if config.add_optimization_profile(profile) != index:
            described = {name: r.to_json() for name, r in shapes.items()}
            raise EngineError(log.failure(f"add optimisation profile {index} {described}"))


def _load_timing_cache(config: trt.IBuilderConfig, path: str) -> str:
    data = b""
    state = "none"
    if os.path.isfile(path):
        with open(path, "rb") as handle:
            data = handle.read()
        state = f"read {len(data)} bytes from {path}"
    try:
        cache: trt.ITimingCache | None = config.create_timing_cache(data)
    except Exception:  # noqa: BLE001 - the bindings raise their own types for bytes they cannot read
        cache = None
    if cache is None:
        cache = config.create_timing_cache(b"")
        state = f"{path} is not a TensorRT timing cache (corrupt or truncated); started a new one"
    if cache is None:
        raise EngineError("TensorRT cannot create an empty timing cache")
    if not config.set_timing_cache(cache, False):
        # A cache from another GPU or TensorRT version: start afresh rather than mix timings.
        fresh = config.create_timing_cache(b"")
        if fresh is None or not config.set_timing_cache(fresh, False):
            raise EngineError(f"TensorRT refuses a new timing cache after refusing {path}")
        state = f"{path} was made by another GPU or TensorRT version; started a new one"
    return state


def _save_timing_cache(config: trt.IBuilderConfig, path: str) -> int:
    data = bytes(config.get_timing_cache().serialize())
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)
    return len(data)


def build_engine(onnx_path: str, plan: BuildPlan, log: TensorRTLog) -> BuildResult:
    """Parse `onnx_path` (the model as given, or its converted copy) and build the serialized engine `plan` describes."""
    _load_plugins(plan, log)
    builder = trt.Builder(log)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if plan.strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, log)
    _parse(parser, onnx_path)
    _constrain_layers(network, plan)

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, plan.workspace_bytes)
    for name in plan.builder_flags:
        config.set_flag(_builder_flag(name))
    for name in plan.cleared_flags:
        config.clear_flag(_builder_flag(name))
    config.builder_optimization_level = plan.builder_optimization_level
    config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, plan.hardware_compatibility)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if plan.engine_host_code_allowed and plan.plugin_libraries:
        config.plugins_to_serialize = list(plan.plugin_libraries)
    _add_profiles(builder, network, config, plan, log)
    cache_state = _load_timing_cache(config, plan.timing_cache) if plan.timing_cache is not None else None

    start = time.perf_counter()
    serialized: trt.IHostMemory | None = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - start
    if serialized is None:
        raise EngineError(log.failure("build the engine"))
    if plan.timing_cache is not None:
        written = _save_timing_cache(config, plan.timing_cache)
        cache_state = f"{cache_state}; wrote {written} bytes to {plan.timing_cache}"
    return BuildResult(bytes(serialized), seconds, cache_state)


# --- Run --------------------------------------------------------------------------------------


class _OutputAllocator(trt.IOutputAllocator):
    """Device memory for outputs whose shape is only known once the engine ran (NonZero, NMS)."""

    def __init__(self, device: Device) -> None:
        trt.IOutputAllocator.__init__(self)
        self._device = device
        self.buffers: dict[str, DeviceBuffer] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}

    def reallocate_output(self, tensor_name: str, memory: int, size: int, alignment: int) -> int:
        buffer = self.buffers.get(tensor_name)
        if buffer is None or buffer.nbytes < size:
            buffer = self._device.allocate(size)
            self.buffers[tensor_name] = buffer
        return buffer.address

    def reallocate_output_async(self, tensor_name: str, memory: int, size: int, alignment: int, stream: int) -> int:
        return self.reallocate_output(tensor_name, memory, size, alignment)

    def notify_shape(self, tensor_name: str, shape: trt.Dims) -> None:
        self.shapes[tensor_name] = tuple(int(shape[i]) for i in range(len(shape)))


def _bfloat16_to_float32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


class TensorRTEngine:
    """A deserialized engine on a Device, run on its own stream, one optimisation profile at a time."""

    name = "tensorrt"

    def __init__(self, serialized: bytes, plan: BuildPlan, device: Device, log: TensorRTLog, onnx_path: str):
        self._plan, self._device, self._log = plan, device, log
        self._stream = device.stream()
        self.notes: list[str] = []
        self._runtime = trt.Runtime(log)
        if plan.engine_host_code_allowed:
            # A version-compatible engine carries its lean runtime: host code TensorRT must be allowed to run.
            self._runtime.engine_host_code_allowed = True
        engine: trt.ICudaEngine | None = self._runtime.deserialize_cuda_engine(serialized)
        if engine is None:
            raise EngineError(log.failure("load the engine it has just built"))
        self._engine = engine
        if plan.refit_from_onnx:
            self._refit(onnx_path)
        context: trt.IExecutionContext | None = engine.create_execution_context()
        if context is None:
            raise EngineError(log.failure("create an execution context (is the GPU out of memory?)"))
        self._context = context
        self._profile = 0
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]
        self._bound: dict[str, DeviceBuffer] = {}
        self._allocator: _OutputAllocator | None = None
        self.device_memory_bytes = int(engine.device_memory_size_v2)
        self._dtypes: dict[trt.DataType, np.dtype[Any]] = {
            trt.DataType.FLOAT: np.dtype(np.float32),
            trt.DataType.HALF: np.dtype(np.float16),
            trt.DataType.BF16: np.dtype(np.uint16),  # read as raw bits, widened to float32
            trt.DataType.INT8: np.dtype(np.int8),
            trt.DataType.INT32: np.dtype(np.int32),
            trt.DataType.INT64: np.dtype(np.int64),
            trt.DataType.BOOL: np.dtype(np.bool_),
            trt.DataType.UINT8: np.dtype(np.uint8),
        }

    def _refit(self, onnx_path: str) -> None:
        """A weight-stripped engine gets its weights back from the ONNX model it was built from."""
        refitter = trt.Refitter(self._engine, self._log)
        onnx_refitter = trt.OnnxParserRefitter(refitter, self._log)
        if not onnx_refitter.refit_from_file(onnx_path) or not refitter.refit_cuda_engine():
            raise EngineError(self._log.failure(f"refit the weight-stripped engine from {onnx_path}"))

    def _dtype(self, name: str) -> np.dtype[Any]:
        dtype = self._engine.get_tensor_dtype(name)
        if dtype not in self._dtypes:
            raise EngineError(f"engine tensor '{name}' has type {dtype}, which the check cannot feed or read")
        return self._dtypes[dtype]

    def _shape(self, name: str) -> tuple[int, ...]:
        dims = self._context.get_tensor_shape(name)
        return tuple(int(dims[i]) for i in range(len(dims)))

    def _use_profile(self, profile: int) -> None:
        if profile == self._profile:
            return
        if not self._context.set_optimization_profile_async(profile, self._stream.handle):
            raise EngineError(self._log.failure(f"switch to optimisation profile {profile}"))
        self._stream.synchronize()
        self._profile = profile

    def _bind(self, inputs: Arrays, profile: int) -> None:
        """Input shapes first (output shapes depend on them), then device buffers and their addresses."""
        missing = [n for n in self._inputs if n not in inputs]
        if missing:
            raise EngineError(f"the engine expects input(s) {missing} that the batch does not have")
        since = len(self._log.errors)
        self._use_profile(profile)
        bound: dict[str, DeviceBuffer] = {}
        for name in self._inputs:
            array = np.ascontiguousarray(inputs[name], dtype=self._dtype(name))
            if not self._context.set_input_shape(name, tuple(array.shape)):
                raise EngineError(self._log.failure(f"take input '{name}' with shape {list(array.shape)} in profile {profile}", since))
            bound[name] = self._device.upload(array, self._stream)
        allocator: _OutputAllocator | None = None
        for name in self._outputs:
            shape = self._shape(name)
            if any(d < 0 for d in shape):
                allocator = allocator or _OutputAllocator(self._device)
                if not self._context.set_output_allocator(name, allocator):
                    raise EngineError(self._log.failure(f"take an output allocator for '{name}' {list(shape)}", since))
            else:
                nbytes = int(np.prod(shape, dtype=np.int64)) * self._dtype(name).itemsize
                bound[name] = self._device.allocate(nbytes)
        for name, buffer in bound.items():
            if not self._context.set_tensor_address(name, buffer.address):
                raise EngineError(self._log.failure(f"take the address of tensor '{name}'", since))
        self._log.check("bind the inputs and outputs", since)
        self._stream.synchronize()
        # The context holds raw addresses: the buffers must live as long as the runs do.
        self._bound, self._allocator = bound, allocator

    def _launch(self) -> None:
        since = len(self._log.errors)
        if not self._context.execute_async_v3(self._stream.handle):
            raise EngineError(self._log.failure("run the engine", since))

    def _read_outputs(self) -> dict[str, np.ndarray]:
        results = {}
        for name in self._outputs:
            dtype = self._dtype(name)
            if self._allocator is not None and name in self._allocator.shapes:
                shape = self._allocator.shapes[name]
                buffer = self._allocator.buffers[name]
            else:
                shape, buffer = self._shape(name), self._bound[name]
            value = buffer.read(shape, dtype)
            results[name] = _bfloat16_to_float32(value) if self._engine.get_tensor_dtype(name) == trt.DataType.BF16 else value
        return results

    def infer(self, inputs: Arrays, profile: int = 0) -> dict[str, np.ndarray]:
        self._bind(inputs, profile)
        self._launch()
        self._stream.synchronize()
        return self._read_outputs()

    def prepare_timed_run(self, inputs: Arrays, profile: int = 0) -> Callable[[], None]:
        """One launch and synchronize per call, from inputs already on the device."""
        self._bind(inputs, profile)

        def run() -> None:
            self._launch()
            self._stream.synchronize()

        return run

    def measure(self, inputs: Arrays, profile: int, batch_size: int, settings: TimingSettings) -> Timing:
        """GPU compute time per run from CUDA events on the engine's stream; the host wall clock per
        call beside it; and CUDA-graph replays when the plan asks for them."""
        host_run = self.prepare_timed_run(inputs, profile)
        stream = self._stream
        start, end = self._device.event(), self._device.event()

        def on_events(launch: Callable[[], None]) -> Callable[[], float]:
            def sample() -> float:
                start.record(stream)
                launch()
                end.record(stream)
                end.synchronize()
                return start.elapsed_ms(end) / 1000.0

            return sample

        gpu = measure_samples(on_events(self._launch), batch_size, settings, label=GPU_CLOCK)
        others = [measure_samples(wall_clock_sample(host_run, time.perf_counter), batch_size, settings, label=HOST_CLOCK)]
        # The runs above let TensorRT finish its deferred work, which a graph capture must come after.
        if self._plan.cuda_graph:
            try:
                graph = self._device.capture(stream, self._launch)
            except Exception as error:  # noqa: BLE001 - trtexec, too, runs without a graph when capture fails
                self.notes.append(f"CUDA graph capture failed ({type(error).__name__}: {error}); timed without one")
            else:
                others.append(measure_samples(on_events(lambda: graph.replay(stream)), batch_size, settings, label=GRAPH_CLOCK))
        return Timing(gpu, tuple(others))

    def layer_information(self) -> str:
        """The engine inspector's JSON: per-layer types and precisions (profiling verbosity DETAILED)."""
        inspector = self._engine.create_engine_inspector()
        inspector.execution_context = self._context
        info: str = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
        return info
