"""The one accuracy metric dtrain uses: for the ONNX parity check after training and for the engine check."""

from __future__ import annotations

import numpy as np

# Outputs whose largest reference value is below this are compared in absolute terms.
SCALE_FLOOR = 1e-6


def max_relative_error(output: np.ndarray, reference: np.ndarray) -> float:
    """max|y - y_ref| / max|y_ref|: the largest error relative to the output's own scale.

    Element-wise relative error explodes where a logit is near zero; scaling by the
    largest reference magnitude keeps the bound meaningful for every output element.
    A shape mismatch or a non-finite value in either output counts as an infinite error.
    """
    test = np.asarray(output, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if test.shape != ref.shape or not (np.all(np.isfinite(test)) and np.all(np.isfinite(ref))):
        return float("inf")
    if ref.size == 0:
        return 0.0
    return float(np.max(np.abs(test - ref))) / max(float(np.max(np.abs(ref))), SCALE_FLOOR)
