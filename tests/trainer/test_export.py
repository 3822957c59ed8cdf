"""ONNX export and its ONNX Runtime check: a good export passes, broken ones are caught."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from dtrain_common.accuracy import max_relative_error
from dtrain_common.errors import ConfigError
from dtrain_operator.api import contract
from dtrain_trainer.example_inputs import INPUT_NAME, resolve_example
from dtrain_trainer.export import (
    PARITY_TOLERANCE,
    ExportError,
    check_onnx_parity,
    export_artifacts,
    export_onnx,
    termination_summary,
    write_termination_log,
)

SHAPE = (3, 16, 16)


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )


class StatefulModel(nn.Module):
    """Its output depends on Python state that tracing bakes in as a constant: a broken export."""

    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_cnn()
        self.calls = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(images) * float(self.calls)


def test_export_with_dynamic_batch_passes_the_check(tmp_path: Path) -> None:
    model = tiny_cnn()
    exported = export_onnx(model, SHAPE, tmp_path / "m.onnx", opset=17, dynamic_batch=True)
    assert (exported.opset, exported.exporter, exported.dynamic_batch) == (17, "torchscript", True)
    assert not model.training  # exported in eval mode
    graph = onnx.load(str(exported.path)).graph
    assert graph.input[0].name == INPUT_NAME
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param  # symbolic batch axis
    for batch in (1, 3, 7):
        assert check_onnx_parity(model, exported.path, torch.randn(batch, *SHAPE)) < 1e-5


def test_fixed_batch_export(tmp_path: Path) -> None:
    exported = export_onnx(tiny_cnn(), SHAPE, tmp_path / "m.onnx", opset=17, dynamic_batch=False)
    dims = onnx.load(str(exported.path)).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, *SHAPE]


def test_opset_18_uses_the_dynamo_exporter(tmp_path: Path) -> None:
    model = tiny_cnn()
    exported = export_onnx(model, SHAPE, tmp_path / "m.onnx", opset=18, dynamic_batch=True)
    assert (exported.opset, exported.exporter) == (18, "dynamo")
    assert check_onnx_parity(model, exported.path, torch.randn(3, *SHAPE)) < 1e-5


def test_tampered_weights_are_detected(tmp_path: Path) -> None:
    model = tiny_cnn()
    path = export_onnx(model, SHAPE, tmp_path / "m.onnx").path
    proto = onnx.load(str(path))
    largest = max(proto.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    weights = numpy_helper.to_array(largest).copy()
    weights += 0.5
    largest.CopyFrom(numpy_helper.from_array(weights, largest.name))
    onnx.save(proto, str(path))
    assert check_onnx_parity(model, path, torch.randn(2, *SHAPE)) > PARITY_TOLERANCE


def test_a_file_that_is_not_onnx_is_an_export_error(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"not a model")
    with pytest.raises(ExportError, match="ONNX Runtime cannot load"):
        check_onnx_parity(tiny_cnn(), path, torch.randn(2, *SHAPE))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_a_baked_in_batch_size_is_detected(tmp_path: Path) -> None:
    class FixedBatch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_cnn()

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.net(images).reshape(int(images.shape[0]), -1)  # int(): tracing keeps the export's batch

    model = FixedBatch()
    path = export_onnx(model, SHAPE, tmp_path / "m.onnx", dynamic_batch=True).path
    with pytest.raises(ExportError):
        check_onnx_parity(model, path, torch.randn(3, *SHAPE))


def test_export_artifacts_writes_checked_files(tmp_path: Path) -> None:
    checkpoint = tmp_path / "last.ckpt"
    torch.save({"global_step": 7}, checkpoint)
    metrics = {"loss": 0.5, "step": 7, "epoch": 1, "imagesPerSecond": 123.0}
    model_class = {"classPath": "pkg.TinyCNN", "initArgs": {"width": 4}}
    record = export_artifacts(
        tiny_cnn(), SHAPE, 17, True, tmp_path / "art", "job", metrics, checkpoint, model_class=model_class
    )
    onnx_path = tmp_path / "art" / contract.ONNX_FILE_NAME
    on_disk = json.loads((tmp_path / "art" / contract.ARTIFACTS_FILE_NAME).read_text())
    assert on_disk == record
    assert record["onnx"]["path"] == str(onnx_path) and record["onnx"]["sizeBytes"] == onnx_path.stat().st_size
    assert len(record["onnx"]["sha256"]) == 64
    assert record["parity"]["ok"] and record["parity"]["maxRelativeError"] <= PARITY_TOLERANCE
    assert record["checkpoint"]["path"] == str(checkpoint)
    assert record[contract.ARTIFACTS_KEY_MODEL] == model_class
    assert record["metrics"] == metrics
    assert {"torch", "lightning", "onnxruntime", "python"} <= set(record["versions"])
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    assert session.run(None, {INPUT_NAME: np.zeros((4, *SHAPE), np.float32)})[0].shape == (4, 5)
    assert sorted(p.name for p in (tmp_path / "art").iterdir()) == [contract.ARTIFACTS_FILE_NAME, contract.ONNX_FILE_NAME]


def test_export_artifacts_rejects_a_broken_export(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="ONNX Runtime disagrees with PyTorch on a random batch"):
        export_artifacts(StatefulModel(), SHAPE, 17, True, tmp_path / "art", "job", {}, None)
    # Nothing half-done is left for the engine Job to pick up.
    assert list((tmp_path / "art").iterdir()) == []


def test_max_relative_error() -> None:
    reference = np.array([[1.0, -4.0], [0.0, 2.0]])
    assert max_relative_error(reference, reference) == 0.0
    assert max_relative_error(reference + 0.004, reference) == pytest.approx(0.001)
    assert max_relative_error(np.zeros(3), np.zeros(3)) == 0.0  # no division by zero
    assert max_relative_error(np.array([np.nan]), np.array([1.0])) == math.inf
    assert max_relative_error(np.zeros(2), np.zeros(3)) == math.inf


def test_input_sources() -> None:
    class Data:
        sample_shape = (3, 32, 32)

    class Model:
        example_input_array = torch.zeros(1, 1, 28, 28)

    # The model's own example first (dtypes kept), then export.onnx.inputShape, then the data module.
    assert resolve_example([3, 64, 64], "float32", Data(), Model()).shapes == ((1, 28, 28),)
    assert resolve_example([3, 64, 64], "float32", Data(), object()).shapes == ((3, 64, 64),)
    ids = resolve_example([12], "int64", Data(), object())
    assert (ids.shapes, ids.tensors[0].dtype) == (((12,),), torch.int64)
    assert resolve_example(None, "float32", Data(), object()).shapes == ((3, 32, 32),)
    with pytest.raises(ConfigError, match="export.onnx.inputShape"):
        resolve_example(None, "float32", object(), object())


class TextClassifier(nn.Module):
    """Token ids in, class scores out: an integer input the export must keep."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 3)
        self.example_input_array = torch.randint(0, 50, (2, 7))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(dim=1))


