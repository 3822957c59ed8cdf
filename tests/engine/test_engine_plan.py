"""`dtrain build-engine --dry-run`: the build plan as JSON, table-driven over the engine cases
(bench/engine_cases.py, which the GPU script builds for real) and over each option."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bench.engine_cases import CASES, EngineCase, dynamic_sequence, fp32_mlp, qdq_int8, two_inputs
from dtrain_engine import main as engine
from dtrain_engine.build_plan import plan_build
from dtrain_engine.onnx_model import inspect_onnx
from dtrain_operator.api.engine_options import EngineBuildOptions


def _get(document: dict[str, Any], dotted: str) -> Any:
    value: Any = document
    for part in dotted.split("."):
        value = value[part]
    return value


def dry_run(build_engine, onnx_path: Path, *flags: str, version: str = "10.13") -> dict[str, Any]:
    result = build_engine(onnx_path, "--dry-run", "--tensorrt-version", version, *flags, timing=False)
    assert result.exit_code == 0, result.stderr
    assert not result.out.exists() and not result.report_path.exists()
    return json.loads(result.stdout)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_plan_of_each_engine_case(build_engine, tmp_path: Path, case: EngineCase) -> None:
    plan = dry_run(build_engine, case.write(tmp_path / "model.onnx"), *case.flags)

    for dotted, expected in case.expect:
        assert _get(plan, dotted) == expected, dotted
    assert plan["memory_pools_bytes"] == {"WORKSPACE": 4096 << 20}
    assert plan["builder"]["profiling_verbosity"] == "DETAILED"
    assert plan["plugins"]["init_libnvinfer_plugins"] is True
    assert plan["tensorrt"] == {"version": "10.13", "major": 10, "assumed": False}
    assert plan["precision"]["why"]


QDQ_BY_VERSION = [
    # TensorRT, --precision, strongly typed, builder flags, executed
    ("10.8", "fp16", False, ["FP16", "INT8"], "int8"),
    ("10.8", "int8", False, ["INT8"], "int8"),
    ("10.13", "fp16", True, [], "int8"),
    ("11.0", "fp16", True, [], "int8"),
    ("11.0", "fp32", True, [], "int8"),
]


@pytest.mark.parametrize("version, precision, strongly_typed, flags, executed", QDQ_BY_VERSION)
def test_a_qdq_model_is_quantized_whatever_precision_is_asked(
    build_engine, tmp_path: Path, version: str, precision: str, strongly_typed: bool, flags: list[str], executed: str
) -> None:
    plan = dry_run(build_engine, qdq_int8(tmp_path / "qdq.onnx"), "--precision", precision, version=version)

    assert plan["network"]["strongly_typed"] is strongly_typed
    assert plan["builder"]["flags_set"] == flags
    assert plan["precision"]["executed"] == executed
    assert plan["precision"]["accuracy_bound"] == 5e-2  # int8's, never fp16's
    assert plan["precision"]["onnx_conversion"] is None  # never the fp16 converter over Q/DQ


def test_tensorrt_11_converts_a_float_model_to_fp16_and_never_sets_precision_flags(build_engine, tmp_path: Path) -> None:
    plan = dry_run(build_engine, fp32_mlp(tmp_path / "mlp.onnx"), "--precision", "fp16", version="11.0")
    assert plan["precision"]["onnx_conversion"] == "float16"
    assert plan["builder"]["flags_set"] == [] and plan["network"]["creation_flags"] == ["STRONGLY_TYPED"]


@pytest.mark.parametrize("flags, set_, cleared, bound", [
    ([], [], ["TF32"], 1e-3),
    (["--tf32"], [], [], 2e-2),
])
def test_tf32_is_off_for_fp32_unless_asked(build_engine, tmp_path: Path, flags, set_, cleared, bound) -> None:
    plan = dry_run(build_engine, fp32_mlp(tmp_path / "mlp.onnx"), "--precision", "fp32", *flags)
    assert (plan["builder"]["flags_set"], plan["builder"]["flags_cleared"]) == (set_, cleared)
    assert plan["precision"]["accuracy_bound"] == bound


def test_several_profiles_and_the_shapes_each_is_checked_at(build_engine, tmp_path: Path) -> None:
    plan = dry_run(
        build_engine, dynamic_sequence(tmp_path / "seq.onnx"),
        "--min-shapes", "tokens:1x1x16", "--opt-shapes", "tokens:1x16x16", "--max-shapes", "tokens:1x64x16",
        "--min-shapes", "tokens:8x64x16", "--opt-shapes", "tokens:8x64x16", "--max-shapes", "tokens:8x256x16",
    )
    assert [p["tokens"]["max"] for p in plan["profiles"]] == [[1, 64, 16], [8, 256, 16]]
    assert [(p["profile"], p["point"]) for p in plan["checked_at"]] == [(0, "min"), (0, "opt"), (0, "max"), (1, "min/opt"), (1, "max")]


def test_options_with_trtexecs_defaults_and_each_set(build_engine, tmp_path: Path) -> None:
    model = fp32_mlp(tmp_path / "mlp.onnx")
    default = dry_run(build_engine, model, "--precision", "fp16")
    assert default["builder"]["builder_optimization_level"] == 3
    assert default["builder"]["hardware_compatibility_level"] == "NONE"
    assert default["builder"]["flags_set"] == ["FP16"]
    assert default["runtime"] == {"cuda_graph": False, "refit_from_onnx": False, "engine_host_code_allowed": False}

    plan = dry_run(
        build_engine, model, "--precision", "fp16", "--hardware-compatibility-level", "ampere+", "--version-compatible",
        "--strip-weights", "--builder-optimization-level", "5", "--use-cuda-graph", "--workspace-mib", "256",
    )
    assert plan["builder"]["hardware_compatibility_level"] == "AMPERE_PLUS"
    assert plan["builder"]["builder_optimization_level"] == 5
    assert plan["builder"]["flags_set"] == ["FP16", "VERSION_COMPATIBLE", "STRIP_PLAN", "REFIT_IDENTICAL"]
    assert plan["runtime"] == {"cuda_graph": True, "refit_from_onnx": True, "engine_host_code_allowed": True}
    assert plan["memory_pools_bytes"] == {"WORKSPACE": 256 * 1024 * 1024}
    refit = dry_run(build_engine, model, "--refit", "--strip-weights")
    assert refit["builder"]["flags_set"] == ["FP16", "REFIT", "STRIP_PLAN"]  # with --refit, as trtexec: not REFIT_IDENTICAL


def test_layer_precisions_enable_their_flag_and_prefer_constraints_as_trtexec(build_engine, tmp_path: Path) -> None:
    model = fp32_mlp(tmp_path / "mlp.onnx")
    plan = dry_run(build_engine, model, "--precision", "fp32", "--layer-precisions", "fc*:fp16,relu:fp32")
    assert plan["precision"]["layer_precisions"] == {"fc*": "HALF", "relu": "FLOAT"}
    assert plan["builder"]["flags_set"] == ["FP16", "PREFER_PRECISION_CONSTRAINTS"]
    assert plan["precision"]["executed"] == "fp16" and plan["precision"]["accuracy_bound"] == 2e-2
    obey = dry_run(build_engine, model, "--precision", "fp32", "--layer-precisions", "fc1:fp16", "--precision-constraints", "obey")
    assert "OBEY_PRECISION_CONSTRAINTS" in obey["builder"]["flags_set"]


def test_a_data_dependent_output_takes_no_cuda_graph(build_engine, tmp_path: Path) -> None:
    from bench.engine_cases import data_dependent

    plan = dry_run(build_engine, data_dependent(tmp_path / "nz.onnx"), "--use-cuda-graph")
    assert plan["runtime"]["cuda_graph"] is False
    assert any("data-dependent" in note for note in plan["notes"])


def test_plugin_libraries_are_planned_by_absolute_path(build_engine, tmp_path: Path) -> None:
    library = tmp_path / "libmyplugin.so"
    library.write_bytes(b"\x7fELF")
    plan = dry_run(build_engine, fp32_mlp(tmp_path / "mlp.onnx"), "--plugin-library", str(library))
    assert plan["plugins"]["libraries"] == [str(library)]


REFUSED = {
    "missing plugin library": (["--plugin-library", "/nonexistent/lib.so"], "--plugin-library /nonexistent/lib.so: no such file"),
    "optimization level": (["--builder-optimization-level", "6"], "--builder-optimization-level 6: use 0 to 5"),
    "layer precision": (["--layer-precisions", "fc1:int4"], "--layer-precisions fc1:int4"),
    "uneven shape flags": (["--min-shapes", "x:1x32", "--opt-shapes", "x:1x32"], "once per optimisation profile"),
    "shapes and batches": (["--min-shapes", "x:1x32", "--opt-shapes", "x:2x32", "--max-shapes", "x:4x32", "--max-batch", "4"], "both given"),
    "unknown input": (["--min-shapes", "y:1x32", "--opt-shapes", "y:1x32", "--max-shapes", "y:1x32"], "names input(s) ['y']"),
    "fixed axis": (["--min-shapes", "x:1x16", "--opt-shapes", "x:1x16", "--max-shapes", "x:1x16"], "axis 1 fixed at 32, not 16"),
    "min above max": (["--min-shapes", "x:4x32", "--opt-shapes", "x:2x32", "--max-shapes", "x:8x32"], "min <= opt <= max"),
    "version without dry run": (["--tensorrt-version", "10.8"], "--tensorrt-version plans a --dry-run"),
}


@pytest.mark.parametrize("flags, expected", REFUSED.values(), ids=REFUSED.keys())
def test_bad_plan_options_give_one_line(build_engine, tmp_path: Path, flags: list[str], expected: str) -> None:
    result = build_engine(fp32_mlp(tmp_path / "mlp.onnx"), "--fallback", "onnxruntime", *flags, timing=False)
    assert result.exit_code == 2, result.stderr
    assert len(result.error_lines) == 1 and expected in result.error_lines[0], result.stderr
    assert not result.report_path.exists()


def test_layer_precisions_are_refused_where_the_build_is_strongly_typed(build_engine, tmp_path: Path) -> None:
    result = build_engine(qdq_int8(tmp_path / "qdq.onnx"), "--dry-run", "--layer-precisions", "matmul:fp16", timing=False)
    assert result.exit_code == 2 and "strongly typed" in result.error_lines[0]


def test_a_second_dynamic_axis_needs_shapes(build_engine, tmp_path: Path) -> None:
    result = build_engine(dynamic_sequence(tmp_path / "seq.onnx"), "--dry-run", timing=False)
    assert result.exit_code == 2
    assert "dynamic axes [1] besides the batch axis" in result.error_lines[0] and "--opt-shapes" in result.error_lines[0]


def test_two_inputs_share_the_batch_profile(tmp_path: Path) -> None:
    plan = plan_build(inspect_onnx(str(two_inputs(tmp_path / "two.onnx"))), EngineBuildOptions(min_batch=2, max_batch=4))
    assert [point.shapes for point in plan.points()] == [{"image": (2, 8), "mask": (2, 8)}, {"image": (4, 8), "mask": (4, 8)}]
    assert plan.tensorrt_assumed and plan.tensorrt_version == "10.13"


def test_float64_inputs_are_refused(build_engine, tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "f64",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["batch", 4])],
    )
    path = tmp_path / "f64.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    result = build_engine(path, "--fallback", "onnxruntime", timing=False)
    assert result.exit_code == 2
    assert "float64, which TensorRT does not have" in result.error_lines[0]


def test_fp8_and_int4_quantization_are_told_apart(tmp_path: Path) -> None:
    """QuantizeLinear's zero point (or output_dtype) and DequantizeLinear's weights name the quantized type."""
    fp8_zero = helper.make_tensor("zero", TensorProto.FLOAT8E4M3FN, [], [0.0])
    int4_weights = helper.make_tensor("w4", TensorProto.INT4, [4, 4], np.zeros(16, dtype=np.int8).tolist())
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [0.1])
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "scale", "zero"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w4", "scale"], ["w"]),
        helper.make_node("MatMul", ["xd", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "fp8_int4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [fp8_zero, int4_weights, scale],
    )
    path = tmp_path / "fp8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    model = inspect_onnx(str(path))
    assert model.quantized_types == {"FP8", "INT4"}
    plan = plan_build(model, EngineBuildOptions(precision="fp16"), "10.8")
    assert plan.builder_flags == ("FP16", "FP8", "INT4") and plan.executed_precision == "int4" and plan.bound == 1e-1


def test_the_engine_jobs_command_parses_into_the_options_the_spec_asks_for() -> None:
    """spec.engine -> the engine Job's command (render) -> build-engine's parser -> the options model: nothing lost."""
    from dtrain_operator.api import DistributedTraining, contract
    from dtrain_operator.cli import main as cli
    from dtrain_operator.core import engine_job

    spec = {"engine": {
        "precision": "fp32", "tf32": True, "hardwareCompatibilityLevel": "same-compute-capability", "versionCompatible": True,
        "refit": True, "stripWeights": True, "builderOptimizationLevel": 1, "layerPrecisions": {"fc1": "fp16", "fc2": "bf16"},
        "precisionConstraints": "prefer", "pluginLibraries": ["/opt/libroi.so"], "useCudaGraph": True,
        "profiles": [{"inputs": {"x": {"min": [1, 32], "opt": [4, 32], "max": [8, 32]}}}],
    }}
    job = DistributedTraining.model_validate(
        {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "metadata": {"name": "j", "namespace": "n"}, "spec": spec}
    )
    args = cli.build_parser().parse_args(engine_job.engine_command(job)[1:])
    assert engine.build_options(args) == EngineBuildOptions(
        precision="fp32", profiles=[{"inputs": {"x": {"min": [1, 32], "opt": [4, 32], "max": [8, 32]}}}], tf32=True,
        hardware_compatibility_level="same-compute-capability", version_compatible=True, refit=True, strip_weights=True,
        builder_optimization_level=1, layer_precisions={"fc1": "fp16", "fc2": "bf16"}, precision_constraints="prefer",
        plugin_libraries=["/opt/libroi.so"], use_cuda_graph=True,
    )
    assert args.timing_cache == "/workspace/n/j/artifacts/timing.cache"
