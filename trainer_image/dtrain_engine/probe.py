"""What this machine has: the TensorRT and the CUDA GPU a build runs on, or every reason there is none."""

from __future__ import annotations

from dataclasses import dataclass

from dtrain_engine.device import Device
from dtrain_engine.onnx_model import EXIT_UNAVAILABLE, SUPPORTED_TENSORRT_MAJORS, EngineError
from dtrain_operator.api import contract


@dataclass(frozen=True)
class Platform:
    """The TensorRT and the CUDA device a build runs on (the tests pass their double's)."""

    tensorrt_version: str
    device: Device


def probe_tensorrt() -> tuple[str | None, str | None]:
    """(TensorRT's version, None) when it can build here, else (None, what is wrong)."""
    try:
        import tensorrt as trt
    except ImportError as error:
        return None, f"TensorRT is not installed (import tensorrt: {error})"
    except Exception as error:  # noqa: BLE001 - e.g. an OSError from a missing libnvinfer
        return None, f"TensorRT does not load ({type(error).__name__}: {str(error).strip().splitlines()[0]})"
    version = getattr(trt, "__version__", None)
    if not isinstance(version, str) or not hasattr(trt, "Builder"):
        # tensorrt-stubs alone makes `import tensorrt` succeed as an empty namespace package.
        return None, "TensorRT is not installed (the `tensorrt` module here holds only type stubs)"
    major = int(version.split(".")[0])
    if major not in SUPPORTED_TENSORRT_MAJORS:
        return None, f"TensorRT {version} is installed, but dtrain builds with TensorRT 10 or 11"
    return version, None


def probe_cuda() -> str | None:
    """None when a CUDA GPU is usable, else why not."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (the engine check takes GPU memory and streams from it)"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    return None


def probe_platform() -> tuple[Platform | None, list[str]]:
    """This machine's TensorRT and GPU, or every reason there is none."""
    tensorrt_version, tensorrt_missing = probe_tensorrt()
    cuda_missing = probe_cuda()
    reasons = [reason for reason in (tensorrt_missing, cuda_missing) if reason]
    if reasons or tensorrt_version is None:
        return None, reasons
    from dtrain_engine.device import TorchCudaDevice

    return Platform(tensorrt_version, TorchCudaDevice()), []


def unavailable_error(reasons: list[str]) -> EngineError:
    return EngineError(
        f"cannot build a TensorRT engine here: {'; and '.join(reasons)}. Run it in the engine image "
        f"({contract.DEFAULT_ENGINE_IMAGE}) on a GPU node, or pass --fallback onnxruntime to check and time "
        "the ONNX model with ONNX Runtime on the CPU instead (no engine is built then)",
        EXIT_UNAVAILABLE,
    )
