"""ONNX export at the end of training, checked with ONNX Runtime against PyTorch.

`export_onnx` and `check_onnx_parity` are the reusable parts (the engine builder's ONNX
Runtime path and `dtrain run` use them too); `export_artifacts` is what rank 0 runs after
the final checkpoint: model.onnx, checked, then artifacts.json beside it.

Exporter choice: torch's dynamo exporter implements opset 18 and newer only, and for a
lower opset it exports 18 anyway after a failed down-conversion. So opset 17 (the
default, which every TensorRT 10 release parses) goes through the TorchScript exporter,
which honours it exactly and is several times faster on torchvision models; opset 18+
goes through the dynamo exporter, falling back to the TorchScript one when torch.export
cannot trace the model. artifacts.json records which one wrote the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dtrain_operator import contract

from .accuracy import max_relative_error
from .config import ConfigError
from .progress import utc_now

log = logging.getLogger("dtrain_trainer")

INPUT_NAME = "input"
OUTPUT_NAME = "output"
# Largest max|onnx - torch| / max|torch| accepted for an fp32 model.
PARITY_TOLERANCE = 1e-3
FIRST_DYNAMO_OPSET = 18
EXPORT_BATCH_DYNAMIC = 2  # not 1: an example batch of 1 lets tracing specialise the batch axis
PARITY_BATCH_DYNAMIC = 3  # differs from the export batch, so the check proves the axis is dynamic
VERSIONED_PACKAGES = ("dtrain", "torch", "torchvision", "lightning", "pytorch-lightning", "onnx", "onnxruntime", "onnxscript")
# Weights above this go to an external data file beside the graph (a protobuf cannot pass 2 GB).
EXTERNAL_DATA_BYTES = 1 << 30


class ExportError(Exception):
    """The export or its check failed; the message says which and why."""


@dataclass(frozen=True)
class OnnxFile:
    path: Path
    opset: int
    exporter: str
    dynamic_batch: bool
    input_shape: tuple[int, ...]


def resolve_input_shape(configured: Sequence[int] | None, datamodule: Any, model: Any) -> tuple[int, ...]:
    """One sample's shape (no batch axis): export.onnx.inputShape, the data module's sample_shape,
    or the model's example_input_array, in that order."""
    if configured:
        return tuple(int(d) for d in configured)
    shape = getattr(datamodule, "sample_shape", None)
    if shape:
        return tuple(int(d) for d in shape)
    example = getattr(model, "example_input_array", None)
    if isinstance(example, torch.Tensor) and example.dim() >= 2:
        return tuple(int(d) for d in example.shape[1:])
    raise ConfigError(
        "export.onnx.inputShape: the data module has no sample_shape and the model no example_input_array, "
        "so the input shape is unknown; set export.onnx.inputShape (e.g. [3, 224, 224]) or export.onnx.enabled: false"
    )


def _file_opset(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _export_torchscript(model: torch.nn.Module, example: torch.Tensor, path: Path, opset: int, dynamic: bool) -> None:
    with warnings.catch_warnings():
        # Chosen on purpose for opset 17 (see the module docstring); the deprecation notice is noise here.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (example,),
            str(path),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            opset_version=opset,
            dynamo=False,
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}} if dynamic else None,
        )


def _export_dynamo(model: torch.nn.Module, example: torch.Tensor, path: Path, opset: int, dynamic: bool) -> None:
    torch.onnx.export(
        model,
        (example,),
        str(path),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        opset_version=opset,
        dynamo=True,
        external_data=sum(p.numel() * p.element_size() for p in model.state_dict().values()) > EXTERNAL_DATA_BYTES,
        verbose=False,
        dynamic_shapes=({0: torch.export.Dim("batch", min=1)},) if dynamic else None,
    )


