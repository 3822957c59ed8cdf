"""The engine cases: small ONNX models that each exercise one thing the engine builder must get
right, with the `dtrain build-engine` flags each is built with.

tests/engine runs every case through `--dry-run` (the plan) and through the TensorRT double
(the runtime path); bench/gpu_engine_check.sh runs the same cases with the real TensorRT on
a GPU. Models are written with onnx.helper, so no torch is needed and every case is exact.

    python -m bench.engine_cases DIRECTORY     # writes DIRECTORY/<case>.onnx for every case
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _weights(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.5, name)


def qdq_int8(path: Path) -> Path:
    """x [batch, 16] -> Q/DQ (int8) -> MatMul with Q/DQ int8 weights -> y [batch, 8]."""
    scale = numpy_helper.from_array(np.array(0.05, dtype=np.float32), "scale")
    zero = numpy_helper.from_array(np.array(0, dtype=np.int8), "zero")
    w_scale = numpy_helper.from_array(np.array(0.01, dtype=np.float32), "w_scale")
    w_int8 = numpy_helper.from_array(np.random.default_rng(1).integers(-100, 100, (16, 8)).astype(np.int8), "w_int8")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["xq"], name="quantize_x"),
        helper.make_node("DequantizeLinear", ["xq", "scale", "zero"], ["xdq"], name="dequantize_x"),
        helper.make_node("DequantizeLinear", ["w_int8", "w_scale", "zero"], ["w"], name="dequantize_w"),
        helper.make_node("MatMul", ["xdq", "w"], ["y"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes, "qdq_int8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [scale, zero, w_scale, w_int8],
    )
    return _save(graph, path)


def fp32_mlp(path: Path) -> Path:
    """x [batch, 32] -> MatMul -> Relu -> MatMul -> y [batch, 10]: for fp32 without TF32."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="relu"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "fp32_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        [_weights("w1", (32, 64), 2), _weights("w2", (64, 10), 3)],
    )
    return _save(graph, path)


def dynamic_sequence(path: Path) -> Path:
    """tokens [batch, sequence, 16] float -> MatMul -> Tanh -> y [batch, sequence, 8]: two dynamic axes."""
    nodes = [
        helper.make_node("MatMul", ["tokens", "w"], ["h"], name="project"),
        helper.make_node("Tanh", ["h"], ["y"], name="tanh"),
    ]
    graph = helper.make_graph(
        nodes, "dynamic_sequence",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "sequence", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 8])],
        [_weights("w", (16, 8), 4)],
    )
    return _save(graph, path)


def two_inputs(path: Path) -> Path:
    """image [batch, 8] and mask [batch, 8] -> (image * mask) MatMul -> y [batch, 4]."""
    nodes = [
        helper.make_node("Mul", ["image", "mask"], ["masked"], name="apply_mask"),
        helper.make_node("MatMul", ["masked", "w"], ["y"], name="project"),
    ]
    graph = helper.make_graph(
        nodes, "two_inputs",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 8]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [_weights("w", (8, 4), 5)],
    )
    return _save(graph, path)


def data_dependent(path: Path) -> Path:
    """x [batch, 6] -> NonZero(x > 0): int64 indices [2, N] whose N depends on the values; and relu(x)."""
    zero = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["positive"], name="greater"),
        helper.make_node("NonZero", ["positive"], ["indices"], name="nonzero"),
        helper.make_node("Relu", ["x"], ["relu"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "data_dependent",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("indices", TensorProto.INT64, [2, "count"]),
         helper.make_tensor_value_info("relu", TensorProto.FLOAT, ["batch", 6])],
        [zero],
    )
    return _save(graph, path)


def roi_align(path: Path) -> Path:
    """features [batch, 4, 8, 8] -> RoiAlign over two fixed boxes: onnx-tensorrt builds it from a TensorRT plugin."""
    rois = numpy_helper.from_array(np.array([[0, 0, 4, 4], [2, 2, 7, 7]], dtype=np.float32), "rois")
    indices = numpy_helper.from_array(np.array([0, 0], dtype=np.int64), "batch_indices")
    nodes = [helper.make_node("RoiAlign", ["features", "rois", "batch_indices"], ["pooled"], name="roi_align",
                              output_height=2, output_width=2, sampling_ratio=2, spatial_scale=1.0)]
    graph = helper.make_graph(
        nodes, "roi_align",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [2, 4, 2, 2])],
        [rois, indices],
    )
    return _save(graph, path)


@dataclass(frozen=True)
class EngineCase:
    name: str
    write: Callable[[Path], Path]
    flags: tuple[str, ...]
    # What the plan must say, as (dotted path into the --dry-run JSON, value), on TensorRT 10.13.
    expect: tuple[tuple[str, object], ...] = field(default=())


SEQUENCE_SHAPES = ("--min-shapes", "tokens:1x1x16", "--opt-shapes", "tokens:4x32x16", "--max-shapes", "tokens:8x128x16")

CASES = (
    EngineCase("qdq-int8-at-fp16", qdq_int8, ("--precision", "fp16", "--max-batch", "8"), (
        ("precision.quantized_types", ["INT8"]), ("precision.executed", "int8"), ("precision.accuracy_bound", 5e-2),
        ("network.strongly_typed", True), ("builder.flags_set", []), ("precision.onnx_conversion", None),
    )),
    EngineCase("qdq-int8-at-int8", qdq_int8, ("--precision", "int8", "--max-batch", "8"), (
        ("precision.executed", "int8"), ("network.creation_flags", ["STRONGLY_TYPED"]), ("builder.flags_set", []),
    )),
    EngineCase("fp32-without-tf32", fp32_mlp, ("--precision", "fp32", "--max-batch", "16"), (
        ("builder.flags_set", []), ("builder.flags_cleared", ["TF32"]), ("precision.accuracy_bound", 1e-3),
        ("network.strongly_typed", False),
    )),
    EngineCase("dynamic-sequence", dynamic_sequence, ("--precision", "fp16", *SEQUENCE_SHAPES), (
        ("profiles", [{"tokens": {"min": [1, 1, 16], "opt": [4, 32, 16], "max": [8, 128, 16]}}]),
        ("builder.flags_set", ["FP16"]),
    )),
    EngineCase("two-inputs", two_inputs, ("--precision", "fp32", "--min-batch", "1", "--opt-batch", "4", "--max-batch", "8"), (
        ("profiles", [{"image": {"min": [1, 8], "opt": [4, 8], "max": [8, 8]},
                       "mask": {"min": [1, 8], "opt": [4, 8], "max": [8, 8]}}]),
    )),
    EngineCase("data-dependent-output", data_dependent, ("--precision", "fp32", "--max-batch", "4"), (
        ("outputs.data_dependent", ["indices"]), ("outputs.compared_exactly", ["indices"]),
    )),
    EngineCase("plugin-roi-align", roi_align, ("--precision", "fp32", "--max-batch", "2"), (
        ("plugins.init_libnvinfer_plugins", True),
    )),
)


def write_all(directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for case in CASES:
        if case.write.__name__ not in written:
            written[case.write.__name__] = case.write(directory / f"{case.write.__name__}.onnx")
    return {case.name: written[case.write.__name__] for case in CASES}


if __name__ == "__main__":
    for name, path in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/engine-cases")).items():
        print(f"{name}\t{path}")
