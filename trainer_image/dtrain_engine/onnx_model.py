"""What `dtrain build-engine` reads from the ONNX model before it runs anything: its inputs
and outputs (with every dynamic axis), its explicit quantization and the quantized types,
the external data files beside it, and the batch sizes a default profile serves.

Everything here is pure or reads only the ONNX file (never its weights), so the decisions
are tested on machines without TensorRT or a GPU. build_plan.py decides the build from it.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from dtrain_common.onnx_files import external_data_files
from dtrain_operator.api.artifacts import DEFAULT_MAX_BATCH, DEFAULT_MIN_BATCH
from dtrain_operator.api.common import EnginePrecision as Precision

EXIT_CHECK_FAILED = 1  # the build, the accuracy check or a runtime failed
EXIT_USAGE = 2  # bad arguments or an input the command cannot use
EXIT_UNAVAILABLE = 3  # TensorRT or a CUDA GPU is missing and no fallback was asked for

# Max relative error (max|y - y_ref| / max|y_ref|) allowed against a reference, by the
# precision the model under test ran in. int8 has no bound in the issue: 5e-2 is ours, and
# so are fp8's (the same 8 bits), int4/fp4's (weight-only or 4-bit: twice as loose) and
# tf32's (a 10-bit mantissa, as fp16's).
ACCURACY_BOUNDS: dict[str, float] = {
    "fp32": 1e-3, "tf32": 2e-2, "fp16": 2e-2, "bf16": 2e-2, "int8": 5e-2, "fp8": 5e-2, "int4": 1e-1, "fp4": 1e-1,
}

ENGINE_SUFFIXES = (".plan", ".engine", ".trt")
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# What random batches can be made of. TensorRT has no float64: such an input is refused.
INPUT_DTYPES = frozenset({"float16", "float32"})
# ONNX element types of quantized tensors -> TensorRT's name for the quantized type.
QUANTIZED_TYPE_NAMES = {
    "INT8": "INT8", "UINT8": "INT8", "FLOAT8E4M3FN": "FP8", "FLOAT8E4M3FNUZ": "FP8", "FLOAT8E5M2": "FP8",
    "FLOAT8E5M2FNUZ": "FP8", "INT4": "INT4", "UINT4": "INT4", "FLOAT4E2M1": "FP4",
}


class EngineError(Exception):
    """A failure the user can act on: printed as one line (or a short list), never a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_CHECK_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


def usage_error(message: str) -> EngineError:
    return EngineError(message, EXIT_USAGE)


# --- The ONNX model -------------------------------------------------------------------


Dim = int | str  # a fixed size, or the name of a symbolic (dynamic) dimension
Shape = tuple[int, ...]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # numpy dtype name, e.g. "float32"
    shape: tuple[Dim, ...]

    @property
    def dynamic_axes(self) -> list[int]:
        return [i for i, d in enumerate(self.shape) if not isinstance(d, int)]

    @property
    def exact(self) -> bool:
        """Integer and boolean tensors (indices, masks) are compared for equality, never within a bound."""
        return np.dtype(self.dtype).kind in "iub" if self.dtype != "bfloat16" else False

    def describe(self) -> str:
        return f"'{self.name}' {list(self.shape)} {self.dtype}"


@dataclass(frozen=True)
class OnnxModelInfo:
    path: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    opset: int
    static_batch: int | None  # None: the batch axis is dynamic (or an input has no fixed batch)
    quantized_types: frozenset[str]  # TensorRT names of the Q/DQ types (INT8, FP8, INT4, FP4); empty: no Q/DQ
    weight_types: frozenset[str]  # numpy names of the floating-point initializer types
    external_data: tuple[str, ...] = ()  # paths of the files holding the weights outside the graph

    @property
    def quantized(self) -> bool:
        """Explicitly quantized: it has QuantizeLinear/DequantizeLinear nodes."""
        return bool(self.quantized_types)

    @property
    def dynamic_batch(self) -> bool:
        return self.static_batch is None

    @property
    def data_dependent_outputs(self) -> tuple[str, ...]:
        """Outputs with an axis named by no input: their size depends on the values (NonZero, NMS)."""
        input_dims = {d for t in self.inputs for d in t.shape if isinstance(d, str)}
        return tuple(t.name for t in self.outputs if any(isinstance(d, str) and d not in input_dims for d in t.shape))

    @property
    def exported_precision(self) -> str:
        """The precision the model runs in as it is, e.g. under ONNX Runtime."""
        if self.quantized:
            return quantized_precision(self.quantized_types)
        if "float16" in self.weight_types:
            return "fp16"
        if "bfloat16" in self.weight_types:
            return "bf16"
        return "fp32"


