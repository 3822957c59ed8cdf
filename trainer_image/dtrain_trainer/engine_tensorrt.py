"""Everything that touches TensorRT: parse the ONNX model, build a serialized engine, run it.

Written against the TensorRT 10 Python API and type-checked with mypy against
tensorrt-stubs (tests/engine/test_engine_mypy.py); TensorRT 11 takes the same calls
except the precision builder flags it removed (see engine_model.plan_precision).
Import this module only after `probe_tensorrt()` said TensorRT is there.

Device memory and the CUDA stream come from PyTorch (the engine image carries it for the
eager baseline anyway), so no second CUDA binding is needed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import tensorrt as trt

from .engine_check import Arrays
from .engine_model import BatchSizes, EngineError, OnnxModelInfo, PrecisionPlan, describe_parser_error

# Every module attribute, enum member and method this module uses, by the TensorRT majors
# that have it. tests/engine walks these on the real module where TensorRT imports (API
# drift such as the removed `Builder.max_batch_size` fails there) and in the stubs here.
TENSORRT_API: dict[str, tuple[int, ...]] = {
    "__version__": (10, 11),
    "Logger": (10, 11),
    "Logger.WARNING": (10, 11),
    "Builder": (10, 11),
    "Builder.create_network": (10, 11),
    "Builder.create_builder_config": (10, 11),
    "Builder.create_optimization_profile": (10, 11),
    "Builder.build_serialized_network": (10, 11),
    "NetworkDefinitionCreationFlag.STRONGLY_TYPED": (10, 11),
    "INetworkDefinition.num_inputs": (10, 11),
    "INetworkDefinition.get_input": (10, 11),
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
    "IBuilderConfig.add_optimization_profile": (10, 11),
    "IBuilderConfig.create_timing_cache": (10, 11),
    "IBuilderConfig.set_timing_cache": (10, 11),
    "IBuilderConfig.get_timing_cache": (10, 11),
    "ITimingCache.serialize": (10, 11),
    "IOptimizationProfile.set_shape": (10, 11),
    "MemoryPoolType.WORKSPACE": (10, 11),
    "BuilderFlag.FP16": (10,),
    "BuilderFlag.BF16": (10,),
    "BuilderFlag.INT8": (10,),
    "Dims": (10, 11),
    "Runtime": (10, 11),
    "Runtime.deserialize_cuda_engine": (10, 11),
    "ICudaEngine.num_io_tensors": (10, 11),
    "ICudaEngine.get_tensor_name": (10, 11),
    "ICudaEngine.get_tensor_mode": (10, 11),
    "ICudaEngine.get_tensor_dtype": (10, 11),
    "ICudaEngine.create_execution_context": (10, 11),
    "TensorIOMode.INPUT": (10, 11),
    "IExecutionContext.set_input_shape": (10, 11),
    "IExecutionContext.get_tensor_shape": (10, 11),
    "IExecutionContext.set_tensor_address": (10, 11),
    "IExecutionContext.execute_async_v3": (10, 11),
    "DataType.FLOAT": (10, 11),
    "DataType.HALF": (10, 11),
    "DataType.BF16": (10, 11),
    "DataType.INT8": (10, 11),
    "DataType.INT32": (10, 11),
    "DataType.INT64": (10, 11),
    "DataType.BOOL": (10, 11),
    "DataType.UINT8": (10, 11),
}


def tensorrt_major() -> int:
    version: str = trt.__version__
    return int(version.split(".")[0])


def _builder_flags(plan: PrecisionPlan) -> list[trt.BuilderFlag]:
    """The TensorRT 10 flags of a plan; on TensorRT 11 plans carry none (the enum members are gone)."""
    if not plan.builder_flags:
        return []
    by_name = {"FP16": trt.BuilderFlag.FP16, "BF16": trt.BuilderFlag.BF16, "INT8": trt.BuilderFlag.INT8}
    return [by_name[name] for name in plan.builder_flags]


@dataclass(frozen=True)
class BuildResult:
    plan: bytes
    seconds: float
    timing_cache: Optional[str]  # what happened to the timing cache, for the report


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
        else f"TensorRT's ONNX parser rejected {onnx_path} without saying why (see its log above)"
    )


def _load_timing_cache(config: trt.IBuilderConfig, path: Optional[str]) -> tuple[trt.ITimingCache, str]:
    data = b""
    state = "none"
    if path is not None and os.path.isfile(path):
        with open(path, "rb") as handle:
            data = handle.read()
        state = f"read {len(data)} bytes from {path}"
    cache = config.create_timing_cache(data)
    if not config.set_timing_cache(cache, False):
        # A cache from another GPU or TensorRT version: start afresh rather than mix timings.
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)
        state = f"{path} was made by another GPU or TensorRT version; started a new one"
    return cache, state


def _save_timing_cache(config: trt.IBuilderConfig, path: str) -> int:
    data = bytes(config.get_timing_cache().serialize())
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)
    return len(data)


def build_engine(
    onnx_path: str,
    model: OnnxModelInfo,
    batches: BatchSizes,
    plan: PrecisionPlan,
    workspace_mib: int,
    timing_cache_path: Optional[str],
) -> BuildResult:
    """Parse `onnx_path` (the model as given, or its converted copy) and build a serialized engine."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # Every network is explicit-batch since TensorRT 10 (the flag is gone); the batch range
    # comes from the optimization profile below.
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if plan.strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    _parse(parser, onnx_path)

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    for flag in _builder_flags(plan):
        config.set_flag(flag)

    if model.dynamic_batch:
        profile = builder.create_optimization_profile()
        by_name = {tensor.name: tensor for tensor in model.inputs}
        for index in range(network.num_inputs):
            name = network.get_input(index).name
            if name not in by_name:
                raise EngineError(f"TensorRT sees an input '{name}' that the ONNX model does not declare")
            sample = list(by_name[name].sample_shape)
            low, opt, high = (trt.Dims([batch, *sample]) for batch in (batches.min, batches.opt, batches.max))
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)

    cache_state: Optional[str] = None
    if timing_cache_path is not None:
        _, cache_state = _load_timing_cache(config, timing_cache_path)

    start = time.perf_counter()
    serialized: Optional[trt.IHostMemory] = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - start
    if serialized is None:
        raise EngineError("TensorRT could not build the engine (its log above says why)")
    if timing_cache_path is not None:
        written = _save_timing_cache(config, timing_cache_path)
        cache_state = f"{cache_state}; wrote {written} bytes to {timing_cache_path}"
    return BuildResult(bytes(serialized), seconds, cache_state)


