"""A behavioural double of the TensorRT Python API and of the CUDA device, used only in tests.

The `tensorrt_double` fixture makes `import tensorrt` resolve to this module, so
dtrain_engine.tensorrt_runtime runs unchanged, and `HostDevice` stands in for
device.TorchCudaDevice. Outputs are computed by running the ONNX model TensorRT
was given (after any conversion) with ONNX Runtime on the bytes found at the bound
addresses, and written back at the output addresses in the engine's types.

What it checks, each a documented precondition of the real API (a failed check logs an
ERROR through the ILogger and returns False/None/-1, as TensorRT does, unless noted):
- build: a network with a dynamic input and no optimisation profile does not build;
  `add_optimization_profile` returns -1 for a profile that misses an input, has min > opt
  or opt > max, a wrong rank, or a size that contradicts a fixed axis.
- pool limits are bytes: a workspace limit under 1 MiB fails the build. (Real TensorRT
  accepts any byte count and builds with a uselessly small workspace; this is the
  plausibility check that catches MiB passed as bytes.)
- typing: FP16/BF16/INT8/FP8/INT4/FP4 flags on a strongly typed network fail the build;
  a weakly typed network with Q/DQ nodes needs the flag of each quantized type; TensorRT 11
  (`__version__` 11.x) builds strongly typed networks only; layer precisions fail on a
  strongly typed network and need the FP16/BF16 flag for HALF/BF16. TF32 is set until
  cleared, and what was set is kept in `BUILDS` for tests to read.
- plugins: ops that onnx-tensorrt maps to TensorRT plugins (PLUGIN_OPS) do not parse
  unless `init_libnvinfer_plugins` was called; `load_library` records each path.
- timing cache: `create_timing_cache` returns None for bytes that are not a cache;
  `set_timing_cache(None, ...)` raises TypeError, as the bindings do; a cache made on
  another device is refused (False) unless mismatches are ignored.
- runtime: a version-compatible plan deserializes only with `engine_host_code_allowed`;
  a weight-stripped plan runs only after `OnnxParserRefitter.refit_from_file` and
  `Refitter.refit_cuda_engine`; `create_execution_context` returns None while
  `FAIL_CONTEXTS` is set.
- execution: stream handles are ints (anything else raises TypeError, as pybind does);
  `set_optimization_profile_async` needs a valid index; `set_input_shape` refuses shapes
  outside the active profile; an output shape read before every input shape is set is an
  API usage error (-1 dims); an output whose size depends on the data reads -1 and needs
  `set_output_allocator`; `execute_async_v3` needs every input shape, and an address (or
  an allocator) for every I/O tensor, each buffer large enough; a CUDA graph capture needs
  one run before it and no output allocator.

What it cannot check: anything numerical about TensorRT's kernels (fp16/INT8 accuracy,
fusions, tactics, speed: ONNX Runtime computes in the model's own types), real device
memory (buffers are host arrays; nothing reads out of bounds), asynchrony (work runs when
enqueued, so a missing synchronize goes unnoticed), output shapes beyond what ONNX shape
inference knows (an axis it cannot infer counts as data-dependent), the inspector's real
layer names and formats, plugin libraries' contents, and any precondition not listed here.
"""

from __future__ import annotations

import enum
import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

if TYPE_CHECKING:
    from typing_extensions import Self

__version__ = "10.13.0"
DEVICE_NAME = "TensorRT double (host memory)"
PLUGIN_OPS = frozenset({"RoiAlign"})  # onnx-tensorrt builds these from libnvinfer_plugin's creators
MIN_POOL_BYTES = 1 << 20
PLAN_MAGIC = b"TRT-DOUBLE-PLAN\n"
CACHE_MAGIC = b"TRT-DOUBLE-CACHE\n"

# Test-visible state, reset by reset().
BUILDS: list[dict[str, Any]] = []  # what each successful build was configured with
LOADED_LIBRARIES: list[str] = []
FAIL_CONTEXTS = False
EXECUTE_RAISES: Exception | None = None  # what execute_async_v3 raises, as the bindings can
_state: dict[str, Any] = {}
_memory: dict[int, np.ndarray] = {}  # address -> bytes
_streams: dict[int, HostStream] = {}
_addresses = itertools.count(0x7F0000000000, 1 << 20)


