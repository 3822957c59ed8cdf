"""The TensorRT path: its API surface against the real module (where TensorRT imports) and the
stubs (everywhere), the precision decisions per major version, the TensorRT 11 fp16 conversion
(run for real with ONNX Runtime), and the message when TensorRT or a GPU is missing."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import numpy as np
import pytest
from repaired_tensorrt_stubs import installed_stub_root, write_repaired_stubs

from bench.engine_cases import fp32_mlp, qdq_int8
from dtrain_engine import probe
from dtrain_engine.build_plan import HARDWARE_COMPATIBILITY, plan_build
from dtrain_engine.onnx_model import (
    EXIT_UNAVAILABLE,
    EngineError,
    OnnxModelInfo,
    TensorInfo,
    convert_to_float16,
    describe_parser_error,
    inspect_onnx,
)
from dtrain_operator.api.engine_options import EngineBuildOptions

ENGINE_TENSORRT = Path(probe.__file__).with_name("tensorrt_runtime.py")


def _tensorrt_api() -> dict[str, tuple[int, ...]]:
    """TENSORRT_API read from the source, so that this works where `import tensorrt` does not."""
    tree = ast.parse(ENGINE_TENSORRT.read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "TENSORRT_API":
            return ast.literal_eval(node.value)
    raise AssertionError("tensorrt_runtime.py defines no TENSORRT_API")


def _usable_tensorrt():
    version, reason = probe.probe_tensorrt()
    if version is None:
        pytest.skip(f"TensorRT is not importable here: {reason}")
    return importlib.import_module("tensorrt")


def test_every_tensorrt_name_the_builder_uses_exists_on_the_real_module() -> None:
    trt = _usable_tensorrt()
    major = int(trt.__version__.split(".")[0])
    missing = []
    for dotted, majors in _tensorrt_api().items():
        if major not in majors:
            continue
        target = trt
        for part in dotted.split("."):
            if not hasattr(target, part):
                missing.append(dotted)
                break
            target = getattr(target, part)
    assert missing == [], f"TensorRT {trt.__version__} lacks {missing}"


def _stub_members(stub: Path) -> dict[str, set[str]]:
    """Top-level names of a .pyi and, for each class, its members (methods, properties, attributes, nested classes)."""
    tree = ast.parse(stub.read_text())
    members: dict[str, set[str]] = {"": set()}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members[""].add(node.name)
            names = members.setdefault(node.name, set())
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.ClassDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members[""].add(node.target.id)
        elif isinstance(node, ast.FunctionDef):  # module functions: init_libnvinfer_plugins, get_plugin_registry
            members[""].add(node.name)
    return members


def test_every_tensorrt_10_name_exists_in_the_stubs(tmp_path: Path) -> None:
    if installed_stub_root() is None:
        pytest.skip("tensorrt-stubs is not installed (pip install --no-deps tensorrt-stubs)")
    stubs = write_repaired_stubs(tmp_path)
    members = _stub_members(stubs / "tensorrt_bindings" / "tensorrt.pyi")
    module_names = set(members[""])
    if "__version__" in (stubs / "tensorrt" / "__init__.pyi").read_text():
        module_names.add("__version__")
    missing = []
    for dotted, majors in _tensorrt_api().items():
        if 10 not in majors:
            continue
        parts = dotted.split(".")
        if parts[0] not in module_names or (len(parts) > 1 and parts[1] not in members.get(parts[0], set())):
            missing.append(dotted)
    assert missing == []
    # The check can fail: the attribute TensorRT 10 removed is not there.
    assert "max_batch_size" not in members["Builder"]


def _runtime_tensorrt_chains(source: str) -> set[str]:
    """Every `trt.A.B...` read at run time (annotations excluded: they are never evaluated), as "A.B"."""
    tree = ast.parse(source)
    in_annotations: set[int] = set()
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations = [a.annotation for a in (*node.args.args, *node.args.kwonlyargs) if a.annotation]
            annotations += [node.returns] if node.returns else []
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        for annotation in annotations:
            in_annotations.update(id(inner) for inner in ast.walk(annotation))
    inner_attributes = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    chains = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner_attributes or id(node) in in_annotations:
            continue
        parts, current = [], node
        while isinstance(current, ast.Attribute):
            parts.append(current.attr)
            current = current.value
        if isinstance(current, ast.Name) and current.id == "trt":
            chains.add(".".join(reversed(parts)))
    return chains


def test_tensorrt_api_lists_every_module_attribute_the_builder_reads() -> None:
    """Each `trt.X` / `trt.X.Y` tensorrt_runtime.py reads is in TENSORRT_API, so the walks above cover it."""
    chains = _runtime_tensorrt_chains(ENGINE_TENSORRT.read_text())
    assert {"Builder", "NetworkDefinitionCreationFlag.STRONGLY_TYPED", "MemoryPoolType.WORKSPACE"} <= chains
    assert sorted(chains - set(_tensorrt_api())) == []


def test_every_builder_flag_a_plan_names_is_in_the_tensorrt_api_for_its_major(tmp_path: Path) -> None:
    """tensorrt_runtime looks flags up by the plan's names: each must be one TensorRT has."""
    api = _tensorrt_api()
    models = {"mlp": inspect_onnx(str(fp32_mlp(tmp_path / "mlp.onnx"))), "qdq": inspect_onnx(str(qdq_int8(tmp_path / "qdq.onnx")))}
    option_sets = [
        EngineBuildOptions(precision=p, tf32=t, refit=r, strip_weights=s, version_compatible=True, hardware_compatibility_level=h)
        for p in ("fp32", "fp16", "bf16") for t in (False, True) for r in (False, True) for s in (False, True)
        for h in HARDWARE_COMPATIBILITY
    ] + [EngineBuildOptions(precision="fp32", layer_precisions={"fc1": "fp16", "fc2": "bf16"}, precision_constraints="obey")]
    for version in ("10.8", "10.13", "11.0"):
        major = int(version.split(".")[0])
        for name, model in models.items():
            for options in option_sets:
                try:
                    plan = plan_build(model, options, version)
                except EngineError as refused:  # bf16 or layer precisions where the build is strongly typed
                    assert refused.exit_code == 2
                    continue
                for flag in (*plan.builder_flags, *plan.cleared_flags):
                    assert major in api.get(f"BuilderFlag.{flag}", ()), (version, name, flag)
                assert major in api[f"HardwareCompatibilityLevel.{plan.hardware_compatibility}"]
                for _, data_type in plan.layer_precisions:
                    assert major in api[f"DataType.{data_type}"]


