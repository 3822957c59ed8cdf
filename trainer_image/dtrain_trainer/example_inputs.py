"""The model's inputs for the ONNX export: names, dtypes and shapes, with a batch axis.

From the model's example_input_array (a tensor, a tuple or a dict), else export.onnx.inputShape
and inputDtype, else the data module's sample_shape.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dtrain_common.errors import ConfigError

INPUT_NAME = "input"


# export.onnx.inputDtype names -> torch dtypes.
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}


@dataclass(frozen=True)
class ExampleInputs:
    """The model's inputs, by name, as example tensors with a batch axis (dtypes as the model takes them)."""

    names: tuple[str, ...]
    tensors: tuple[torch.Tensor, ...]

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """Each input's shape without the batch axis."""
        return tuple(tuple(int(d) for d in t.shape[1:]) for t in self.tensors)

    def batch(self, size: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
        """Random inputs of batch `size` like the examples: normal floats, integers within the examples' range."""
        batch: list[torch.Tensor] = []
        for example in self.tensors:
            shape = (size, *example.shape[1:])
            if example.dtype == torch.bool:
                batch.append(torch.randint(0, 2, shape, generator=generator).bool())
            elif example.dtype.is_floating_point:
                batch.append(torch.randn(shape, generator=generator).to(example.dtype))
            else:  # integer ids (an embedding's vocabulary): stay within what the example holds
                low = int(example.min()) if example.numel() else 0
                high = int(example.max()) if example.numel() else 1
                batch.append(torch.randint(low, max(high, low) + 1, shape, generator=generator, dtype=example.dtype))
        return tuple(batch)

    def with_float32(self) -> ExampleInputs:
        """The same inputs for the model in fp32 (as it is exported): floating inputs become float32."""
        return ExampleInputs(
            self.names, tuple(t.float() if t.dtype.is_floating_point else t for t in self.tensors)
        )

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"name": n, "shape": list(shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for n, shape, t in zip(self.names, self.shapes, self.tensors)
        ]


def single_input(input_shape: Sequence[int], dtype: torch.dtype = torch.float32) -> ExampleInputs:
    """One input, `input`, of shape (batch, *input_shape)."""
    return ExampleInputs((INPUT_NAME,), (torch.zeros((1, *(int(d) for d in input_shape)), dtype=dtype),))


def _forward_parameters(model: Any) -> list[str]:
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _from_example_input_array(example: Any, model: Any) -> ExampleInputs:
    where = f"{type(model).__name__}.example_input_array"
    forward = _forward_parameters(model)
    if isinstance(example, torch.Tensor):
        names, tensors = (INPUT_NAME,), (example,)
    elif isinstance(example, (tuple, list)) and example:
        tensors = tuple(example)
        names = tuple(forward) if len(forward) == len(tensors) else tuple(f"input_{i}" for i in range(len(tensors)))
    elif isinstance(example, Mapping) and example:
        unknown = [k for k in example if k not in forward]
        if unknown:
            raise ConfigError(
                f"export.onnx: {where} has keys {unknown} that forward() does not take as positional arguments "
                f"({', '.join(forward) or 'none'})"
            )
        names = tuple(n for n in forward if n in example)
        tensors = tuple(example[n] for n in names)
    else:
        raise ConfigError(
            f"export.onnx: {where} is a {type(example).__name__}; make it a tensor, a tuple of tensors "
            "or a dict of tensors (with a batch axis), or set export.onnx.inputShape"
        )
    for name, tensor in zip(names, tensors):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() < 1:
            raise ConfigError(
                f"export.onnx: {where}: input {name!r} is not a tensor with a batch axis "
                f"(got {type(tensor).__name__}); give every input one"
            )
    return ExampleInputs(names, tuple(t.detach().cpu() for t in tensors))


def resolve_example(
    configured_shape: Sequence[int] | None, configured_dtype: str, datamodule: Any, model: Any
) -> ExampleInputs:
    """The model's inputs for the export: its example_input_array (a tensor, tuple or dict, dtypes kept),
    else export.onnx.inputShape with inputDtype, else the data module's sample_shape."""
    example = getattr(model, "example_input_array", None)
    if example is not None:
        return _from_example_input_array(example, model)
    if configured_shape:
        return single_input(configured_shape, DTYPES[configured_dtype])
    shape = getattr(datamodule, "sample_shape", None)
    if shape:
        return single_input(shape)
    raise ConfigError(
        "export.onnx.inputShape: the model has no example_input_array and the data module no sample_shape, "
        "so the model's input is unknown; set the model's example_input_array (a tensor, tuple or dict), "
        "or export.onnx.inputShape (e.g. [3, 224, 224]) and inputDtype, or export.onnx.enabled: false"
    )
