"""A behavioural double of the TensorRT Python API and of the CUDA device, used only in tests.

The `tensorrt_double` fixture makes `import tensorrt` resolve to this package, so
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

The double's parts, one module each: basics (constants, enums, Dims, logging, shared state),
network (plugins, network definition, ONNX parser), builder, runtime (engine, inspector,
refitting, execution context) and device (the host-memory CUDA device). This package is what
`import tensorrt` finds: it re-exports their API and holds the state tests rebind.
"""

from __future__ import annotations

from tensorrt_double.basics import (
    BUILDS,
    CACHE_MAGIC,
    DEVICE_NAME,
    LOADED_LIBRARIES,
    MIN_POOL_BYTES,
    PLAN_MAGIC,
    PLUGIN_OPS,
    PRECISION_FLAGS,
    BuilderFlag,
    DataType,
    Dims,
    HardwareCompatibilityLevel,
    ILogger,
    LayerInformationFormat,
    MemoryPoolType,
    NetworkDefinitionCreationFlag,
    ProfilingVerbosity,
    TensorIOMode,
    _memory,
    _state,
    _streams,
)
from tensorrt_double.builder import Builder, IBuilderConfig, IHostMemory, IOptimizationProfile, ITimingCache
from tensorrt_double.device import HostBuffer, HostDevice, HostEvent, HostGraph, HostStream
from tensorrt_double.network import (
    ILayer,
    INetworkDefinition,
    IPluginRegistry,
    ITensor,
    OnnxParser,
    ParserError,
    get_plugin_registry,
    init_libnvinfer_plugins,
)
from tensorrt_double.runtime import (
    EngineInspector,
    ICudaEngine,
    IExecutionContext,
    IOutputAllocator,
    OnnxParserRefitter,
    Refitter,
    Runtime,
)

__all__ = [
    "BUILDS", "CACHE_MAGIC", "DEVICE_NAME", "EXECUTE_RAISES", "FAIL_CONTEXTS", "LOADED_LIBRARIES", "MIN_POOL_BYTES",
    "PLAN_MAGIC", "PLUGIN_OPS", "PRECISION_FLAGS", "Builder", "BuilderFlag", "DataType", "Dims", "EngineInspector",
    "HardwareCompatibilityLevel", "HostBuffer", "HostDevice", "HostEvent", "HostGraph", "HostStream", "IBuilderConfig",
    "ICudaEngine", "IExecutionContext", "IHostMemory", "ILayer", "ILogger", "INetworkDefinition", "IOptimizationProfile",
    "IOutputAllocator", "IPluginRegistry", "ITensor", "ITimingCache", "LayerInformationFormat", "MemoryPoolType",
    "NetworkDefinitionCreationFlag", "OnnxParser", "OnnxParserRefitter", "ParserError", "ProfilingVerbosity", "Refitter",
    "Runtime", "TensorIOMode", "get_plugin_registry", "init_libnvinfer_plugins", "reset",
]

# Test-visible state that tests and the code under test read from this module, reset by reset().
__version__ = "10.13.0"
FAIL_CONTEXTS = False
EXECUTE_RAISES: Exception | None = None  # what execute_async_v3 raises, as the bindings can


def reset(version: str = "10.13.0") -> None:
    global __version__, FAIL_CONTEXTS, EXECUTE_RAISES
    __version__, FAIL_CONTEXTS, EXECUTE_RAISES = version, False, None
    BUILDS.clear()
    LOADED_LIBRARIES.clear()
    _memory.clear()
    _streams.clear()
    _state.clear()
    _state["plugins"] = False


reset()