def test_missing_tensorrt_or_gpu_is_named_and_nothing_is_written(build_engine, artifacts_copy: Path) -> None:
    tensorrt_version, tensorrt_missing = probe.probe_tensorrt()
    cuda_missing = probe.probe_cuda()
    if tensorrt_version is not None and cuda_missing is None:
        pytest.skip("TensorRT and a CUDA GPU are both here: the engine is built instead")

    result = build_engine(artifacts_copy, "--max-batch", "2")

    assert result.exit_code == EXIT_UNAVAILABLE
    assert len(result.error_lines) == 1
    line = result.error_lines[0]
    for reason in (tensorrt_missing, cuda_missing):
        if reason:
            assert reason in line
    assert "--fallback onnxruntime" in line
    assert not result.out.exists() and not result.report_path.exists()


def test_unavailable_message_names_each_missing_part() -> None:
    error = probe.unavailable_error(["TensorRT is not installed (x)", "no CUDA GPU is visible (y)"])
    assert error.exit_code == EXIT_UNAVAILABLE
    assert "TensorRT is not installed (x); and no CUDA GPU is visible (y)" in str(error)
    assert "\n" not in str(error)


def test_stubs_alone_are_not_mistaken_for_tensorrt() -> None:
    """tensorrt-stubs makes `import tensorrt` succeed as an empty namespace package."""
    try:
        import tensorrt
    except ImportError:
        pytest.skip("no `tensorrt` module at all here")
    if hasattr(tensorrt, "Builder"):
        pytest.skip("the real TensorRT is installed here")
    version, reason = probe.probe_tensorrt()
    assert version is None
    assert reason is not None and "only type stubs" in reason


# --- Precision per TensorRT major ---------------------------------------------------------


