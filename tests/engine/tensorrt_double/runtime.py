"""The TensorRT double's runtime: deserialisation, the engine, its inspector, refitting and execution contexts."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import onnx
import tensorrt_double
from tensorrt_double.basics import (
    _NUMPY,
    PLAN_MAGIC,
    DataType,
    Dims,
    ILogger,
    LayerInformationFormat,
    TensorIOMode,
    _error,
    _memory,
    _stream_handle,
    _streams,
)

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
        if tensorrt_double.FAIL_CONTEXTS:
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
        if tensorrt_double.EXECUTE_RAISES is not None:
            raise tensorrt_double.EXECUTE_RAISES
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
