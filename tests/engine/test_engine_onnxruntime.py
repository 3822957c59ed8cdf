"""The ONNX Runtime fallback for real: a small exported model, checked against the PyTorch
model it came from, at the min/opt/max batch sizes, with the report and the termination summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from dtrain_engine.onnx_model import ENGINE_SUFFIXES
from dtrain_operator.api import contract

FALLBACK = ["--fallback", "onnxruntime"]


def _files_named_like_engines(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.name.endswith(ENGINE_SUFFIXES)]


def test_fallback_checks_and_times_the_model_against_pytorch(build_engine, artifacts_copy: Path) -> None:
    result = build_engine(artifacts_copy, *FALLBACK, "--min-batch", "1", "--opt-batch", "2", "--max-batch", "4")

    assert result.exit_code == 0, result.stderr
    assert "No TensorRT engine was built" in result.stdout
    assert not result.out.exists()
    assert _files_named_like_engines(result.out.parent) == []
    assert _files_named_like_engines(artifacts_copy.parent) == []

    report = result.report
    assert report["engine"] is None
    assert report["backend"] == "onnxruntime-cpu"
    assert report["passed"] is True
    assert report["tensorrt"] is None
    assert report["batch_sizes"] == {"min": 1, "opt": 2, "max": 4}
    assert report["onnx"]["dynamic_batch"] is True
    assert report["onnx"]["inputs"] == [{"name": "images", "shape": ["batch", 3, 32, 32], "dtype": "float32"}]
    assert report["notes"][0].startswith("No TensorRT engine was built")

    accuracy = report["accuracy"]
    assert accuracy["references"] == ["pytorch"]
    assert accuracy["bound"] == 1e-3
    assert [c["batch_size"] for c in accuracy["comparisons"]] == [1, 2, 4]
    for comparison in accuracy["comparisons"]:
        assert comparison["passed"] is True
        assert 0 <= comparison["max_relative_error"] < 1e-5  # ONNX Runtime and PyTorch agree to float rounding

    assert [row["batch_size"] for row in report["latency"]] == [1, 2, 4]
    for row in report["latency"]:
        assert 0 < row["median_ms"] <= row["p99_ms"]
        assert row["images_per_second"] == pytest.approx(row["batch_size"] / row["median_ms"] * 1000, rel=1e-2)
        assert row["iterations"] >= 5
        assert row["pytorch"]["median_ms"] > 0
        assert row["speedup_vs_pytorch"] == pytest.approx(row["pytorch"]["median_ms"] / row["median_ms"], rel=1e-2)
    assert report["pytorch"]["available"] is True
    assert report["pytorch"]["class_path"] == "engine_test_models.TinyClassifier"
    artifacts_json = str(artifacts_copy.parent / contract.ARTIFACTS_FILE_NAME)
    assert report["pytorch"]["origin"] == f"checkpoint from {artifacts_json}, model from {artifacts_json}"
    assert report["pytorch"]["mode"] == "eager fp32 on cpu"
    assert report["timing"]["seed"] == 7
    # Like with like: ONNX Runtime on as many threads as PyTorch, the two timed in turn.
    import torch

    assert report["timing"]["cpu_threads"] == torch.get_num_threads()
    assert report["timing"]["order"] == "the backend and PyTorch eager in turn, one run each per round"


def test_termination_summary_is_short_json_naming_the_outcome(
    build_engine, artifacts_copy: Path, termination_log: Path
) -> None:
    result = build_engine(artifacts_copy, *FALLBACK, "--max-batch", "2")

    assert result.exit_code == 0, result.stderr
    text = termination_log.read_text()
    assert len(text.encode()) < contract.TERMINATION_MESSAGE_MAX_BYTES
    summary = json.loads(text)
    assert summary["passed"] is True
    assert summary["engine"] is None
    assert summary["backend"] == "onnxruntime-cpu"
    assert summary["report"] == str(result.report_path)
    assert "No TensorRT engine was built" in summary["message"]
    assert [row[0] for row in summary["latency"]] == [1, 2]


def _perturb_head(onnx_path: Path, scale: float) -> None:
    """Scale the classifier head's weights in the ONNX file: a model that no longer matches its checkpoint."""
    model = onnx.load(str(onnx_path))
    for index, initializer in enumerate(model.graph.initializer):
        if initializer.name == "head.weight":
            weights = numpy_helper.to_array(initializer) * scale
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(weights.astype(np.float32), initializer.name))
            onnx.save(model, str(onnx_path))
            return
    raise AssertionError(f"no head.weight initializer in {onnx_path}")