def _model(weight_types: set[str] = frozenset({"float32"}), quantized: bool = False) -> OnnxModelInfo:
    image = TensorInfo("images", "float32", ("batch", 3, 32, 32))
    logits = TensorInfo("logits", "float32", ("batch", 10))
    types = frozenset({"INT8"}) if quantized else frozenset()
    return OnnxModelInfo("model.onnx", (image,), (logits,), 17, None, types, frozenset(weight_types))


def plan_precision(major: int, precision, model: OnnxModelInfo):
    return plan_build(model, EngineBuildOptions(precision=precision), f"{major}.13")


@pytest.mark.parametrize(
    "major, precision, strongly_typed, flags, conversion",
    [
        (10, "fp32", False, (), None),
        (10, "fp16", False, ("FP16",), None),
        (10, "bf16", False, ("BF16",), None),
        (11, "fp32", True, (), None),
        (11, "fp16", True, (), "float16"),
    ],
)
def test_precision_plan(major: int, precision, strongly_typed: bool, flags: tuple, conversion) -> None:
    plan = plan_precision(major, precision, _model())
    assert (plan.strongly_typed, plan.builder_flags, plan.onnx_conversion) == (strongly_typed, flags, conversion)


def test_tensorrt_11_builds_an_fp16_model_as_it_is() -> None:
    plan = plan_precision(11, "fp16", _model({"float16"}))
    assert plan.onnx_conversion is None and plan.builder_flags == ()


def test_tensorrt_11_bf16_needs_a_bf16_model() -> None:
    with pytest.raises(EngineError, match="ModelOpt AutoCast"):
        plan_precision(11, "bf16", _model())
    assert plan_precision(11, "bf16", _model({"bfloat16"})).onnx_conversion is None


@pytest.mark.parametrize("major", [10, 11])
def test_int8_needs_a_quantized_model(major: int) -> None:
    with pytest.raises(EngineError, match="needs a quantized ONNX model") as raised:
        plan_precision(major, "int8", _model())
    assert raised.value.exit_code == 2
    plan = plan_precision(major, "int8", _model(quantized=True))
    assert plan.builder_flags == () and plan.strongly_typed  # 10.13 and 11: Q/DQ models are strongly typed
    assert plan.onnx_conversion is None
    older = plan_build(_model(quantized=True), EngineBuildOptions(precision="int8"), "10.8")
    assert (older.strongly_typed, older.builder_flags) == (False, ("INT8",))


def test_unsupported_tensorrt_major_is_refused() -> None:
    with pytest.raises(EngineError, match="TensorRT 9 is not supported"):
        plan_precision(9, "fp16", _model())


def test_float16_conversion_for_tensorrt_11_keeps_io_and_accuracy(trained_artifacts: Path, tmp_path: Path) -> None:
    """The conversion TensorRT 11 builds from, run here with ONNX Runtime: fp16 weights, fp32 I/O, within the fp16 bound."""
    import onnx

    from dtrain_engine.check import OnnxRuntimeCpu, compare_outputs

    converted = tmp_path / "model-fp16.onnx"
    convert_to_float16(str(trained_artifacts), str(converted))

    info = inspect_onnx(str(converted))
    assert info.inputs[0].dtype == "float32" and info.outputs[0].dtype == "float32"
    weights = onnx.load(str(converted)).graph.initializer
    assert {onnx.TensorProto.FLOAT16} == {w.data_type for w in weights if w.name.endswith("weight")}

    batch = {"images": np.random.default_rng(0).standard_normal((4, 3, 32, 32), dtype=np.float32)}
    reference = OnnxRuntimeCpu(str(trained_artifacts)).infer(batch)
    comparison = compare_outputs(OnnxRuntimeCpu(str(converted)).infer(batch), reference, "fp32", 4, 2e-2)
    assert comparison.passed
    assert comparison.max_relative_error > 1e-6  # it really ran in fp16


def test_parser_errors_name_their_node() -> None:
    line = describe_parser_error(0, 12, "/features/Conv_1", "Conv", "Unsupported padding mode\n")
    assert line == "  parser error 1: node 12 (Conv '/features/Conv_1'): Unsupported padding mode"
    assert describe_parser_error(2, -1, "", "", "bad IR version") == "  parser error 3: the model: bad IR version"