def reset(version: str = "10.13.0") -> None:
    global __version__, FAIL_CONTEXTS, EXECUTE_RAISES
    __version__, FAIL_CONTEXTS, EXECUTE_RAISES = version, False, None
    BUILDS.clear()
    LOADED_LIBRARIES.clear()
    _memory.clear()
    _streams.clear()
    _state.clear()
    _state["plugins"] = False


def _major() -> int:
    return int(__version__.split(".")[0])


# --- Enums, Dims, logging --------------------------------------------------------------------


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 5


class BuilderFlag(enum.IntEnum):
    FP16 = 0
    INT8 = 1
    REFIT = 3
    TF32 = 7
    OBEY_PRECISION_CONSTRAINTS = 10
    PREFER_PRECISION_CONSTRAINTS = 11
    VERSION_COMPATIBLE = 14
    FP8 = 16
    BF16 = 17
    STRIP_PLAN = 19
    REFIT_IDENTICAL = 20
    INT4 = 22
    FP4 = 25


PRECISION_FLAGS = {BuilderFlag.FP16, BuilderFlag.BF16, BuilderFlag.INT8, BuilderFlag.FP8, BuilderFlag.INT4, BuilderFlag.FP4}


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0


class ProfilingVerbosity(enum.IntEnum):
    LAYER_NAMES_ONLY = 0
    NONE = 1
    DETAILED = 2


class HardwareCompatibilityLevel(enum.IntEnum):
    NONE = 0
    AMPERE_PLUS = 1
    SAME_COMPUTE_CAPABILITY = 2


class LayerInformationFormat(enum.IntEnum):
    ONELINE = 0
    JSON = 1


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    BF16 = 7
    INT64 = 8


_FROM_ONNX = {
    onnx.TensorProto.FLOAT: DataType.FLOAT, onnx.TensorProto.FLOAT16: DataType.HALF, onnx.TensorProto.BFLOAT16: DataType.BF16,
    onnx.TensorProto.INT8: DataType.INT8, onnx.TensorProto.INT32: DataType.INT32, onnx.TensorProto.INT64: DataType.INT64,
    onnx.TensorProto.BOOL: DataType.BOOL, onnx.TensorProto.UINT8: DataType.UINT8,
}
_NUMPY = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT8: np.int8, DataType.INT32: np.int32,
          DataType.BOOL: np.bool_, DataType.UINT8: np.uint8, DataType.INT64: np.int64}


class Dims(tuple):
    def __new__(cls, shape: Any = ()) -> Self:
        return super().__new__(cls, (int(d) for d in shape))


class ILogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    def __init__(self) -> None:
        pass

    def log(self, severity: ILogger.Severity, msg: str) -> None:
        raise NotImplementedError


def _error(logger: ILogger, message: str) -> None:
    logger.log(ILogger.Severity.ERROR, message)


def _stream_handle(handle: Any, call: str) -> int:
    if not isinstance(handle, int) or isinstance(handle, bool):
        raise TypeError(f"{call}(): incompatible function arguments: stream_handle must be an int, got {type(handle).__name__}")
    return handle


# --- Plugins ---------------------------------------------------------------------------------


def init_libnvinfer_plugins(logger: Any, namespace: str) -> bool:
    _state["plugins"] = True
    return True


class IPluginRegistry:
    def load_library(self, plugin_path: str) -> object | None:
        if not os.path.isfile(plugin_path):
            return None
        LOADED_LIBRARIES.append(plugin_path)
        return object()


def get_plugin_registry() -> IPluginRegistry:
    return IPluginRegistry()


# --- Network and parser ----------------------------------------------------------------------


@dataclass
class ITensor:
    name: str
    dtype: DataType
    shape: Dims


@dataclass
class ILayer:
    name: str
    type: str
    outputs: list[str]
    precision: DataType = DataType.FLOAT
    precision_is_set: bool = False

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "precision" and "precision" in self.__dict__:
            object.__setattr__(self, "precision_is_set", True)
        object.__setattr__(self, key, value)


