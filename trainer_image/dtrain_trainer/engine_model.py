"""What `dtrain build-engine` decides before it runs anything: the ONNX model's inputs,
the batch sizes it can serve, and how a precision is reached on each TensorRT major.

Everything here is pure or reads only the ONNX file, so the decisions are tested on
machines without TensorRT or a GPU.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

import numpy as np

EXIT_CHECK_FAILED = 1  # the build, the accuracy check or a runtime failed
EXIT_USAGE = 2  # bad arguments or an input the command cannot use
EXIT_UNAVAILABLE = 3  # TensorRT or a CUDA GPU is missing and no fallback was asked for

DEFAULT_MIN_BATCH = 1
DEFAULT_MAX_BATCH = 32

Precision = Literal["fp32", "fp16", "bf16", "int8"]

# Max relative error (max|y - y_ref| / max|y_ref|) allowed against a reference, by the
# precision the model under test ran in. int8 has no bound in the issue: 5e-2 is ours.
ACCURACY_BOUNDS: dict[str, float] = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 2e-2, "int8": 5e-2}

ENGINE_SUFFIXES = (".plan", ".engine", ".trt")
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
INPUT_DTYPES = frozenset({"float16", "float32", "float64"})  # what random batches can be made of


class EngineError(Exception):
    """A failure the user can act on: printed as one line (or a short list), never a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_CHECK_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


def usage_error(message: str) -> EngineError:
    return EngineError(message, EXIT_USAGE)


# --- The ONNX model -------------------------------------------------------------------