def quantized_precision(types: frozenset[str]) -> str:
    """The loosest of the quantized types, by its accuracy bound ("int8", "fp8", "int4", "fp4")."""
    return max((t.lower() for t in types), key=lambda name: ACCURACY_BOUNDS[name])


def _dims(value_info: object) -> tuple[Dim, ...]:
    shape = value_info.type.tensor_type.shape  # type: ignore[attr-defined]
    dims: list[Dim] = []
    for index, dim in enumerate(shape.dim):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or f"unknown{index}")
    return tuple(dims)


def _numpy_dtype_name(elem_type: int) -> str:
    import onnx

    if elem_type == onnx.TensorProto.BFLOAT16:
        return "bfloat16"  # numpy has no bfloat16; the name is still what the report shows
    return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name)


def _quantized_types(graph: Any, functions: Any) -> frozenset[str]:
    """The quantized types of the Q/DQ nodes: QuantizeLinear's zero point or output_dtype (uint8 when
    neither is given, as ONNX defines), DequantizeLinear's quantized input."""
    import onnx

    element_types = {init.name: init.data_type for init in graph.initializer}
    element_types.update({vi.name: vi.type.tensor_type.elem_type for vi in (*graph.input, *graph.value_info)})
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
            element_types[node.output[0]] = node.attribute[0].t.data_type
    found: set[str] = set()
    nodes = [*graph.node, *(node for function in functions for node in function.node)]
    for node in nodes:
        if node.op_type not in QDQ_OPS:
            continue
        candidates = [node.input[2]] if len(node.input) > 2 and node.input[2] else []
        if node.op_type == "DequantizeLinear":
            candidates.insert(0, node.input[0])
        element: int | None = next((element_types[c] for c in candidates if c in element_types), None)
        if element is None and node.op_type == "QuantizeLinear":
            output_dtype = next((a.i for a in node.attribute if a.name == "output_dtype" and a.i), None)
            element = output_dtype or onnx.TensorProto.UINT8
        name = onnx.TensorProto.DataType.Name(element) if element is not None else "INT8"
        found.add(QUANTIZED_TYPE_NAMES.get(name, "INT8"))
    return frozenset(found)