class INetworkDefinition:
    def __init__(self, flags: int):
        self.strongly_typed = bool(flags & (1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED)))
        self.model: onnx.ModelProto | None = None
        self.inputs: list[ITensor] = []
        self.outputs: list[ITensor] = []
        self.layers: list[ILayer] = []

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, index: int) -> ITensor:
        return self.inputs[index]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def get_layer(self, index: int) -> ILayer:
        return self.layers[index]


def _tensor(value_info: Any) -> ITensor:
    kind = value_info.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in kind.shape.dim]
    return ITensor(value_info.name, _FROM_ONNX[kind.elem_type], Dims(dims))


@dataclass
class ParserError:
    _desc: str
    _node: int = -1
    _name: str = ""
    _op: str = ""

    def node(self) -> int:
        return self._node

    def node_name(self) -> str:
        return self._name

    def node_operator(self) -> str:
        return self._op

    def desc(self) -> str:
        return self._desc


class OnnxParser:
    def __init__(self, network: INetworkDefinition, logger: ILogger):
        self._network, self._logger = network, logger
        self._errors: list[ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> ParserError:
        return self._errors[index]

    def parse_from_file(self, path: str) -> bool:
        model = onnx.load(path)
        for index, node in enumerate(model.graph.node):
            if node.op_type in PLUGIN_OPS and not _state["plugins"]:
                self._errors.append(ParserError(
                    "Plugin not found, are the plugin name, version, and namespace correct?", index, node.name, node.op_type))
        if self._errors:
            return False
        initializers = {init.name for init in model.graph.initializer}
        network = self._network
        network.model = model
        network.inputs = [_tensor(vi) for vi in model.graph.input if vi.name not in initializers]
        network.outputs = [_tensor(vi) for vi in model.graph.output]
        network.layers = [ILayer(node.name or f"node{i}", node.op_type, list(node.output)) for i, node in enumerate(model.graph.node)]
        return True


def _quantized_flags(model: onnx.ModelProto) -> set[BuilderFlag]:
    types = {init.name: init.data_type for init in model.graph.initializer}
    flags = set()
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zero_point = types.get(node.input[2]) if len(node.input) > 2 else None
            fp8 = zero_point in (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E5M2)
            flags.add(BuilderFlag.FP8 if fp8 else BuilderFlag.INT8)
    return flags


# --- Builder ----------------------------------------------------------------------------------


class IOptimizationProfile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[Dims, Dims, Dims]] = {}

    def set_shape(self, input: str, min: Dims, opt: Dims, max: Dims) -> None:
        self.shapes[input] = (Dims(min), Dims(opt), Dims(max))


class ITimingCache:
    def __init__(self, device: str):
        self.device = device

    def serialize(self) -> bytes:
        return CACHE_MAGIC + self.device.encode()


class IHostMemory:
    def __init__(self, data: bytes):
        self._data = data

    def __bytes__(self) -> bytes:
        return self._data


class IBuilderConfig:
    def __init__(self, network_holder: Builder):
        self._builder = network_holder
        self.flags: set[BuilderFlag] = {BuilderFlag.TF32}
        self.pools: dict[MemoryPoolType, int] = {}
        self.profiles: list[IOptimizationProfile] = []
        self.timing_cache: ITimingCache | None = None
        self.builder_optimization_level = 3
        self.hardware_compatibility_level = HardwareCompatibilityLevel.NONE
        self.profiling_verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY
        self.plugins_to_serialize: list[str] = []

    def set_memory_pool_limit(self, pool: MemoryPoolType, pool_size: int) -> None:
        self.pools[pool] = int(pool_size)

    def set_flag(self, flag: BuilderFlag) -> None:
        self.flags.add(flag)

    def clear_flag(self, flag: BuilderFlag) -> None:
        self.flags.discard(flag)

    def get_flag(self, flag: BuilderFlag) -> bool:
        return flag in self.flags

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        network = self._builder.last_network
        for tensor in network.inputs if network else []:
            if tensor.name not in profile.shapes:
                return -1
            low, opt, high = profile.shapes[tensor.name]
            if not len(low) == len(opt) == len(high) == len(tensor.shape):
                return -1
            for axis, fixed in enumerate(tensor.shape):
                if not low[axis] <= opt[axis] <= high[axis] or low[axis] < 0 or (fixed >= 0 and not low[axis] == high[axis] == fixed):
                    return -1
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, serialized_timing_cache: bytes) -> ITimingCache | None:
        data = bytes(serialized_timing_cache)
        if not data:
            return ITimingCache(DEVICE_NAME)
        if not data.startswith(CACHE_MAGIC):
            return None
        return ITimingCache(data[len(CACHE_MAGIC):].decode(errors="replace"))

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        if not isinstance(cache, ITimingCache):
            raise TypeError("set_timing_cache(): incompatible function arguments: cache must be an ITimingCache")
        if cache.device != DEVICE_NAME and not ignore_mismatch:
            return False
        self.timing_cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache:
        return self.timing_cache or ITimingCache(DEVICE_NAME)


