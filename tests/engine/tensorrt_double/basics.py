"""The TensorRT double's constants, enums, Dims and logging, and the state its parts share (see the package's docstring)."""

from __future__ import annotations

import enum
import itertools
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

if TYPE_CHECKING:
    from tensorrt_double.device import HostStream
    from typing_extensions import Self

DEVICE_NAME = "TensorRT double (host memory)"
PLUGIN_OPS = frozenset({"RoiAlign"})  # onnx-tensorrt builds these from libnvinfer_plugin's creators
MIN_POOL_BYTES = 1 << 20
PLAN_MAGIC = b"TRT-DOUBLE-PLAN\n"
CACHE_MAGIC = b"TRT-DOUBLE-CACHE\n"

# Test-visible state, reset by reset().
BUILDS: list[dict[str, Any]] = []  # what each successful build was configured with
LOADED_LIBRARIES: list[str] = []
_state: dict[str, Any] = {}
_memory: dict[int, np.ndarray] = {}  # address -> bytes
_streams: dict[int, HostStream] = {}
_addresses = itertools.count(0x7F0000000000, 1 << 20)


# --- Enums, Dims, logging --------------------------------------------------------------------


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 5


class BuilderFlag(enum.IntEnum):
    FP16 = 0
    INT8 = 1
    REFIT = 3
    TF32 = 7
    OBEY_PRECISION_CONSTRAINTS = 10
    PREFER_PRECISION_CONSTRAINTS = 11
    VERSION_COMPATIBLE = 14
    FP8 = 16
    BF16 = 17
    STRIP_PLAN = 19
    REFIT_IDENTICAL = 20
    INT4 = 22
    FP4 = 25


PRECISION_FLAGS = {BuilderFlag.FP16, BuilderFlag.BF16, BuilderFlag.INT8, BuilderFlag.FP8, BuilderFlag.INT4, BuilderFlag.FP4}


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0


class ProfilingVerbosity(enum.IntEnum):
    LAYER_NAMES_ONLY = 0
    NONE = 1
    DETAILED = 2


class HardwareCompatibilityLevel(enum.IntEnum):
    NONE = 0
    AMPERE_PLUS = 1
    SAME_COMPUTE_CAPABILITY = 2


class LayerInformationFormat(enum.IntEnum):
    ONELINE = 0
    JSON = 1


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    BF16 = 7
    INT64 = 8


_FROM_ONNX = {
    onnx.TensorProto.FLOAT: DataType.FLOAT, onnx.TensorProto.FLOAT16: DataType.HALF, onnx.TensorProto.BFLOAT16: DataType.BF16,
    onnx.TensorProto.INT8: DataType.INT8, onnx.TensorProto.INT32: DataType.INT32, onnx.TensorProto.INT64: DataType.INT64,
    onnx.TensorProto.BOOL: DataType.BOOL, onnx.TensorProto.UINT8: DataType.UINT8,
}
_NUMPY = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT8: np.int8, DataType.INT32: np.int32,
          DataType.BOOL: np.bool_, DataType.UINT8: np.uint8, DataType.INT64: np.int64}


class Dims(tuple):
    def __new__(cls, shape: Any = ()) -> Self:
        return super().__new__(cls, (int(d) for d in shape))


class ILogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    def __init__(self) -> None:
        pass

    def log(self, severity: ILogger.Severity, msg: str) -> None:
        raise NotImplementedError


def _error(logger: ILogger, message: str) -> None:
    logger.log(ILogger.Severity.ERROR, message)


def _stream_handle(handle: Any, call: str) -> int:
    if not isinstance(handle, int) or isinstance(handle, bool):
        raise TypeError(f"{call}(): incompatible function arguments: stream_handle must be an int, got {type(handle).__name__}")
    return handle