class TwoInputs(nn.Module):
    """An image and a mask, in that order, given as a tuple or a dict."""

    def __init__(self, as_dict: bool = False) -> None:
        super().__init__()
        self.net = tiny_cnn()
        example = (torch.randn(2, *SHAPE), torch.ones(2, 5, dtype=torch.bool))
        self.example_input_array = {"mask": example[1], "images": example[0]} if as_dict else example

    def forward(self, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.net(images) * mask.float()


@pytest.mark.parametrize(
    ("model", "inputs"),
    [
        (TextClassifier(), [{"name": "input", "shape": [7], "dtype": "int64"}]),
        (TwoInputs(), [{"name": "images", "shape": [3, 16, 16], "dtype": "float32"}, {"name": "mask", "shape": [5], "dtype": "bool"}]),
        (TwoInputs(as_dict=True), [{"name": "images", "shape": [3, 16, 16], "dtype": "float32"}, {"name": "mask", "shape": [5], "dtype": "bool"}]),
    ],
    ids=["embedding-ids", "tuple-of-two", "dict-of-two"],
)
def test_models_with_integer_and_several_inputs_export_and_pass_the_check(
    tmp_path: Path, model: nn.Module, inputs: list[dict[str, object]]
) -> None:
    example = resolve_example(None, "float32", object(), model)
    record = export_artifacts(model, example, 17, True, tmp_path, "job", {}, None)
    assert record["onnx"]["inputs"] == inputs
    assert record["parity"]["ok"] and record["parity"]["maxRelativeError"] <= PARITY_TOLERANCE
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    fed = {i.name: i.type for i in session.get_inputs()}
    assert list(fed) == [i["name"] for i in inputs]
    assert fed[inputs[0]["name"]] == ("tensor(int64)" if inputs[0]["dtype"] == "int64" else "tensor(float)")
    if len(inputs) == 2:
        assert fed["mask"] == "tensor(bool)"
    # The check feeds every input: a wrong second input shows up as a disagreement.
    batch = example.with_float32().batch(3)
    assert check_onnx_parity(model, tmp_path / "model.onnx", batch) <= PARITY_TOLERANCE


def test_an_example_input_array_of_the_wrong_kind_is_named() -> None:
    class Odd(nn.Module):
        example_input_array: ClassVar[list[int]] = [1, 2, 3]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(ConfigError, match="Odd.example_input_array: input 'input_0' is not a tensor"):
        resolve_example(None, "float32", object(), Odd())


def test_termination_log(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    write_termination_log({"ok": True, "step": 3}, {contract.ENV_TERMINATION_LOG: str(path)})
    assert json.loads(path.read_text()) == {"ok": True, "step": 3}
    huge = termination_summary({"ok": False, "error": "x" * 10_000, "step": 3, "noise": "y" * 10_000})
    assert len(huge.encode()) <= contract.TERMINATION_MESSAGE_MAX_BYTES
    assert json.loads(huge)["ok"] is False


class DataDependentBranch(nn.Module):
    """torch.export cannot trace a branch on a tensor's value; the TorchScript tracer follows the branch taken."""

    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_cnn()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.abs().sum() >= 0:  # always true, but only a value can tell
            return self.net(images)
        return -self.net(images)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_opset_18_falls_back_to_the_torchscript_exporter(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = DataDependentBranch()
    exported = export_onnx(model, SHAPE, tmp_path / "m.onnx", opset=18, dynamic_batch=True)
    assert (exported.opset, exported.exporter) == (18, "torchscript")
    assert "the dynamo ONNX exporter failed" in caplog.text
    assert check_onnx_parity(model, exported.path, torch.randn(3, *SHAPE)) < 1e-5


def test_a_large_models_weights_land_under_their_final_name_and_are_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above EXTERNAL_DATA_BYTES the weights go to model.onnx.data, as the graph names them, never a temporary name."""
    from dtrain_trainer import export

    monkeypatch.setattr(export, "EXTERNAL_DATA_BYTES", 0)  # the tiny model counts as large: the same path, in seconds
    artifacts = tmp_path / "art"
    record = export_artifacts(tiny_cnn(), SHAPE, 18, True, artifacts, "job", {}, None)

    data = artifacts / (contract.ONNX_FILE_NAME + ".data")
    assert sorted(p.name for p in artifacts.iterdir()) == [contract.ARTIFACTS_FILE_NAME, contract.ONNX_FILE_NAME, data.name]
    graph = onnx.load(str(artifacts / contract.ONNX_FILE_NAME), load_external_data=False)
    locations = {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {data.name}
    assert record["onnx"]["externalData"] == [
        {"path": str(data), "sha256": export.sha256_file(data), "sizeBytes": data.stat().st_size}
    ]
    session = ort.InferenceSession(str(artifacts / contract.ONNX_FILE_NAME), providers=["CPUExecutionProvider"])
    assert session.run(None, {INPUT_NAME: np.zeros((2, *SHAPE), np.float32)})[0].shape == (2, 5)


def test_a_failed_large_export_leaves_no_data_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dtrain_trainer import export

    class NotANumber(nn.Module):  # exports fine; its outputs fail the parity check
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_cnn()

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.net(images) * float("nan")

    monkeypatch.setattr(export, "EXTERNAL_DATA_BYTES", 0)
    with pytest.raises(ExportError, match="ONNX Runtime disagrees"):
        export_artifacts(NotANumber(), SHAPE, 18, True, tmp_path / "art", "job", {}, None)
    assert list((tmp_path / "art").iterdir()) == []