class Builder:
    def __init__(self, logger: ILogger):
        self.logger = logger
        self.last_network: INetworkDefinition | None = None

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        self.last_network = INetworkDefinition(flags)
        return self.last_network

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig(self)

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def _refusal(self, network: INetworkDefinition, config: IBuilderConfig) -> str | None:
        if network.model is None:
            return "the network is empty (nothing was parsed)"
        if _major() >= 11 and not network.strongly_typed:
            return "TensorRT 11 builds strongly typed networks only"
        if config.pools.get(MemoryPoolType.WORKSPACE, MIN_POOL_BYTES) < MIN_POOL_BYTES:
            return f"workspace pool limit of {config.pools[MemoryPoolType.WORKSPACE]} bytes is below 1 MiB (limits are bytes)"
        if any(-1 in tensor.shape for tensor in network.inputs) and not config.profiles:
            return "Network has dynamic or shape inputs, but no optimization profile has been defined."
        precision_flags = config.flags & PRECISION_FLAGS
        if network.strongly_typed and precision_flags:
            return f"builder flags {sorted(f.name for f in precision_flags)} are not allowed with a strongly typed network"
        missing = _quantized_flags(network.model) - config.flags
        if not network.strongly_typed and missing:
            return f"Q/DQ layers need builder flag(s) {sorted(f.name for f in missing)} in a weakly typed network"
        for layer in network.layers:
            if not layer.precision_is_set:
                continue
            if network.strongly_typed:
                return f"layer {layer.name}: precision cannot be set on a strongly typed network"
            needs = {DataType.HALF: BuilderFlag.FP16, DataType.BF16: BuilderFlag.BF16}.get(layer.precision)
            if needs is not None and needs not in config.flags:
                return f"layer {layer.name}: precision {layer.precision.name} set, but {needs.name} is not enabled"
        return None

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        refusal = self._refusal(network, config)
        if refusal is not None:
            _error(self.logger, f"IBuilder::buildSerializedNetwork: Error Code 4: API Usage Error ({refusal})")
            return None
        assert network.model is not None
        header = {
            "inputs": [[t.name, int(t.dtype), list(t.shape)] for t in network.inputs],
            "outputs": [[t.name, int(t.dtype), list(t.shape)] for t in network.outputs],
            "profiles": [{n: [list(d) for d in s] for n, s in p.shapes.items()} for p in config.profiles],
            "flags": sorted(f.name for f in config.flags),
            "strongly_typed": network.strongly_typed,
            "detailed": config.profiling_verbosity == ProfilingVerbosity.DETAILED,
            "layers": [[layer.name, layer.type, layer.outputs, layer.precision.name] for layer in network.layers],
        }
        BUILDS.append({
            **header, "workspace_bytes": config.pools.get(MemoryPoolType.WORKSPACE),
            "builder_optimization_level": config.builder_optimization_level,
            "hardware_compatibility_level": config.hardware_compatibility_level.name,
            "plugins_to_serialize": list(config.plugins_to_serialize),
        })
        return IHostMemory(PLAN_MAGIC + json.dumps(header).encode() + b"\n" + network.model.SerializeToString())


