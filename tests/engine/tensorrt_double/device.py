"""The CUDA device of the TensorRT double: streams, buffers, events and graphs in host memory."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tensorrt_double.basics import (
    DEVICE_NAME,
    _addresses,
    _memory,
    _streams,
)

# --- The device ------------------------------------------------------------------------------


class HostStream:
    def __init__(self) -> None:
        self.handle = next(_addresses)
        self.capturing: list[Callable[[], None]] | None = None
        _streams[self.handle] = self

    def synchronize(self) -> None:
        pass


class HostBuffer:
    def __init__(self, nbytes: int):
        self.address = next(_addresses)
        self.nbytes = max(int(nbytes), 1)
        _memory[self.address] = np.zeros(self.nbytes, dtype=np.uint8)

    def read(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(_memory[self.address].tobytes(), dtype=dtype, count=count).reshape(shape).copy()


class HostEvent:
    def __init__(self) -> None:
        self.time: float | None = None

    def record(self, stream: HostStream) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_ms(self, end: HostEvent) -> float:
        assert self.time is not None and end.time is not None, "elapsed time of an event that was never recorded"
        return (end.time - self.time) * 1000.0


@dataclass
class HostGraph:
    launches: list[Callable[[], None]] = field(default_factory=list)
    replays: int = 0

    def replay(self, stream: HostStream) -> None:
        self.replays += 1
        for launch in self.launches:
            launch()


class HostDevice:
    """dtrain_engine.device.Device in host memory; buffers are where the double's context reads and writes."""

    def __init__(self, compute_capability: tuple[int, int] = (9, 0)):
        self.name = DEVICE_NAME
        self.compute_capability = compute_capability
        self.torch_device = "cpu"
        self.graphs: list[HostGraph] = []

    def stream(self) -> HostStream:
        return HostStream()

    def upload(self, array: np.ndarray, stream: HostStream) -> HostBuffer:
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        buffer = HostBuffer(data.size)
        _memory[buffer.address][: data.size] = data
        return buffer

    def allocate(self, nbytes: int) -> HostBuffer:
        return HostBuffer(nbytes)

    def event(self) -> HostEvent:
        return HostEvent()

    def capture(self, stream: HostStream, launch: Callable[[], None]) -> HostGraph:
        stream.capturing = []
        try:
            launch()
            graph = HostGraph(stream.capturing)
        finally:
            stream.capturing = None
        self.graphs.append(graph)
        return graph
