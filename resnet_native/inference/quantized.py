"""What the int8 / FP8 engine adds to a plan: 8-bit values, quantised folded weights, the requantising epilogues and
the input table, all from a Calibration (resnet_native.quantization).

The arithmetic is the host simulation's (inference/simulate.py), so engine and simulation agree up to fp32
rounding in the epilogue. On cuDNN each quantised convolution is one call (ops.quantized_conv.conv2d) computing
y = [relu](alpha[k] * conv(x, w) + beta[k]) with quantization.int8.requant_params; a block's last convolution,
whose residual cuDNN's 8-bit convolutions cannot add, writes fp16 scratch that residual_requantize finishes
(Residual). An int8 convolution with an int8 output may instead run one of the package's own kernels
(ops.own_conv, OwnOperands), which add the residual and requantise in the same kernel; kernel_choice.py decides.
With a float prefix (quantize_from 'layer1' ... 'layer4', quantization/prefix.py) the earlier stages run as the
fp16 engine runs them and one QuantizeStep (BoundaryQuantize) writes the boundary value's 8-bit copy.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._core.names import DTYPE_ALIASES, QUANT_ARRAY_DTYPES
from ..quantization.calibration_file import Calibration
from ..quantization.fp8 import quantize_fp8
from ..quantization.int8 import quantize_int8, requant_params
from ..quantization.prefix import boundary_value, first_quantized_step
from .fold import conv_step_params
from .plan import QuantizeStep
from .simulate import INPUT_NAME, activation_scales, quantized_steps, quantized_values, step_weight_scales

INPUT_CHANNELS = 16  # the stem's input channels once padded: a multiple the 8-bit tensor-core kernels take
PREFIX_PRECISION = "fp16"  # the float prefix's: the fp16 engine's speed (the tail after the suffix stays fp32)


@dataclasses.dataclass(frozen=True)
class Residual:
    """The residual add after a convolution that wrote dequantised fp16: out = encode(relu(v + s_z * z) / s_y).

    No cuDNN engine on sm_90 fuses a second tensor into an 8-bit convolution (tools/probe_quantized.py), so the
    convolution writes v = s_x * s_w[k] * acc + b[k] in fp16 and ops.quantized_conv.residual_requantize adds the
    shortcut, applies the ReLU and requantises in one pass."""

    s_z: float
    inv_s_y: float  # 1 for a float output
    relu: bool


@dataclasses.dataclass(frozen=True)
class OwnOperands:
    """The epilogue operands of an int8 convolution run by the package's own kernels (ops.own_conv), which add the
    residual and requantise in one kernel: alpha = s_x * s_w / s_y, bias = b / s_y (K,) and beta = s_z / s_y
    (0 without a residual); quantization.int8.requant_params."""

    alpha: object
    bias: object
    beta: float


@dataclasses.dataclass(frozen=True)
class QuantizedConv:
    """One quantised convolution's device operands (the weight in the 8-bit type, NHWC (K, R, S, C)), its output
    dtype ('int8' / 'fp8', or the plan's float dtype), and for a residual step the add that follows (the
    convolution then writes fp16 into the shared scratch buffer). `own`: its operands for an own kernel (int8 in
    and out only, else None)."""

    weight: object
    alpha: object
    beta: object
    out_dtype: str
    residual: Residual | None = None
    own: OwnOperands | None = None


@dataclasses.dataclass(frozen=True)
class BoundaryQuantize:
    """The QuantizeStep's operands: out = encode(x * inv_scale), run as residual_requantize(x, zeros, s_z=0).

    That op exists and is exact for it, where a z-less kernel would need a rebuild of the extension; the zeros cost
    one byte per boundary element, held once for the largest batch."""

    inv_scale: float
    zeros: object  # flat 8-bit zeros (int8, or FP8 code 0 = +0.0), at least the boundary's elements for a batch


def residual_scratch_elements(plan, quantize_from: str = "stem") -> int:
    """Elements per sample of the fp16 scratch the residual steps of the quantised suffix write (the largest of
    their outputs)."""
    return max((int(np.prod(plan.values[s.out].shape)) for s in quantized_steps(plan, quantize_from)
                if s.z is not None), default=0)


def checked_scales(plan, calibration: Calibration, dtype: str, quantize_from: str = "stem") -> dict:
    """{value index: activation scale} of every value a quantised convolution reads; ValueError when the
    calibration is for another network or another dtype."""
    scales = activation_scales(plan, calibration, quantize_from)  # checks the type and the network
    if calibration.dtype != dtype:
        raise ValueError(f"calibration: made for {calibration.dtype!r}, the engine computes in {dtype!r}")
    return scales


def quantized_plan(plan, dtype: str, quantize_from: str = "stem"):
    """The engine's plan of the calibration's (fp32) `plan`: the values the quantised suffix reads in `dtype`, the
    rest as they were; for 'stem' the input padded to INPUT_CHANNELS, else a float prefix in PREFIX_PRECISION
    (its values and convolutions) and a QuantizeStep writing the boundary's 8-bit copy (the value after the
    boundary's, so the suffix's indices move up by one) that the suffix reads instead."""
    start = first_quantized_step(plan, quantize_from)
    if plan.stem != "cifar" and start == 0:
        raise ValueError(f"dtype: int8 / fp8 engines quantise from the 'cifar' stem (the 'imagenet' stem's max pool "
                         f"reads an 8-bit value), got stem {plan.stem!r}: pass quantize_from='layer1' or later")
    quantized = set(quantized_values(plan, quantize_from))
    if start == 0:
        values = []
        for v, value in enumerate(plan.values):
            shape = (INPUT_CHANNELS, *value.shape[1:]) if v == plan.input else value.shape
            values.append(dataclasses.replace(value, shape=shape, dtype=dtype) if v in quantized else value)
        return dataclasses.replace(plan, values=values)
    boundary = boundary_value(plan, quantize_from)
    prefix = DTYPE_ALIASES[PREFIX_PRECISION]
    values = [dataclasses.replace(value, dtype=prefix if v <= boundary else dtype if v in quantized
                                  else value.dtype) for v, value in enumerate(plan.values)]
    copy = boundary + 1
    values.insert(copy, dataclasses.replace(plan.values[boundary], dtype=dtype))

    def moved(v):  # the suffix reads the copy in place of the boundary, and its own values one index up
        return None if v is None else v if v < boundary else v + 1

    steps = [dataclasses.replace(s, precision=PREFIX_PRECISION) if s.kind == "conv" else s
             for s in plan.steps[:start]]
    steps.append(QuantizeStep(f"{quantize_from}.quantize", boundary, copy))
    for s in plan.steps[start:]:
        moves = {"x": moved(s.x), "out": moved(s.out)}
        if s.kind == "conv":
            moves["z"] = moved(s.z)
        steps.append(dataclasses.replace(s, **moves))
    return dataclasses.replace(plan, values=values, steps=steps)


def _quantize(w: np.ndarray, scales: np.ndarray, dtype: str) -> np.ndarray:
    return quantize_int8(w, scales, axis=0) if dtype == "int8" else quantize_fp8(w, scales, axis=0)


def quantized_convs(plan, state: dict, calibration: Calibration, dtype: str, to_device,
                    quantize_from: str = "stem") -> dict:
    """{step name: QuantizedConv} of every convolution of `quantize_from`'s quantised suffix, from the
    calibration's (fp32) `plan` (`to_device` uploads a host array). A step's operands do not depend on where the
    suffix begins, so 'stem''s serve every quantize_from."""
    scales = checked_scales(plan, calibration, dtype, quantize_from)
    convs = {}
    for s in quantized_steps(plan, quantize_from):
        w, bias = conv_step_params(s, state, "NHWC")  # float64 folded (K, R, S, C), (K,)
        s_w = step_weight_scales(calibration, s, w.shape[0])
        q = _quantize(w, s_w, dtype)
        if s.x == plan.input:  # the padded input channels meet zero weights
            q = np.concatenate([q, np.zeros((*q.shape[:3], INPUT_CHANNELS - q.shape[3]), q.dtype)], axis=3)
        quantized_out = s.out in scales
        s_y = scales[s.out] if quantized_out else 1.0
        out_dtype = dtype if quantized_out else plan.values[s.out].dtype
        residual = None
        if s.z is not None:  # the convolution dequantises (s_y 1); the residual kernel requantises
            residual = Residual(scales[s.z], 1.0 / s_y, s.relu)
        alpha, beta, _ = requant_params(scales[s.x], s_w, bias, s_y if residual is None else 1.0)
        alpha, beta = to_device(alpha), to_device(beta)
        own = None
        if dtype == "int8" and quantized_out:  # an own kernel's: the whole epilogue at the output's scale
            if residual is None:  # the same operands as cuDNN's
                own = OwnOperands(alpha, beta, 0.0)
            else:
                own_alpha, own_bias, gamma = requant_params(scales[s.x], s_w, bias, s_y, scales[s.z])
                own = OwnOperands(to_device(own_alpha), to_device(own_bias), float(gamma))
        convs[s.name] = QuantizedConv(to_device(np.ascontiguousarray(q)), alpha, beta, out_dtype, residual, own)
    return convs


