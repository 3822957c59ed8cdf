"""The CUDA pieces the TensorRT runtime path needs, behind one small interface.

`Device` is what engine_tensorrt uses for memory, the stream, events and CUDA graphs; it
never touches torch.cuda itself. `TorchCudaDevice` implements it with PyTorch (the engine
image carries PyTorch for the eager baseline, so no second CUDA binding is needed). The test
suite's TensorRT double implements the same interface in host memory, so the whole runtime
path runs there without a GPU.

Buffers are untyped bytes: the engine code decides shapes and dtypes from the engine's own
tensor types, and buffers only move bytes between host and device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np


class Stream(Protocol):
    @property
    def handle(self) -> int:
        """The raw cudaStream_t as an int: what TensorRT's *_async calls take."""
        ...

    def synchronize(self) -> None: ...


class DeviceBuffer(Protocol):
    @property
    def address(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def read(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """A host copy of the first prod(shape) elements (call after the stream is synchronized)."""
        ...


class Event(Protocol):
    def record(self, stream: Stream) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_ms(self, end: Event) -> float:
        """GPU time from this event to `end` (both recorded and `end` synchronized)."""
        ...


class Graph(Protocol):
    def replay(self, stream: Stream) -> None: ...


class Device(Protocol):
    name: str
    compute_capability: tuple[int, int]
    torch_device: str  # where the PyTorch eager baseline runs next to the engine

    def stream(self) -> Stream: ...

    def upload(self, array: np.ndarray, stream: Stream) -> DeviceBuffer: ...

    def allocate(self, nbytes: int) -> DeviceBuffer: ...

    def event(self) -> Event: ...

    def capture(self, stream: Stream, launch: Callable[[], None]) -> Graph:
        """Record `launch` (work enqueued on `stream`) as a CUDA graph, without running it."""
        ...


def host_bytes(array: np.ndarray) -> np.ndarray:
    """The array's bytes as a flat uint8 array (bool, float16, int64 alike)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def from_bytes(data: np.ndarray, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    array: np.ndarray = np.frombuffer(data.tobytes(), dtype=dtype, count=count).reshape(shape).copy()
    return array


# --- PyTorch ---------------------------------------------------------------------------------


class _TorchStream:
    def __init__(self, stream: Any):
        self.torch_stream = stream

    @property
    def handle(self) -> int:
        return int(self.torch_stream.cuda_stream)

    def synchronize(self) -> None:
        self.torch_stream.synchronize()


class _TorchBuffer:
    def __init__(self, tensor: Any):
        self.tensor = tensor  # a flat uint8 CUDA tensor

    @property
    def address(self) -> int:
        return int(self.tensor.data_ptr())

    @property
    def nbytes(self) -> int:
        return int(self.tensor.numel())

    def read(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        return from_bytes(self.tensor.cpu().numpy(), shape, dtype)


class _TorchEvent:
    def __init__(self, torch: Any):
        self.event = torch.cuda.Event(enable_timing=True)

    def record(self, stream: Stream) -> None:
        self.event.record(stream.torch_stream)  # type: ignore[attr-defined]

    def synchronize(self) -> None:
        self.event.synchronize()

    def elapsed_ms(self, end: Event) -> float:
        return float(self.event.elapsed_time(end.event))  # type: ignore[attr-defined]


class _TorchGraph:
    def __init__(self, torch: Any, graph: Any):
        self._torch, self._graph = torch, graph

    def replay(self, stream: Stream) -> None:
        with self._torch.cuda.stream(stream.torch_stream):  # type: ignore[attr-defined]
            self._graph.replay()


class TorchCudaDevice:
    """The current CUDA device through PyTorch."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._device = torch.device("cuda")
        self.torch_device = "cuda"
        self.name = str(torch.cuda.get_device_name(self._device))
        major, minor = torch.cuda.get_device_capability(self._device)
        self.compute_capability = (int(major), int(minor))

    def stream(self) -> Stream:
        return _TorchStream(self._torch.cuda.Stream(self._device))

    def upload(self, array: np.ndarray, stream: Stream) -> DeviceBuffer:
        torch = self._torch
        with torch.cuda.stream(stream.torch_stream):  # type: ignore[attr-defined]
            tensor = torch.from_numpy(host_bytes(array).copy()).to(self._device, non_blocking=False)
        return _TorchBuffer(tensor)

    def allocate(self, nbytes: int) -> DeviceBuffer:
        return _TorchBuffer(self._torch.empty(max(int(nbytes), 1), dtype=self._torch.uint8, device=self._device))

    def event(self) -> Event:
        return _TorchEvent(self._torch)

    def capture(self, stream: Stream, launch: Callable[[], None]) -> Graph:
        torch = self._torch
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream.torch_stream):  # type: ignore[attr-defined]
            launch()
        return _TorchGraph(torch, graph)