# --- Runtime ---------------------------------------------------------------------------------


class Runtime:
    def __init__(self, logger: ILogger):
        self.logger = logger
        self.engine_host_code_allowed = False

    def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None:
        data = bytes(serialized_engine)
        if not data.startswith(PLAN_MAGIC):
            _error(self.logger, "IRuntime::deserializeCudaEngine: Error Code 1: Serialization (magic tag does not match)")
            return None
        header_text, _, model_bytes = data[len(PLAN_MAGIC):].partition(b"\n")
        header = json.loads(header_text)
        if "VERSION_COMPATIBLE" in header["flags"] and not self.engine_host_code_allowed:
            _error(self.logger, "IRuntime::deserializeCudaEngine: Error Code 1: a version-compatible engine needs "
                                "engine_host_code_allowed to be set")
            return None
        return ICudaEngine(header, model_bytes, self.logger)


class ICudaEngine:
    def __init__(self, header: dict[str, Any], model_bytes: bytes, logger: ILogger):
        import onnxruntime as ort

        self.header, self.logger = header, logger
        self.model = onnx.load_from_string(model_bytes)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        self.io = {name: (TensorIOMode.INPUT, DataType(dtype), Dims(shape)) for name, dtype, shape in header["inputs"]}
        self.io.update({name: (TensorIOMode.OUTPUT, DataType(dtype), Dims(shape)) for name, dtype, shape in header["outputs"]})
        self.stripped = "STRIP_PLAN" in header["flags"]
        self.refitted = False
        self.device_memory_size_v2 = 1 << 20

    @property
    def num_io_tensors(self) -> int:
        return len(self.io)

    @property
    def num_optimization_profiles(self) -> int:
        return len(self.header["profiles"])

    def get_tensor_name(self, index: int) -> str:
        return list(self.io)[index]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return self.io[name][0] if name in self.io else TensorIOMode.NONE

    def get_tensor_dtype(self, name: str) -> DataType:
        return self.io[name][1]

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Dims]:
        return [Dims(d) for d in self.header["profiles"][profile_index][name]]

    def create_execution_context(self) -> IExecutionContext | None:
        if FAIL_CONTEXTS:
            _error(self.logger, "ICudaEngine::createExecutionContext: Error Code 2: OutOfMemory (device memory)")
            return None
        return IExecutionContext(self)

    def create_engine_inspector(self) -> EngineInspector:
        return EngineInspector(self)


class EngineInspector:
    def __init__(self, engine: ICudaEngine):
        self._engine = engine
        self.execution_context: IExecutionContext | None = None

    def get_engine_information(self, format: LayerInformationFormat) -> str:
        header = self._engine.header
        if not header["detailed"]:
            return json.dumps({"Layers": [name for name, *_ in header["layers"]]})
        layers = [{"Name": name, "LayerType": kind, "TacticName": "double",
                   "Outputs": [{"Name": out, "Format/Datatype": f"Row major linear {precision}"} for out in outputs]}
                  for name, kind, outputs, precision in header["layers"]]
        return json.dumps({"Layers": layers, "Bindings": list(self._engine.io)})


class Refitter:
    def __init__(self, engine: ICudaEngine, logger: ILogger):
        self.engine, self.logger = engine, logger
        self.weights_from: str | None = None

    def refit_cuda_engine(self) -> bool:
        if self.weights_from is None:
            _error(self.logger, "IRefitter::refitCudaEngine: Error Code 3: missing weights (nothing was refitted)")
            return False
        self.engine.refitted = True
        return True


class OnnxParserRefitter:
    def __init__(self, refitter: Refitter, logger: ILogger):
        self.refitter = refitter

    def refit_from_file(self, model: str) -> bool:
        if not os.path.isfile(model):
            return False
        self.refitter.weights_from = model
        return True


class IOutputAllocator:
    def __init__(self) -> None:
        pass


