"""The precision an engine is built in, the builder flags that ask for it, and why.

Strongly or weakly typed, by TensorRT version and by whether the model is explicitly quantized
(Q/DQ nodes); the bound the engine's outputs are then judged against follows from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtrain_engine.onnx_model import (
    ACCURACY_BOUNDS,
    OnnxModelInfo,
    quantized_precision,
    require_quantized_for_int8,
    usage_error,
)
from dtrain_operator.api.common import EnginePrecision as Precision

# NVIDIA deprecated weak typing in 10.12 and builds explicitly quantized models strongly typed
# since; before it, a weakly typed network needs the INT8 (FP8, INT4, FP4) flag for Q/DQ layers.
STRONGLY_TYPED_QDQ_SINCE = (10, 12)
WEAK_PRECISION_FLAGS: dict[str, str] = {"fp16": "FP16", "bf16": "BF16", "int8": "INT8"}


@dataclass
class PrecisionPlan:
    """The typing, the builder flags to set and clear, the precision executed, any ONNX conversion, and why."""

    strongly_typed: bool
    flags: list[str]
    cleared: list[str]
    executed: str
    conversion: str | None
    reasons: list[str]


def plan_precision(version: tuple[int, int], precision: Precision, tf32: bool, model: OnnxModelInfo) -> PrecisionPlan:
    """How TensorRT `version` builds `model` for the requested `precision`."""
    major = version[0]
    require_quantized_for_int8(precision, model)
    if model.quantized:
        types = sorted(model.quantized_types)
        quantized = quantized_precision(model.quantized_types)
        reasons = [
            (f"Q/DQ nodes quantize to {', '.join(types)}: the engine is judged against {quantized}'s bound "
             f"({ACCURACY_BOUNDS[quantized]:g}), whatever --precision asks ({precision})")
        ]
        if major >= 11 or version >= STRONGLY_TYPED_QDQ_SINCE:
            reasons.append(
                f"TensorRT {version[0]}.{version[1]}: explicitly quantized models are built strongly typed "
                "(NVIDIA's guidance; the precision builder flags are deprecated from 10.12): the ONNX types decide"
            )
            if precision in ("fp16", "bf16") and "float16" not in model.weight_types:
                reasons.append(
                    f"the layers outside Q/DQ stay in the model's own types: strongly typed builds take no "
                    f"{precision.upper()} flag, and dtrain never runs the fp16 converter over a Q/DQ graph "
                    "(ONNX Runtime rejects its result)"
                )
            return PrecisionPlan(True, [], [], quantized, None, reasons)
        flags = [WEAK_PRECISION_FLAGS[precision]] if precision in ("fp16", "bf16") else []
        flags += types
        reasons.append(
            f"TensorRT {version[0]}.{version[1]} builds weakly typed: builder flag(s) {', '.join(flags)} enable the "
            "Q/DQ layers' types (without them the build fails)"
            + (f" and {precision} kernels elsewhere" if precision in ("fp16", "bf16") else "")
        )
        return PrecisionPlan(False, flags, [], quantized, None, reasons)

    cleared = []
    executed: str = precision
    reasons = []
    if precision == "fp32":
        if tf32:
            executed = "tf32"
            reasons.append("--tf32: fp32 layers may use TF32 (10-bit mantissa): judged against tf32's bound")
        else:
            cleared.append("TF32")
            reasons.append("fp32 without TF32 (cleared, as polygraphy does; trtexec --noTF32), so the 1e-3 bound is fair")
    if major == 10:
        flags = [WEAK_PRECISION_FLAGS[precision]] if precision in WEAK_PRECISION_FLAGS else []
        reasons.insert(0, f"TensorRT {version[0]}.{version[1]}, weakly typed: "
                       + (f"builder flag {flags[0]} lets TensorRT choose {precision} kernels" if flags else "fp32 kernels"))
        return PrecisionPlan(False, flags, cleared, executed, None, reasons)
    if precision == "fp16" and "float16" not in model.weight_types:
        reasons.insert(0, "TensorRT 11, strongly typed: fp32 weights and tensors converted to fp16 before parsing "
                       "(onnxruntime.transformers.float16, inputs and outputs kept fp32)")
        return PrecisionPlan(True, [], cleared, executed, "float16", reasons)
    if precision == "bf16" and "bfloat16" not in model.weight_types:
        raise usage_error(
            "--precision bf16 on TensorRT 11 needs a bf16 ONNX model (TensorRT 11 has no BF16 builder flag): "
            "convert it with NVIDIA ModelOpt AutoCast (python -m modelopt.onnx.autocast --low_precision_type bf16), "
            "or use fp16"
        )
    reasons.insert(0, "TensorRT 11, strongly typed: the ONNX model's own types are built as they are")
    return PrecisionPlan(True, [], cleared, executed, None, reasons)
