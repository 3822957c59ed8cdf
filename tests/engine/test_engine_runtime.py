"""The TensorRT path end to end on the TensorRT double (tests/engine/tensorrt_double/): the build,
the execution context, buffers, the output allocator, profiles and timing all run, and the
double refuses what the real runtime refuses. bench/gpu_engine_check.sh runs the same cases
with the real TensorRT on a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.engine_cases import CASES, EngineCase, data_dependent, dynamic_sequence, fp32_mlp, qdq_int8, roi_align
from dtrain_engine.check import GPU_CLOCK, GRAPH_CLOCK, HOST_CLOCK, compare_outputs


def _passed(result) -> dict:
    assert result.exit_code == 0, result.stderr
    report = result.report
    assert report["passed"] is True and report["error"] is None
    assert result.out.exists() and report["engine_bytes"] == result.out.stat().st_size
    return report


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_engine_case_builds_checks_and_times_on_the_double(
    build_with_double, tensorrt_double, tmp_path: Path, case: EngineCase
) -> None:
    report = _passed(build_with_double(case.write(tmp_path / "model.onnx"), *case.flags))

    assert report["backend"] == "tensorrt"
    assert report["compute_capability"] == [9, 0]
    assert report["tensorrt"]["device_memory_bytes"] == 1 << 20
    assert report["tensorrt"]["layers"]["available"] is True  # profiling verbosity DETAILED reached the build
    assert report["tensorrt"]["log"] == {"errors": [], "warnings": []}
    points = [(p["profile"], p["point"]) for p in report["plan"]["checked_at"]]
    assert [(row["profile"], row["point"]) for row in report["latency"]] == points
    assert [(c["profile"], c["point"]) for c in report["accuracy"]["comparisons"]] == points
    for row in report["latency"]:
        assert row["clock"] == GPU_CLOCK and row["median_ms"] > 0
        assert [other["clock"] for other in row["also_measured"]] == [HOST_CLOCK]
    build = tensorrt_double.BUILDS[-1]
    assert build["workspace_bytes"] == 4096 << 20
    assert set(build["flags"]) == {*report["plan"]["builder"]["flags_set"], "TF32"} - set(report["plan"]["builder"]["flags_cleared"])
    assert build["strongly_typed"] is report["plan"]["network"]["strongly_typed"]
    assert build["profiles"] == [{name: [r["min"], r["opt"], r["max"]] for name, r in p.items()} for p in report["profiles"]]


def test_the_trained_model_against_onnxruntime_and_pytorch(build_with_double, artifacts_copy: Path) -> None:
    report = _passed(build_with_double(artifacts_copy, "--precision", "fp32", "--min-batch", "1", "--opt-batch", "2", "--max-batch", "4"))
    assert report["accuracy"]["references"] == ["onnxruntime-cpu", "pytorch"]
    assert report["pytorch"]["mode"] == "eager fp32 on cpu"
    assert all(row["speedup_vs_pytorch"] > 0 for row in report["latency"])


def test_a_qdq_model_at_fp16_on_tensorrt_10_8_gets_int8_as_well(build_with_double, tensorrt_double, tmp_path: Path) -> None:
    tensorrt_double.reset("10.8.0")
    report = _passed(build_with_double(qdq_int8(tmp_path / "qdq.onnx"), "--precision", "fp16", "--max-batch", "4"))
    assert set(tensorrt_double.BUILDS[-1]["flags"]) >= {"FP16", "INT8"}
    assert tensorrt_double.BUILDS[-1]["strongly_typed"] is False
    assert report["accuracy"]["bound"] == 5e-2 and report["precision"]["executed"] == "int8"


def test_tensorrt_11_converts_float_models_and_leaves_qdq_graphs_alone(build_with_double, tensorrt_double, tmp_path: Path) -> None:
    tensorrt_double.reset("11.0.0")
    converted = _passed(build_with_double(fp32_mlp(tmp_path / "mlp.onnx"), "--precision", "fp16", "--max-batch", "4"))
    assert converted["plan"]["precision"]["onnx_conversion"] == "float16"
    errors = [c["max_relative_error"] for c in converted["accuracy"]["comparisons"]]
    assert all(1e-6 < e <= 2e-2 for e in errors), errors  # ONNX Runtime really ran the fp16 copy
    quantized = _passed(build_with_double(qdq_int8(tmp_path / "qdq.onnx"), "--precision", "fp16", "--max-batch", "4"))
    assert quantized["plan"]["precision"]["onnx_conversion"] is None
    assert all(build["strongly_typed"] and not {"FP16", "INT8"} & set(build["flags"]) for build in tensorrt_double.BUILDS)


def test_data_dependent_outputs_come_through_the_output_allocator_and_compare_exactly(
    build_with_double, tmp_path: Path
) -> None:
    report = _passed(build_with_double(data_dependent(tmp_path / "nz.onnx"), "--max-batch", "4", "--use-cuda-graph"))
    assert all(c["compared_exactly"] == ["indices"] for c in report["accuracy"]["comparisons"])
    assert report["plan"]["outputs"]["data_dependent"] == ["indices"]
    assert report["plan"]["runtime"]["cuda_graph"] is False  # no graph over an output allocator


def test_an_integer_output_off_by_one_fails_however_small_the_relative_error() -> None:
    reference = {"indices": np.array([[0, 1000, 2000]], dtype=np.int64)}
    comparison = compare_outputs({"indices": reference["indices"] + np.array([[0, 1, 0]])}, reference, "onnxruntime-cpu", 1, 5e-2)
    assert not comparison.passed
    assert "differs in 1 of 3 elements" in comparison.problem
    assert compare_outputs(reference, reference, "onnxruntime-cpu", 1, 5e-2).passed


def test_each_profile_is_checked_and_timed_in_itself(build_with_double, tmp_path: Path) -> None:
    report = _passed(build_with_double(
        dynamic_sequence(tmp_path / "seq.onnx"),
        "--min-shapes", "tokens:1x1x16", "--opt-shapes", "tokens:1x16x16", "--max-shapes", "tokens:1x64x16",
        "--min-shapes", "tokens:4x64x16", "--opt-shapes", "tokens:4x128x16", "--max-shapes", "tokens:4x256x16",
    ))
    rows = [(row["profile"], row["shapes"]["tokens"]) for row in report["latency"]]
    assert rows == [(0, [1, 1, 16]), (0, [1, 16, 16]), (0, [1, 64, 16]), (1, [4, 64, 16]), (1, [4, 128, 16]), (1, [4, 256, 16])]


def test_a_cuda_graph_is_timed_beside_the_plain_launches(build_with_double, tmp_path: Path) -> None:
    report = _passed(build_with_double(fp32_mlp(tmp_path / "mlp.onnx"), "--max-batch", "4", "--use-cuda-graph"))
    for row in report["latency"]:
        assert [other["clock"] for other in row["also_measured"]] == [HOST_CLOCK, GRAPH_CLOCK]
        assert row["also_measured"][1]["iterations"] >= 5
    assert not any("capture failed" in note for note in report["notes"])


def test_plugins_are_initialised_and_libraries_loaded(build_with_double, tensorrt_double, tmp_path: Path) -> None:
    library = tmp_path / "libcustom_plugin.so"
    library.write_bytes(b"\x7fELF")
    _passed(build_with_double(roi_align(tmp_path / "roi.onnx"), "--max-batch", "2", "--plugin-library", str(library),
                              "--version-compatible"))
    assert tensorrt_double.LOADED_LIBRARIES == [str(library)]
    assert tensorrt_double.BUILDS[-1]["plugins_to_serialize"] == [str(library)]


def test_builder_options_reach_the_builder(build_with_double, tensorrt_double, tmp_path: Path) -> None:
    report = _passed(build_with_double(
        fp32_mlp(tmp_path / "mlp.onnx"), "--precision", "fp32", "--max-batch", "4", "--hardware-compatibility-level",
        "same-compute-capability", "--builder-optimization-level", "1", "--layer-precisions", "fc1:fp16",
        "--version-compatible", "--strip-weights", "--workspace-mib", "64",
    ))
    build = tensorrt_double.BUILDS[-1]
    assert (build["hardware_compatibility_level"], build["builder_optimization_level"]) == ("SAME_COMPUTE_CAPABILITY", 1)
    assert build["workspace_bytes"] == 64 << 20
    assert {"FP16", "PREFER_PRECISION_CONSTRAINTS", "VERSION_COMPATIBLE", "STRIP_PLAN", "REFIT_IDENTICAL"} <= set(build["flags"])
    assert "TF32" not in build["flags"]
    assert [layer[3] for layer in build["layers"] if layer[0] == "fc1"] == ["HALF"]
    assert report["accuracy"]["bound"] == 2e-2  # an fp16 layer: fp16's bound


@pytest.mark.parametrize("content, expected", [
    (b"\x00garbage, not a cache", "is not a TensorRT timing cache (corrupt or truncated); started a new one"),
    (b"TRT-DOUBLE-CACHE\nanother GPU", "was made by another GPU or TensorRT version; started a new one"),
])
def test_a_corrupt_or_foreign_timing_cache_is_replaced(
    build_with_double, tensorrt_double, tmp_path: Path, content: bytes, expected: str
) -> None:
    cache = tmp_path / "timing.cache"
    cache.write_bytes(content)
    report = _passed(build_with_double(fp32_mlp(tmp_path / "mlp.onnx"), "--max-batch", "2", "--timing-cache", str(cache)))
    assert expected in report["tensorrt"]["timing_cache"]
    assert cache.read_bytes() == tensorrt_double.CACHE_MAGIC + tensorrt_double.DEVICE_NAME.encode()


def test_a_tensorrt_failure_is_one_line_with_tensorrts_words_and_a_report(
    build_with_double, tensorrt_double, tmp_path: Path, termination_log: Path
) -> None:
    tensorrt_double.FAIL_CONTEXTS = True
    result = build_with_double(fp32_mlp(tmp_path / "mlp.onnx"), "--max-batch", "2")

    assert result.exit_code == 1
    assert len(result.error_lines) == 1 and "Traceback" not in result.stderr
    line = result.error_lines[0]
    assert "TensorRT could not create an execution context" in line and "Error Code 2: OutOfMemory" in line
    report = result.report
    assert report["passed"] is False and report["engine"] is None and not result.out.exists()
    assert "OutOfMemory" in report["error"]
    assert any("OutOfMemory" in error for error in report["tensorrt"]["log"]["errors"])
    assert "OutOfMemory" in json.loads(termination_log.read_text())["message"]


def test_an_exception_from_the_bindings_lands_in_the_same_error_path(build_with_double, tensorrt_double, tmp_path: Path) -> None:
    tensorrt_double.EXECUTE_RAISES = RuntimeError("std::exception: CUDA error 700 an illegal memory access")
    result = build_with_double(fp32_mlp(tmp_path / "mlp.onnx"), "--max-batch", "2")

    assert result.exit_code == 1 and len(result.error_lines) == 1 and "Traceback" not in result.stderr
    assert "RuntimeError: std::exception: CUDA error 700" in result.error_lines[0]
    assert result.report["error"] == result.error_lines[0].removeprefix("dtrain build-engine: error: ")
    assert not result.out.exists()


def _with_external_data(path: Path) -> Path:
    """The model as a large export leaves it: the graph in model.onnx, the weights in model.onnx.data."""
    import onnx

    model = onnx.load(str(path))
    target = path.with_name("model.onnx")
    onnx.save_model(model, str(target), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    return target


def test_a_model_with_external_data_is_hashed_graph_and_data_and_converted_by_path(
    build_with_double, tensorrt_double, tmp_path: Path
) -> None:
    import hashlib

    onnx_path = _with_external_data(fp32_mlp(tmp_path / "mlp.onnx"))
    data = onnx_path.with_name("model.onnx.data")
    tensorrt_double.reset("11.0.0")  # the fp16 conversion: shape inference, conversion and check all by path
    report = _passed(build_with_double(onnx_path, "--precision", "fp16", "--max-batch", "2"))

    assert report["plan"]["precision"]["onnx_conversion"] == "float16"
    assert report["onnx"]["sha256"] == hashlib.sha256(onnx_path.read_bytes()).hexdigest()
    assert report["onnx"]["external_data"] == [
        {"path": str(data), "sha256": hashlib.sha256(data.read_bytes()).hexdigest(), "bytes": data.stat().st_size}
    ]


def test_missing_external_data_is_a_usage_error(build_with_double, tmp_path: Path) -> None:
    onnx_path = _with_external_data(fp32_mlp(tmp_path / "mlp.onnx"))
    onnx_path.with_name("model.onnx.data").unlink()
    result = build_with_double(onnx_path, "--max-batch", "2")
    assert result.exit_code == 2 and len(result.error_lines) == 1, result.stderr