def _load_checked(path: str) -> Any:
    """The model's graph (without its weights), once the ONNX checker passes it."""
    import onnx
    from google.protobuf.message import DecodeError

    if not os.path.exists(path):
        raise usage_error(f"--onnx {path}: no such file")
    if os.path.isdir(path):
        raise usage_error(f"--onnx {path} is a directory: give the model file, e.g. {os.path.join(path, 'model.onnx')}")
    try:
        model = onnx.load(path, load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as error:
        raise usage_error(f"--onnx {path} is not an ONNX model: it does not parse as one ({type(error).__name__})")
    if not model.graph.node or not model.graph.output:
        raise usage_error(f"--onnx {path} is not an ONNX model: it has no graph")
    try:
        onnx.checker.check_model(path)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise usage_error(f"--onnx {path} is not a valid ONNX model: {first_line}")
    return model


def _static_batch(path: str, inputs: tuple[TensorInfo, ...]) -> int | None:
    """The inputs are float batches that agree on their batch size: that size when fixed, None when dynamic."""
    if not inputs:
        raise usage_error(f"--onnx {path} has no inputs: build-engine needs a model that takes a batch")
    for tensor in inputs:
        if tensor.dtype == "float64":
            raise usage_error(
                f"--onnx {path}: input {tensor.describe()} is float64, which TensorRT does not have; "
                "export the model in float32"
            )
        if tensor.dtype not in INPUT_DTYPES:
            raise usage_error(
                f"--onnx {path}: input {tensor.describe()} is not float16/32; "
                "build-engine checks models with random float batches"
            )
        if len(tensor.shape) < 1:
            raise usage_error(f"--onnx {path}: input {tensor.describe()} has no batch axis")

    batch_dims = {tensor.shape[0] for tensor in inputs}
    fixed = {d for d in batch_dims if isinstance(d, int)}
    if fixed and len(fixed) != len(batch_dims):
        raise usage_error(f"--onnx {path}: some inputs have a fixed batch axis and others a dynamic one")
    if len(fixed) > 1:
        raise usage_error(f"--onnx {path}: inputs disagree on the batch size: {sorted(fixed)}")
    return next(iter(fixed)) if fixed else None


def inspect_onnx(path: str) -> OnnxModelInfo:
    """The model's inputs, outputs and batch axis; a usage EngineError for a file that is not a usable ONNX model.

    The weights are never loaded: a model over 2 GB keeps them in external data files, which
    the checker reads by path as TensorRT's parser does."""
    import onnx

    model = _load_checked(path)
    initializer_names = {init.name for init in model.graph.initializer}
    inputs = tuple(
        TensorInfo(vi.name, _numpy_dtype_name(vi.type.tensor_type.elem_type), _dims(vi))
        for vi in model.graph.input
        if vi.name not in initializer_names
    )
    outputs = tuple(
        TensorInfo(vi.name, _numpy_dtype_name(vi.type.tensor_type.elem_type), _dims(vi)) for vi in model.graph.output
    )
    static_batch = _static_batch(path, inputs)

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    float_types = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    weight_types = frozenset(
        _numpy_dtype_name(init.data_type) for init in model.graph.initializer if init.data_type in float_types
    )
    return OnnxModelInfo(
        path=path,
        inputs=inputs,
        outputs=outputs,
        opset=opset,
        static_batch=static_batch,
        quantized_types=_quantized_types(model.graph, model.functions),
        weight_types=weight_types,
        external_data=external_data_files(model, os.path.dirname(path)),
    )


# --- Batch sizes ------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchSizes:
    min: int
    opt: int
    max: int

    def distinct(self) -> list[int]:
        """The batch sizes that are checked and timed: min, opt and max, each once."""
        return sorted({self.min, self.opt, self.max})


def check_batch_flags(min_batch: int | None, opt_batch: int | None, max_batch: int | None) -> None:
    """The checks that need no model: sizes >= 1 and min <= opt <= max among the flags given."""
    for flag, value in (("--min-batch", min_batch), ("--opt-batch", opt_batch), ("--max-batch", max_batch)):
        if value is not None and value < 1:
            raise usage_error(f"{flag} {value}: a batch size must be at least 1")
    pairs = (
        ("--min-batch", min_batch, "--opt-batch", opt_batch),
        ("--opt-batch", opt_batch, "--max-batch", max_batch),
        ("--min-batch", min_batch, "--max-batch", max_batch),
    )
    for low_flag, low, high_flag, high in pairs:
        if low is not None and high is not None and low > high:
            raise usage_error(
                f"{low_flag} {low} is larger than {high_flag} {high}: need --min-batch <= --opt-batch <= --max-batch"
            )


def resolve_batch_sizes(
    model: OnnxModelInfo, min_batch: int | None, opt_batch: int | None, max_batch: int | None
) -> BatchSizes:
    """The min/opt/max batch sizes to build and check; a static-batch model serves only its own batch."""
    check_batch_flags(min_batch, opt_batch, max_batch)
    if model.static_batch is not None:
        batch = model.static_batch
        for flag, value in (("--min-batch", min_batch), ("--opt-batch", opt_batch), ("--max-batch", max_batch)):
            if value is not None and value != batch:
                shapes = ", ".join(t.describe() for t in model.inputs)
                raise usage_error(
                    f"{model.path} has a static batch size of {batch} (input {shapes}), "
                    f"so {flag} {value} does not fit: use --min-batch {batch} --opt-batch {batch} --max-batch {batch}, "
                    "or re-export the model "
                    "with a dynamic batch axis (spec.export.onnx.dynamicBatch: true)"
                )
        return BatchSizes(batch, batch, batch)
    low = min_batch if min_batch is not None else DEFAULT_MIN_BATCH
    high = max_batch if max_batch is not None else max(DEFAULT_MAX_BATCH, opt_batch or 0, low)
    opt = opt_batch if opt_batch is not None else high
    check_batch_flags(low, opt, high)
    return BatchSizes(low, opt, high)


# --- Precision ------------------------------------------------------------------------

SUPPORTED_TENSORRT_MAJORS = (10, 11)


def require_quantized_for_int8(precision: Precision, model: OnnxModelInfo) -> None:
    """INT8 without calibration data is only right for a model that carries its own quantization."""
    if precision == "int8" and not model.quantized:
        raise usage_error(
            f"--precision int8 needs a quantized ONNX model (QuantizeLinear/DequantizeLinear nodes), and {model.path} "
            "has none; dtrain does no INT8 calibration: quantize the model first (e.g. NVIDIA ModelOpt) or use fp16"
        )


def convert_to_float16(source: str, destination: str) -> None:
    """Rewrite an fp32 ONNX model to fp16 for a strongly typed build (TensorRT 11).

    onnxruntime's converter keeps ops that are unsafe in fp16 (its block list) in fp32 with
    Cast nodes around them, and keeps the model's inputs and outputs fp32 so that callers
    feed the same batches as before. Everything goes by path, never through one serialized
    proto, so that a model over 2 GB converts: the converter infers shapes by path, the
    weights go to a side file, and the checker reads the result by path. Never called for a
    Q/DQ graph (engine_plan refuses to): ONNX Runtime rejects what the converter makes of one.
    """
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    converted = convert_float_to_float16(source, keep_io_types=True)
    # The converter appends the Casts of the kept fp32 inputs after their consumers.
    _sort_topologically(converted.graph)
    onnx.save_model(
        converted,
        destination,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=os.path.basename(destination) + ".weights",
    )
    onnx.checker.check_model(destination)


def _sort_topologically(graph: Any) -> None:
    """Reorder the graph's nodes so that each follows the nodes producing its inputs (Kahn's algorithm,
    keeping the original order among nodes that are ready together)."""
    available = {value.name for value in graph.input} | {init.name for init in graph.initializer} | {""}
    nodes = list(graph.node)
    waiting = [{name for name in node.input if name not in available} for node in nodes]
    consumers: dict[str, list[int]] = {}
    for index, names in enumerate(waiting):
        for name in names:
            consumers.setdefault(name, []).append(index)
    ready = [index for index, names in enumerate(waiting) if not names]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for name in nodes[index].output:
            for consumer in consumers.pop(name, []):
                waiting[consumer].discard(name)
                if not waiting[consumer]:
                    heapq.heappush(ready, consumer)
    if len(order) != len(nodes):
        raise EngineError("the fp16 conversion left a graph with a cycle or an input that nothing produces")
    copies = [type(nodes[index])() for index in order]
    for copy, index in zip(copies, order):
        copy.CopyFrom(nodes[index])
    del graph.node[:]
    graph.node.extend(copies)


def accuracy_bound(precision: str) -> float:
    return ACCURACY_BOUNDS[precision]


def describe_parser_error(index: int, node: int, node_name: str, operator: str, description: str) -> str:
    """One line per TensorRT ONNX parser error, naming the node it is about."""
    where = f"node {node}" if node >= 0 else "the model"
    if node_name or operator:
        where += f" ({' '.join(part for part in (operator, repr(node_name) if node_name else '') if part)})"
    return f"  parser error {index + 1}: {where}: {description.strip()}"
