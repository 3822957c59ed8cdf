"""The TensorRT double's plugins, network definition and ONNX parser."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import onnx
from tensorrt_double.basics import (
    _FROM_ONNX,
    LOADED_LIBRARIES,
    PLUGIN_OPS,
    BuilderFlag,
    DataType,
    Dims,
    ILogger,
    NetworkDefinitionCreationFlag,
    _state,
)

# --- Plugins ---------------------------------------------------------------------------------


def init_libnvinfer_plugins(logger: Any, namespace: str) -> bool:
    _state["plugins"] = True
    return True


class IPluginRegistry:
    def load_library(self, plugin_path: str) -> object | None:
        if not os.path.isfile(plugin_path):
            return None
        LOADED_LIBRARIES.append(plugin_path)
        return object()


def get_plugin_registry() -> IPluginRegistry:
    return IPluginRegistry()


# --- Network and parser ----------------------------------------------------------------------


@dataclass
class ITensor:
    name: str
    dtype: DataType
    shape: Dims


@dataclass
class ILayer:
    name: str
    type: str
    outputs: list[str]
    precision: DataType = DataType.FLOAT
    precision_is_set: bool = False

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "precision" and "precision" in self.__dict__:
            object.__setattr__(self, "precision_is_set", True)
        object.__setattr__(self, key, value)


class INetworkDefinition:
    def __init__(self, flags: int):
        self.strongly_typed = bool(flags & (1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED)))
        self.model: onnx.ModelProto | None = None
        self.inputs: list[ITensor] = []
        self.outputs: list[ITensor] = []
        self.layers: list[ILayer] = []

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, index: int) -> ITensor:
        return self.inputs[index]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def get_layer(self, index: int) -> ILayer:
        return self.layers[index]


def _tensor(value_info: Any) -> ITensor:
    kind = value_info.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in kind.shape.dim]
    return ITensor(value_info.name, _FROM_ONNX[kind.elem_type], Dims(dims))


@dataclass
class ParserError:
    _desc: str
    _node: int = -1
    _name: str = ""
    _op: str = ""

    def node(self) -> int:
        return self._node

    def node_name(self) -> str:
        return self._name

    def node_operator(self) -> str:
        return self._op

    def desc(self) -> str:
        return self._desc


class OnnxParser:
    def __init__(self, network: INetworkDefinition, logger: ILogger):
        self._network, self._logger = network, logger
        self._errors: list[ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> ParserError:
        return self._errors[index]

    def parse_from_file(self, path: str) -> bool:
        model = onnx.load(path)
        for index, node in enumerate(model.graph.node):
            if node.op_type in PLUGIN_OPS and not _state["plugins"]:
                self._errors.append(ParserError(
                    "Plugin not found, are the plugin name, version, and namespace correct?", index, node.name, node.op_type))
        if self._errors:
            return False
        initializers = {init.name for init in model.graph.initializer}
        network = self._network
        network.model = model
        network.inputs = [_tensor(vi) for vi in model.graph.input if vi.name not in initializers]
        network.outputs = [_tensor(vi) for vi in model.graph.output]
        network.layers = [ILayer(node.name or f"node{i}", node.op_type, list(node.output)) for i, node in enumerate(model.graph.node)]
        return True


def _quantized_flags(model: onnx.ModelProto) -> set[BuilderFlag]:
    types = {init.name: init.data_type for init in model.graph.initializer}
    flags = set()
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zero_point = types.get(node.input[2]) if len(node.input) > 2 else None
            fp8 = zero_point in (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E5M2)
            flags.add(BuilderFlag.FP8 if fp8 else BuilderFlag.INT8)
    return flags