def _infer_output_shapes(model: onnx.ModelProto, shapes: dict[str, Dims]) -> dict[str, Dims]:
    """Output shapes by ONNX shape inference with the inputs' shapes fixed; -1 where it cannot tell."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        if value.name in shapes:
            for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
                dim.Clear()
                dim.dim_value = size
    for value in fixed.graph.output:
        value.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(fixed, strict_mode=False)
    result = {}
    for value in inferred.graph.output:
        dims = value.type.tensor_type.shape.dim
        result[value.name] = Dims(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
    return result


class IExecutionContext:
    def __init__(self, engine: ICudaEngine):
        self.engine = engine
        self.logger = engine.logger
        self.profile = 0
        self.input_shapes: dict[str, Dims] = {}
        self.addresses: dict[str, int] = {}
        self.allocators: dict[str, Any] = {}
        self.runs = 0
        self._inferred: dict[tuple[tuple[str, Dims], ...], dict[str, Dims]] = {}

    def _output_shapes(self) -> dict[str, Dims]:
        key = tuple(sorted(self.input_shapes.items()))
        if key not in self._inferred:
            self._inferred[key] = _infer_output_shapes(self.engine.model, self.input_shapes)
        return self._inferred[key]

    def _error(self, message: str) -> None:
        _error(self.logger, f"IExecutionContext: Error Code 3: API Usage Error ({message})")

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        _stream_handle(stream_handle, "set_optimization_profile_async")
        if not 0 <= profile_index < self.engine.num_optimization_profiles:
            self._error(f"profile index {profile_index} is out of range")
            return False
        self.profile, self.input_shapes = profile_index, {}
        return True

    def set_input_shape(self, name: str, shape: Any) -> bool:
        if self.engine.get_tensor_mode(name) != TensorIOMode.INPUT:
            self._error(f"'{name}' is not an input")
            return False
        low, _, high = self.engine.get_tensor_profile_shape(name, self.profile)
        dims = Dims(shape)
        if len(dims) != len(low) or not all(a <= d <= b for a, d, b in zip(low, dims, high)):
            self._error(f"shape {list(dims)} of '{name}' is outside profile {self.profile}: min {list(low)}, max {list(high)}")
            return False
        self.input_shapes[name] = dims
        return True

    def _inputs(self) -> list[str]:
        return [n for n, (mode, _, _) in self.engine.io.items() if mode == TensorIOMode.INPUT]

    def _outputs(self) -> list[str]:
        return [n for n, (mode, _, _) in self.engine.io.items() if mode == TensorIOMode.OUTPUT]

    def get_tensor_shape(self, name: str) -> Dims:
        if self.engine.get_tensor_mode(name) == TensorIOMode.INPUT:
            return self.input_shapes.get(name, self.engine.io[name][2])
        unset = [n for n in self._inputs() if n not in self.input_shapes]
        if unset:
            self._error(f"output shape of '{name}' read before input shape(s) {unset} were set")
            return Dims([-1] * len(self.engine.io[name][2]))
        return self._output_shapes()[name]

    def set_tensor_address(self, name: str, memory: int) -> bool:
        if name not in self.engine.io:
            self._error(f"no tensor named '{name}'")
            return False
        self.addresses[name] = int(memory)
        return True

    def set_output_allocator(self, name: str, output_allocator: IOutputAllocator) -> bool:
        if self.engine.get_tensor_mode(name) != TensorIOMode.OUTPUT:
            self._error(f"'{name}' is not an output")
            return False
        self.allocators[name] = output_allocator
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        handle = _stream_handle(stream_handle, "execute_async_v3")
        if EXECUTE_RAISES is not None:
            raise EXECUTE_RAISES
        problem = self._precondition()
        stream = _streams.get(handle)
        if problem is None and stream is not None and stream.capturing is not None:
            if not self.runs:
                problem = "enqueue once before capturing a CUDA graph"
            elif self.allocators:
                problem = "a CUDA graph cannot capture outputs with an output allocator (data-dependent shapes)"
        if problem is not None:
            self._error(problem)
            return False
        if stream is not None and stream.capturing is not None:
            stream.capturing.append(lambda: self._run(handle))
        else:
            self._run(handle)
        return True

    def _precondition(self) -> str | None:
        if self.engine.stripped and not self.engine.refitted:
            return "the engine is weight-stripped and was not refitted"
        unset = [n for n in self._inputs() if n not in self.input_shapes]
        if unset:
            return f"input shape(s) of {unset} not set"
        for name in self.engine.io:
            if name not in self.addresses and name not in self.allocators:
                return f"neither an address nor an output allocator is set for tensor '{name}'"
        shapes = self._output_shapes()
        for name in self._inputs() + [n for n in self._outputs() if n not in self.allocators]:
            shape = self.input_shapes[name] if name in self.input_shapes else shapes[name]
            if -1 in shape:
                return f"output '{name}' has a data-dependent shape and needs an output allocator"
            needed = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NUMPY[self.engine.io[name][1]]).itemsize
            buffer = _memory.get(self.addresses[name])
            if buffer is None or buffer.size < needed:
                return f"tensor '{name}' is bound to {hex(self.addresses[name])}, which holds no {needed}-byte buffer"
        return None

    def _run(self, handle: int) -> None:
        feed = {}
        for name in self._inputs():
            dtype = _NUMPY[self.engine.io[name][1]]
            shape = self.input_shapes[name]
            feed[name] = np.frombuffer(_memory[self.addresses[name]].tobytes(), dtype=dtype,
                                       count=int(np.prod(shape, dtype=np.int64))).reshape(shape)
        names = self._outputs()
        for name, value in zip(names, self.engine.session.run(names, feed)):
            data = np.ascontiguousarray(value, dtype=_NUMPY[self.engine.io[name][1]]).reshape(-1).view(np.uint8)
            if name in self.allocators:
                allocator = self.allocators[name]
                address = allocator.reallocate_output_async(name, 0, max(data.size, 1), 256, handle)
                if address not in _memory or _memory[address].size < data.size:
                    raise AssertionError(f"the output allocator returned {hex(address)}, which holds no {data.size}-byte buffer")
                allocator.notify_shape(name, Dims(value.shape))
                address_to = address
            else:
                address_to = self.addresses[name]
            _memory[address_to][: data.size] = data
        self.runs += 1


# --- The device ------------------------------------------------------------------------------


class HostStream:
    def __init__(self) -> None:
        self.handle = next(_addresses)
        self.capturing: list[Callable[[], None]] | None = None
        _streams[self.handle] = self

    def synchronize(self) -> None:
        pass


class HostBuffer:
    def __init__(self, nbytes: int):
        self.address = next(_addresses)
        self.nbytes = max(int(nbytes), 1)
        _memory[self.address] = np.zeros(self.nbytes, dtype=np.uint8)

    def read(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(_memory[self.address].tobytes(), dtype=dtype, count=count).reshape(shape).copy()


class HostEvent:
    def __init__(self) -> None:
        self.time: float | None = None

    def record(self, stream: HostStream) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_ms(self, end: HostEvent) -> float:
        assert self.time is not None and end.time is not None, "elapsed time of an event that was never recorded"
        return (end.time - self.time) * 1000.0


@dataclass
class HostGraph:
    launches: list[Callable[[], None]] = field(default_factory=list)
    replays: int = 0

    def replay(self, stream: HostStream) -> None:
        self.replays += 1
        for launch in self.launches:
            launch()


class HostDevice:
    """dtrain_engine.device.Device in host memory; buffers are where the double's context reads and writes."""

    def __init__(self, compute_capability: tuple[int, int] = (9, 0)):
        self.name = DEVICE_NAME
        self.compute_capability = compute_capability
        self.torch_device = "cpu"
        self.graphs: list[HostGraph] = []

    def stream(self) -> HostStream:
        return HostStream()

    def upload(self, array: np.ndarray, stream: HostStream) -> HostBuffer:
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        buffer = HostBuffer(data.size)
        _memory[buffer.address][: data.size] = data
        return buffer

    def allocate(self, nbytes: int) -> HostBuffer:
        return HostBuffer(nbytes)

    def event(self) -> HostEvent:
        return HostEvent()

    def capture(self, stream: HostStream, launch: Callable[[], None]) -> HostGraph:
        stream.capturing = []
        try:
            launch()
            graph = HostGraph(stream.capturing)
        finally:
            stream.capturing = None
        self.graphs.append(graph)
        return graph


reset()
