"""The files an ONNX model is made of: the graph and the external data files its weights live in.

The trainer lists them in artifacts.json; the engine builder checks that they are there.
"""

from __future__ import annotations

import os
from typing import Any


def external_data_files(model: Any, directory: str) -> tuple[str, ...]:
    """The files the graph's external tensors live in (paths relative to the model's directory)."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    locations = {ExternalDataInfo(t).location for t in _get_all_tensors(model) if uses_external_data(t)}
    return tuple(os.path.join(directory, location) for location in sorted(locations))