def boundary_quantize(plan, calibration: Calibration, dtype: str, quantize_from: str, batch: int,
                      zeros) -> BoundaryQuantize:
    """The QuantizeStep's operands for `quantize_from`'s boundary (the calibration's `plan`), its zeros made by
    `zeros(elements, dtype)` (cupy.zeros on the device) for the boundary's elements in `batch` samples."""
    boundary = boundary_value(plan, quantize_from)
    elements = int(np.prod(plan.values[boundary].shape)) * batch
    return BoundaryQuantize(1.0 / checked_scales(plan, calibration, dtype, quantize_from)[boundary],
                            zeros(elements, QUANT_ARRAY_DTYPES[dtype]))


def input_table(calibration: Calibration, dtype: str, lut: np.ndarray) -> np.ndarray:
    """(3, 256) codes: the normalisation table `lut` (float) quantised at the input's scale: table[c][v] =
    quantise(normalise(v)), the simulation's input bit for bit. The stem's 3 channels are zero-padded to
    INPUT_CHANNELS (8-bit convolutions need a channel multiple; zero channels meet zero weights)."""
    scale = float(calibration.activation_scales[INPUT_NAME])
    table = _quantize(np.asarray(lut, np.float64), np.full(3, scale), dtype)
    return table.astype(QUANT_ARRAY_DTYPES[dtype])


__all__ = ["INPUT_CHANNELS", "PREFIX_PRECISION", "BoundaryQuantize", "OwnOperands", "QuantizedConv", "Residual",
           "boundary_quantize", "checked_scales", "input_table", "quantized_convs", "quantized_plan",
           "residual_scratch_elements"]