def test_a_perturbed_model_fails_the_check_against_its_checkpoint(
    build_engine, artifacts_copy: Path, termination_log: Path
) -> None:
    _perturb_head(artifacts_copy, 1.01)  # a 1% error in one layer's weights

    result = build_engine(artifacts_copy, *FALLBACK, "--max-batch", "4")

    assert result.exit_code == 1
    assert len(result.error_lines) == 1
    assert "accuracy check failed" in result.error_lines[0]
    assert "against pytorch" in result.error_lines[0]
    report = result.report
    assert report["passed"] is False
    assert report["accuracy"]["passed"] is False
    errors = [c["max_relative_error"] for c in report["accuracy"]["comparisons"]]
    assert all(e > 1e-3 for e in errors), errors
    assert json.loads(termination_log.read_text())["passed"] is False


def test_dynamic_batch_sizes_default_and_single_size(build_engine, artifacts_copy: Path) -> None:
    result = build_engine(artifacts_copy, *FALLBACK, "--min-batch", "3", "--max-batch", "3")

    assert result.exit_code == 0, result.stderr
    assert result.report["batch_sizes"] == {"min": 3, "opt": 3, "max": 3}
    assert [row["batch_size"] for row in result.report["latency"]] == [3]


def test_static_batch_model_serves_its_own_batch(build_engine, static_artifacts: Path) -> None:
    result = build_engine(static_artifacts, *FALLBACK)

    assert result.exit_code == 0, result.stderr
    report = result.report
    assert report["onnx"]["dynamic_batch"] is False
    assert report["batch_sizes"] == {"min": 4, "opt": 4, "max": 4}
    assert [row["batch_size"] for row in report["latency"]] == [4]
    assert [c["batch_size"] for c in report["accuracy"]["comparisons"]] == [4]


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--max-batch", "8"], "--max-batch 8"),
        (["--min-batch", "1", "--opt-batch", "4", "--max-batch", "4"], "--min-batch 1"),
        (["--min-batch", "4", "--opt-batch", "4", "--max-batch", "16"], "--max-batch 16"),
    ],
)
def test_static_batch_model_refuses_batch_sizes_it_cannot_serve(
    build_engine, static_artifacts: Path, flags: list[str], named: str
) -> None:
    result = build_engine(static_artifacts, *FALLBACK, *flags)

    assert result.exit_code == 2
    assert len(result.error_lines) == 1
    line = result.error_lines[0]
    assert "static batch size of 4" in line and named in line
    assert "dynamicBatch" in line
    assert not result.report_path.exists()


def test_without_a_pytorch_model_only_finiteness_is_checked_and_said_so(build_engine, tmp_path: Path) -> None:
    from engine_test_models import export_onnx, make_model

    onnx_path = export_onnx(make_model(), tmp_path / "bare.onnx")

    result = build_engine(onnx_path, *FALLBACK, "--max-batch", "2")

    assert result.exit_code == 0, result.stderr
    report = result.report
    assert report["pytorch"]["available"] is False
    assert "no PyTorch model" in report["pytorch"]["reason"]
    assert report["accuracy"]["references"] == []
    assert report["accuracy"]["comparisons"] == []
    assert any("only checked to be finite" in note for note in report["notes"])
    assert all(row["pytorch"] is None for row in report["latency"])


def test_explicit_checkpoint_and_model_config_override_artifacts(build_engine, tmp_path: Path) -> None:
    import torch
    import yaml
    from engine_test_models import CLASS_PATH, export_onnx, make_model

    model = make_model(seed=3)
    onnx_path = export_onnx(model, tmp_path / "exported.onnx")
    torch.save(model.state_dict(), tmp_path / "weights.pt")  # a plain state dict, not a Lightning checkpoint
    config = tmp_path / "trainer.yaml"
    config.write_text(yaml.safe_dump({"jobName": "tiny", "model": {"classPath": CLASS_PATH}}))

    result = build_engine(
        onnx_path, *FALLBACK, "--max-batch", "2", "--pytorch-checkpoint", str(tmp_path / "weights.pt"),
        "--model-config", str(config),
    )

    assert result.exit_code == 0, result.stderr
    assert result.report["pytorch"]["origin"] == "checkpoint from --pytorch-checkpoint, model from --model-config"
    assert result.report["accuracy"]["references"] == ["pytorch"]


def test_a_checkpoint_of_another_model_is_refused_in_one_line(build_engine, tmp_path: Path) -> None:
    import torch
    from engine_test_models import export_onnx, make_model

    onnx_path = export_onnx(make_model(), tmp_path / "exported.onnx")
    torch.save({"state_dict": {"other.weight": torch.zeros(2)}}, tmp_path / "other.ckpt")
    config = tmp_path / "trainer.yaml"
    config.write_text("jobName: tiny\nmodel:\n  classPath: engine_test_models.TinyClassifier\n")

    result = build_engine(
        onnx_path, *FALLBACK, "--pytorch-checkpoint", str(tmp_path / "other.ckpt"), "--model-config", str(config)
    )

    assert result.exit_code == 2
    assert len(result.error_lines) == 1
    assert "does not fit engine_test_models.TinyClassifier" in result.error_lines[0]