class TensorRTEngine:
    """A deserialized engine on the current CUDA device, run on its own stream."""

    name = "tensorrt"

    def __init__(self, plan: bytes):
        import torch

        self._torch = torch
        self._device = torch.device("cuda")
        self._stream = torch.cuda.Stream()
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine: Optional[trt.ICudaEngine] = self._runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise EngineError("TensorRT cannot load the engine it has just built")
        self._engine = engine
        self._context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]
        self._timed_buffers: dict[str, Any] = {}
        self._dtypes = {
            trt.DataType.FLOAT: torch.float32,
            trt.DataType.HALF: torch.float16,
            trt.DataType.BF16: torch.bfloat16,
            trt.DataType.INT8: torch.int8,
            trt.DataType.INT32: torch.int32,
            trt.DataType.INT64: torch.int64,
            trt.DataType.BOOL: torch.bool,
            trt.DataType.UINT8: torch.uint8,
        }

    def _torch_dtype(self, name: str) -> Any:
        dtype = self._engine.get_tensor_dtype(name)
        if dtype not in self._dtypes:
            raise EngineError(f"engine tensor '{name}' has type {dtype}, which the check cannot feed or read")
        return self._dtypes[dtype]

    def _bind(self, inputs: Arrays) -> dict[str, Any]:
        """Device copies of the inputs and fresh output buffers, with their addresses set on the context."""
        torch = self._torch
        missing = [n for n in self._inputs if n not in inputs]
        if missing:
            raise EngineError(f"the engine expects input(s) {missing} that the batch does not have")
        bound: dict[str, Any] = {}
        with torch.cuda.stream(self._stream):
            for name in self._inputs:
                array = np.ascontiguousarray(inputs[name])
                tensor = torch.from_numpy(array).to(self._device, dtype=self._torch_dtype(name))
                if not self._context.set_input_shape(name, tuple(array.shape)):
                    raise EngineError(f"the engine does not accept input '{name}' with shape {list(array.shape)}")
                bound[name] = tensor
            for name in self._outputs:
                dims = self._context.get_tensor_shape(name)
                shape = [dims[i] for i in range(len(dims))]
                bound[name] = torch.empty(shape, dtype=self._torch_dtype(name), device=self._device)
        for name, tensor in bound.items():
            self._context.set_tensor_address(name, int(tensor.data_ptr()))
        self._stream.synchronize()
        return bound

    def _execute(self) -> None:
        if not self._context.execute_async_v3(self._stream.cuda_stream):
            raise EngineError("TensorRT failed to run the engine (its log above says why)")
        self._stream.synchronize()

    def infer(self, inputs: Arrays) -> dict[str, np.ndarray]:
        bound = self._bind(inputs)
        self._execute()
        return {name: bound[name].float().cpu().numpy() for name in self._outputs}

    def prepare_timed_run(self, inputs: Arrays) -> Callable[[], None]:
        # The context holds raw addresses: the bound tensors must live as long as the runs do.
        self._timed_buffers = self._bind(inputs)
        return self._execute