Dim = Union[int, str]  # a fixed size, or the name of a symbolic (dynamic) dimension


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # numpy dtype name, e.g. "float32"
    shape: tuple[Dim, ...]

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape without the batch axis (every dimension fixed, checked by inspect_onnx)."""
        return tuple(int(d) for d in self.shape[1:])

    def describe(self) -> str:
        return f"'{self.name}' {list(self.shape)} {self.dtype}"


@dataclass(frozen=True)
class OnnxModelInfo:
    path: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    opset: int
    static_batch: Optional[int]  # None: the batch axis is dynamic
    quantized: bool  # has QuantizeLinear/DequantizeLinear nodes (explicit quantization)
    weight_types: frozenset[str]  # numpy names of the floating-point initializer types

    @property
    def dynamic_batch(self) -> bool:
        return self.static_batch is None

    @property
    def exported_precision(self) -> Precision:
        """The precision the model runs in as it is, e.g. under ONNX Runtime."""
        if self.quantized:
            return "int8"
        if "float16" in self.weight_types:
            return "fp16"
        if "bfloat16" in self.weight_types:
            return "bf16"
        return "fp32"


def _dims(value_info: object) -> tuple[Dim, ...]:
    shape = value_info.type.tensor_type.shape  # type: ignore[attr-defined]
    dims: list[Dim] = []
    for index, dim in enumerate(shape.dim):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or f"dim{index}")
    return tuple(dims)


def _numpy_dtype_name(elem_type: int) -> str:
    import onnx

    if elem_type == onnx.TensorProto.BFLOAT16:
        return "bfloat16"  # numpy has no bfloat16; the name is still what the report shows
    return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name)


def inspect_onnx(path: str) -> OnnxModelInfo:
    """The model's inputs, outputs and batch axis; a usage EngineError for a file that is not a usable ONNX model."""
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

    initializer_names = {init.name for init in model.graph.initializer}
    inputs = tuple(
        TensorInfo(vi.name, _numpy_dtype_name(vi.type.tensor_type.elem_type), _dims(vi))
        for vi in model.graph.input
        if vi.name not in initializer_names
    )
    outputs = tuple(
        TensorInfo(vi.name, _numpy_dtype_name(vi.type.tensor_type.elem_type), _dims(vi)) for vi in model.graph.output
    )
    if not inputs:
        raise usage_error(f"--onnx {path} has no inputs: build-engine needs a model that takes a batch")
    for tensor in inputs:
        if tensor.dtype not in INPUT_DTYPES:
            raise usage_error(
                f"--onnx {path}: input {tensor.describe()} is not float16/32/64; "
                "build-engine checks models with random float batches (image models)"
            )
        if len(tensor.shape) < 1:
            raise usage_error(f"--onnx {path}: input {tensor.describe()} has no batch axis")
        unfixed = [i for i, d in enumerate(tensor.shape) if i > 0 and not isinstance(d, int)]
        if unfixed:
            raise usage_error(
                f"--onnx {path}: input {tensor.describe()} has dynamic dimension(s) {unfixed} besides the batch axis; "
                "export it with a fixed sample shape (spec.export.onnx.inputShape)"
            )

    batch_dims = {tensor.shape[0] for tensor in inputs}
    fixed = {d for d in batch_dims if isinstance(d, int)}
    if fixed and len(fixed) != len(batch_dims):
        raise usage_error(f"--onnx {path}: some inputs have a fixed batch axis and others a dynamic one")
    if len(fixed) > 1:
        raise usage_error(f"--onnx {path}: inputs disagree on the batch size: {sorted(fixed)}")

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    float_types = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    weight_types = frozenset(
        _numpy_dtype_name(init.data_type) for init in model.graph.initializer if init.data_type in float_types
    )
    quantized = any(node.op_type in QDQ_OPS for node in model.graph.node) or any(
        node.op_type in QDQ_OPS for function in model.functions for node in function.node
    )
    return OnnxModelInfo(
        path=path,
        inputs=inputs,
        outputs=outputs,
        opset=opset,
        static_batch=next(iter(fixed)) if fixed else None,
        quantized=quantized,
        weight_types=weight_types,
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


def check_batch_flags(min_batch: Optional[int], opt_batch: Optional[int], max_batch: Optional[int]) -> None:
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
    model: OnnxModelInfo, min_batch: Optional[int], opt_batch: Optional[int], max_batch: Optional[int]
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


BuilderFlagName = Literal["FP16", "BF16", "INT8"]
# Only kINT8 for int8: the layers the Q/DQ nodes leave unquantized stay fp32.
TENSORRT10_BUILDER_FLAGS: dict[Precision, tuple[BuilderFlagName, ...]] = {
    "fp32": (),
    "fp16": ("FP16",),
    "bf16": ("BF16",),
    "int8": ("INT8",),
}


@dataclass(frozen=True)
class PrecisionPlan:
    """How the requested precision is reached by one TensorRT major version."""

    precision: Precision
    strongly_typed: bool
    builder_flags: tuple[BuilderFlagName, ...]  # TensorRT 10 (weakly typed) only
    onnx_conversion: Optional[Literal["float16"]]  # rewrite the ONNX model's types before parsing
    note: str


def require_quantized_for_int8(precision: Precision, model: OnnxModelInfo) -> None:
    """INT8 without calibration data is only right for a model that carries its own quantization."""
    if precision == "int8" and not model.quantized:
        raise usage_error(
            f"--precision int8 needs a quantized ONNX model (QuantizeLinear/DequantizeLinear nodes), and {model.path} "
            "has none; dtrain does no INT8 calibration: quantize the model first (e.g. NVIDIA ModelOpt) or use fp16"
        )


def plan_precision(tensorrt_major: int, precision: Precision, model: OnnxModelInfo) -> PrecisionPlan:
    """TensorRT 10: builder flags allow lower-precision kernels. TensorRT 11 removed those flags
    (every network is strongly typed), so the ONNX model's own types decide and dtrain converts
    fp32 weights to fp16 itself. INT8 needs explicit quantization (Q/DQ nodes) on both: dtrain
    does no calibration, so a model without Q/DQ nodes is refused instead of built wrong."""
    if tensorrt_major not in SUPPORTED_TENSORRT_MAJORS:
        raise EngineError(
            f"TensorRT {tensorrt_major} is not supported: dtrain builds with TensorRT 10 or 11", EXIT_UNAVAILABLE
        )
    require_quantized_for_int8(precision, model)
    if tensorrt_major == 10:
        flags = TENSORRT10_BUILDER_FLAGS[precision]
        note = (
            f"TensorRT 10, weakly typed: builder flag(s) {', '.join(flags)} let TensorRT choose lower-precision kernels"
            if flags
            else "TensorRT 10, weakly typed, fp32 kernels (TF32 where the GPU has it)"
        )
        return PrecisionPlan(precision, False, flags, None, note)

    if precision == "fp16" and "float16" not in model.weight_types:
        return PrecisionPlan(
            precision,
            True,
            (),
            "float16",
            "TensorRT 11, strongly typed: fp32 weights and tensors converted to fp16 before parsing "
            "(onnxruntime.transformers.float16, inputs and outputs kept fp32)",
        )
    if precision == "bf16" and "bfloat16" not in model.weight_types:
        raise usage_error(
            "--precision bf16 on TensorRT 11 needs a bf16 ONNX model (TensorRT 11 has no BF16 builder flag): "
            "convert it with NVIDIA ModelOpt AutoCast (python -m modelopt.onnx.autocast --low_precision_type bf16), "
            "or use fp16"
        )
    note = "TensorRT 11, strongly typed: the ONNX model's own types are built as they are"
    return PrecisionPlan(precision, True, (), None, note)


def convert_to_float16(source: str, destination: str) -> None:
    """Rewrite an fp32 ONNX model to fp16 for a strongly typed build (TensorRT 11).

    onnxruntime's converter keeps ops that are unsafe in fp16 (its block list) in fp32 with
    Cast nodes around them, and keeps the model's inputs and outputs fp32 so that callers
    feed the same batches as before. Weights go to a side file so that large models fit.
    """
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(source)
    converted = convert_float_to_float16(model, keep_io_types=True)
    # The converter appends the Casts of the kept fp32 inputs after their consumers.
    _sort_topologically(converted.graph)
    onnx.checker.check_model(converted, full_check=False)
    onnx.save_model(
        converted,
        destination,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=os.path.basename(destination) + ".weights",
    )


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


def accuracy_bound(precision: Precision) -> float:
    return ACCURACY_BOUNDS[precision]


def describe_parser_error(index: int, node: int, node_name: str, operator: str, description: str) -> str:
    """One line per TensorRT ONNX parser error, naming the node it is about."""
    where = f"node {node}" if node >= 0 else "the model"
    if node_name or operator:
        where += f" ({' '.join(part for part in (operator, repr(node_name) if node_name else '') if part)})"
    return f"  parser error {index + 1}: {where}: {description.strip()}"