def export_onnx(
    model: torch.nn.Module,
    input_shape: Sequence[int],
    path: str | os.PathLike[str],
    opset: int = 17,
    dynamic_batch: bool = True,
) -> OnnxFile:
    """Write `model` (put in eval mode) to `path` as ONNX with one input, `input`, of shape (batch, *input_shape)."""
    path = Path(path)
    model.eval()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    example = torch.randn(EXPORT_BATCH_DYNAMIC if dynamic_batch else 1, *input_shape, device=device)
    exporter = "torchscript"
    with torch.no_grad():
        try:
            if opset >= FIRST_DYNAMO_OPSET:
                try:
                    _export_dynamo(model, example, path, opset, dynamic_batch)
                    exporter = "dynamo"
                except Exception as exc:  # torch.export cannot trace every model; the older exporter often can
                    log.warning(
                        "the dynamo ONNX exporter failed (%s: %s); trying the TorchScript exporter",
                        type(exc).__name__,
                        str(exc).splitlines()[0][:300] if str(exc) else "",
                    )
                    _export_torchscript(model, example, path, opset, dynamic_batch)
            else:
                _export_torchscript(model, example, path, opset, dynamic_batch)
        except Exception as exc:
            first_line = str(exc).splitlines()[0][:300] if str(exc) else ""
            raise ExportError(
                f"torch.onnx.export failed ({type(exc).__name__}: {first_line}); make the model's forward "
                "exportable, or set export.onnx.enabled: false"
            ) from exc
    return OnnxFile(path, _file_opset(path), exporter, dynamic_batch, tuple(int(d) for d in input_shape))


def _flatten(outputs: Any) -> list[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, Mapping):
        return [t for value in outputs.values() for t in _flatten(value)]
    if isinstance(outputs, (list, tuple)):
        return [t for value in outputs for t in _flatten(value)]
    raise ExportError(f"the model returned a {type(outputs).__name__}; the parity check compares tensors")


