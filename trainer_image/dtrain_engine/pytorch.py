"""The PyTorch model that model.onnx was exported from: the eager baseline and an independent reference.

It is found from --pytorch-checkpoint and --model-config, or else from the artifacts.json
that training wrote next to model.onnx (contract.ARTIFACTS_KEY_CHECKPOINT and
ARTIFACTS_KEY_MODEL). Explicit flags that do not work are errors; an artifacts.json that
does not lead to a model only leaves the baseline out, with the reason in the report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dtrain_engine.check import Arrays, Timing, TimingSettings, measure_latency
from dtrain_engine.onnx_model import EngineError, OnnxModelInfo, usage_error
from dtrain_operator import api
from dtrain_operator.api import contract


@dataclass(frozen=True)
class PyTorchSource:
    checkpoint: str
    model: api.ClassSpec
    origin: str  # where the two came from, for the report

    def to_json(self) -> dict[str, object]:
        return {"checkpoint": self.checkpoint, "class_path": self.model.class_path, "origin": self.origin}


@dataclass(frozen=True)
class SourceLookup:
    source: PyTorchSource | None
    reason: str | None = None  # why there is no source
    explicit: bool = False  # the user asked for it with flags: failing to load it is an error
    warnings: list[str] = field(default_factory=list)


def _model_from_config_file(path: str) -> api.ClassSpec:
    """The `model` of a trainer config (what DTRAIN_CONFIG holds) or of a DistributedTraining job file."""
    import yaml
    from pydantic import ValidationError

    from dtrain_common.config import parse_config
    from dtrain_common.errors import ConfigError
    from dtrain_operator.api.validation import format_validation_error

    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise usage_error(f"--model-config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise usage_error(f"--model-config {path}: cannot read it: {error}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        raise usage_error(f"--model-config {path} is not YAML or JSON") from None
    if isinstance(document, dict) and document.get("kind") == contract.KIND:
        try:
            return api.DistributedTraining.model_validate(document).spec.model
        except ValidationError as error:
            raise usage_error(f"--model-config {path}: {format_validation_error(error)[0]}") from None
    try:
        return parse_config(text, path).model
    except ConfigError as error:
        raise usage_error(f"--model-config {error}") from None


def _artifacts_checkpoint(value: object, base_dir: str) -> str | None:
    path = value.get("path") if isinstance(value, dict) else value
    if not isinstance(path, str) or not path:
        return None
    return path if os.path.isabs(path) else os.path.join(base_dir, path)


def find_pytorch_source(
    onnx_path: str, checkpoint_flag: str | None, model_config_flag: str | None
) -> SourceLookup:
    """Flags first, then artifacts.json next to the ONNX model; each part may come from either."""
    base_dir = os.path.dirname(os.path.abspath(onnx_path))
    artifacts_path = os.path.join(base_dir, contract.ARTIFACTS_FILE_NAME)
    artifacts: dict[str, Any] = {}
    warnings: list[str] = []
    if os.path.isfile(artifacts_path):
        try:
            loaded = json.loads(Path(artifacts_path).read_text())
            artifacts = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError) as error:
            warnings.append(f"{artifacts_path} is not readable JSON ({error}); it is ignored")

    explicit = checkpoint_flag is not None or model_config_flag is not None
    if checkpoint_flag is not None and not os.path.isfile(checkpoint_flag):
        raise usage_error(f"--pytorch-checkpoint {checkpoint_flag}: no such file")
    model = _model_from_config_file(model_config_flag) if model_config_flag is not None else None
    checkpoint = checkpoint_flag
    checkpoint_origin = "--pytorch-checkpoint"
    model_origin = "--model-config"
    if checkpoint is None and contract.ARTIFACTS_KEY_CHECKPOINT in artifacts:
        checkpoint = _artifacts_checkpoint(artifacts[contract.ARTIFACTS_KEY_CHECKPOINT], base_dir)
        checkpoint_origin = artifacts_path
    if model is None and isinstance(artifacts.get(contract.ARTIFACTS_KEY_MODEL), dict):
        try:
            model = api.ClassSpec.model_validate(artifacts[contract.ARTIFACTS_KEY_MODEL])
            model_origin = artifacts_path
        except ValueError as error:
            key = contract.ARTIFACTS_KEY_MODEL
            warnings.append(f"{artifacts_path}: '{key}' is not a classPath/initArgs object ({error})")

    if checkpoint is None or model is None:
        missing = "a checkpoint" if checkpoint is None else "the model's classPath"
        hint = "--pytorch-checkpoint" if checkpoint is None else "--model-config"
        if explicit:
            raise usage_error(
                f"the PyTorch baseline needs {missing} as well: pass {hint}, or an {contract.ARTIFACTS_FILE_NAME} with "
                f"'{contract.ARTIFACTS_KEY_CHECKPOINT}' and '{contract.ARTIFACTS_KEY_MODEL}' next to the ONNX model"
            )
        reason = (
            f"no PyTorch model: {missing} is unknown (pass --pytorch-checkpoint and --model-config, or keep "
            f"the trainer's {contract.ARTIFACTS_FILE_NAME} next to the ONNX model)"
        )
        return SourceLookup(None, reason, explicit, warnings)
    if not os.path.isfile(checkpoint):
        if explicit and checkpoint_flag is not None:
            raise usage_error(f"--pytorch-checkpoint {checkpoint}: no such file")
        reason = f"no PyTorch model: the checkpoint {checkpoint} named in {artifacts_path} is gone"
        return SourceLookup(None, reason, explicit, warnings)
    origin = f"checkpoint from {checkpoint_origin}, model from {model_origin}"
    return SourceLookup(PyTorchSource(checkpoint, model, origin), None, explicit, warnings)


def load_pytorch_model(source: PyTorchSource) -> Any:
    """The model class with the checkpoint's weights, in eval mode on the CPU.

    The checkpoint is a Lightning checkpoint (weights under "state_dict") or a plain state
    dict; it is read with weights_only=True, so loading it runs no code from the file.
    """
    import torch

    from dtrain_common.errors import ConfigError
    from dtrain_common.loading import instantiate

    try:
        model = instantiate(source.model, "model", torch.nn.Module)
    except ConfigError as error:
        raise usage_error(f"cannot build the PyTorch model for the baseline: {error}") from None
    try:
        checkpoint = torch.load(source.checkpoint, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises pickle and runtime errors of many kinds for a bad file
        raise usage_error(f"cannot read the checkpoint {source.checkpoint}: {type(error).__name__}: {error}") from None
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise usage_error(f"{source.checkpoint} holds no state dict (a Lightning checkpoint or a model's state_dict())")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0]
        raise usage_error(
            f"the checkpoint {source.checkpoint} does not fit {source.model.class_path}: {first_line}"
        ) from None
    return model.eval()


class PyTorchEager:
    """The model in eager mode: outputs mapped in order onto the ONNX model's output names."""

    def __init__(
        self, model: Any, onnx_model: OnnxModelInfo, device: str = "cpu", autocast_dtype: str | None = None
    ):
        import torch

        self._torch = torch
        self._device = torch.device(device)
        self._model = model.to(self._device)
        self._output_names = [tensor.name for tensor in onnx_model.outputs]
        self._autocast = getattr(torch, autocast_dtype) if autocast_dtype else None
        self.name = "pytorch"
        self.mode = f"eager {autocast_dtype + ' autocast' if autocast_dtype else 'fp32'} on {self._device.type}"
        # The threads it computes on, on the CPU (OMP_NUM_THREADS, or torch's default of one per core).
        self.cpu_threads: int = torch.get_num_threads()

    def _forward(self, inputs: list[Any]) -> Any:
        torch = self._torch
        with torch.inference_mode():
            if self._autocast is not None:
                with torch.autocast(self._device.type, dtype=self._autocast):
                    return self._model(*inputs)
            return self._model(*inputs)

    def _to_device(self, inputs: Arrays) -> list[Any]:
        return [self._torch.from_numpy(np.ascontiguousarray(array)).to(self._device) for array in inputs.values()]

    def infer(self, inputs: Arrays, profile: int = 0) -> dict[str, np.ndarray]:
        result = self._forward(self._to_device(inputs))
        if isinstance(result, dict):
            values = list(result.values())
        elif isinstance(result, (list, tuple)):
            values = list(result)
        else:
            values = [result]
        if len(values) != len(self._output_names):
            raise EngineError(
                f"the PyTorch model returns {len(values)} output(s) and the ONNX model {len(self._output_names)}: "
                "they are not the same model"
            )
        # Floats in fp32 (autocast leaves fp16); integer and boolean outputs keep their type.
        return {
            name: (value.detach().float() if value.is_floating_point() else value.detach()).cpu().numpy()
            for name, value in zip(self._output_names, values)
        }

    def prepare_timed_run(self, inputs: Arrays) -> Callable[[], None]:
        device_inputs = self._to_device(inputs)
        synchronize = self._torch.cuda.synchronize if self._device.type == "cuda" else None

        def run() -> None:
            self._forward(device_inputs)
            if synchronize is not None:
                synchronize()

        return run

    def measure(self, inputs: Arrays, profile: int, batch_size: int, settings: TimingSettings) -> Timing:
        return Timing(measure_latency(self.prepare_timed_run(inputs), batch_size, settings))