def check_onnx_parity(model: torch.nn.Module, onnx_path: str | os.PathLike[str], batch: torch.Tensor) -> float:
    """The largest relative error (see `accuracy.max_relative_error`) between ONNX Runtime and PyTorch over all outputs
    of `model` for `batch`. Raises ExportError when the file cannot be run or its outputs do not match in
    number or shape."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ExportError(f"ONNX Runtime cannot load {onnx_path}: {str(exc).splitlines()[0][:300]}") from exc
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise ExportError(f"{onnx_path} has {len(inputs)} inputs; the check feeds one image batch")
    model.eval()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with torch.no_grad():
        expected = [t.detach().float().cpu().numpy() for t in _flatten(model(batch.to(device)))]
    try:
        actual = session.run(None, {inputs[0].name: batch.detach().float().cpu().numpy()})
    except Exception as exc:
        raise ExportError(f"ONNX Runtime failed to run {onnx_path}: {str(exc).splitlines()[0][:300]}") from exc
    if len(actual) != len(expected):
        raise ExportError(f"{onnx_path} has {len(actual)} outputs, the PyTorch model {len(expected)}")
    for index, (a, e) in enumerate(zip(actual, expected)):
        if a.shape != e.shape:
            raise ExportError(f"output {index} of {onnx_path} is shaped {list(a.shape)}, PyTorch's {list(e.shape)}")
    return max(max_relative_error(np.asarray(a), e) for a, e in zip(actual, expected))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


def _write_json_atomically(path: Path, document: Mapping[str, Any]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    os.replace(temporary, path)


def _external_data_paths(graph: Path) -> tuple[str, ...]:
    import onnx

    from .engine_model import external_data_files

    return external_data_files(onnx.load(str(graph), load_external_data=False), str(graph.parent))


def _file_record(path: Path) -> dict[str, Any]:
    return {"path": str(path), "sha256": sha256_file(path), "sizeBytes": path.stat().st_size}


def export_artifacts(
    model: torch.nn.Module,
    input_shape: Sequence[int],
    opset: int,
    dynamic_batch: bool,
    artifacts_dir: Path,
    job_name: str,
    metrics: Mapping[str, Any],
    checkpoint: Path | None,
    model_class: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Export `model` (moved to the CPU in fp32) to artifacts_dir/model.onnx, check it, and write
    artifacts.json. model.onnx appears only once it has passed the check. Returns the artifacts record.

    `model_class` (the spec's classPath and initArgs) and the checkpoint let `dtrain build-engine`
    rebuild the PyTorch model for its reference and eager baseline."""
    try:
        artifacts_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"artifacts.dir {artifacts_dir}: cannot create it ({exc.strerror})") from exc
    model = model.to("cpu").float().eval()
    onnx_path = artifacts_dir / contract.ONNX_FILE_NAME
    # Exported under its final name in a scratch directory: the external data files of a large
    # model are named, and referenced by the graph, as they will be in artifacts_dir. Data files
    # move first, the graph last; a failure leaves nothing behind.
    scratch = Path(tempfile.mkdtemp(prefix=".export-", dir=artifacts_dir))
    candidate = scratch / contract.ONNX_FILE_NAME
    try:
        exported = export_onnx(model, input_shape, candidate, opset, dynamic_batch)
        parity_batch = torch.randn(PARITY_BATCH_DYNAMIC if dynamic_batch else 1, *input_shape)
        error = check_onnx_parity(model, candidate, parity_batch)
        if not error <= PARITY_TOLERANCE:
            raise ExportError(
                f"ONNX Runtime disagrees with PyTorch on a random batch: max relative error {error:.3g} "
                f"> {PARITY_TOLERANCE:g}"
            )
        data_files = [Path(path).relative_to(scratch) for path in _external_data_paths(candidate)]
        for relative in data_files:
            (artifacts_dir / relative).parent.mkdir(parents=True, exist_ok=True)
            os.replace(scratch / relative, artifacts_dir / relative)
        os.replace(candidate, onnx_path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    import onnxruntime as ort

    record: dict[str, Any] = {
        "jobName": job_name,
        "createdAt": utc_now(),
        "onnx": {
            **_file_record(onnx_path),
            # The weights of a model over EXTERNAL_DATA_BYTES, each file hashed as the graph is.
            "externalData": [_file_record(artifacts_dir / relative) for relative in data_files],
            "opset": exported.opset,
            "exporter": exported.exporter,
            "dynamicBatch": dynamic_batch,
            "inputName": INPUT_NAME,
            "outputName": OUTPUT_NAME,
            "inputShape": list(exported.input_shape),
        },
        "parity": {
            "maxRelativeError": error,
            "tolerance": PARITY_TOLERANCE,
            "batchSize": int(parity_batch.shape[0]),
            "runtime": f"onnxruntime {ort.__version__} CPUExecutionProvider",
            "ok": True,
        },
        contract.ARTIFACTS_KEY_CHECKPOINT: (
            _file_record(checkpoint) if checkpoint is not None and checkpoint.is_file() else None
        ),
        contract.ARTIFACTS_KEY_MODEL: dict(model_class) if model_class is not None else None,
        "metrics": dict(metrics),
        "versions": versions(),
    }
    try:
        _write_json_atomically(artifacts_dir / contract.ARTIFACTS_FILE_NAME, record)
    except OSError as exc:
        raise ExportError(f"cannot write {artifacts_dir / contract.ARTIFACTS_FILE_NAME} ({exc.strerror})") from exc
    return record


def termination_summary(document: Mapping[str, Any]) -> str:
    """`document` as compact JSON that fits Kubernetes' termination message (4 KiB)."""
    text = json.dumps(document, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    limit = contract.TERMINATION_MESSAGE_MAX_BYTES
    if len(text.encode()) <= limit:
        return text
    keep = {k: document[k] for k in ("ok", "artifacts", "step") if k in document}
    if "error" in document:
        # A fifth of the limit in characters stays under it in bytes even for 4-byte UTF-8.
        keep["error"] = str(document["error"])[: limit // 5]
    return json.dumps(keep, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def write_termination_log(document: Mapping[str, Any], env: Mapping[str, str]) -> None:
    """Write the summary where Kubernetes reads the termination message.

    The default path exists only in a container; outside one, nothing is written unless
    DTRAIN_TERMINATION_LOG names a file.
    """
    configured = env.get(contract.ENV_TERMINATION_LOG)
    path = Path(configured or contract.TERMINATION_LOG_PATH)
    if not configured and not path.exists():
        return
    try:
        path.write_text(termination_summary(document))
    except OSError as exc:
        log.debug("cannot write the termination log %s: %s", path, exc)
