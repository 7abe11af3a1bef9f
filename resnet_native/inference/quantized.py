"""What the int8 / FP8 engine adds to a plan: 8-bit values, quantised folded weights, the requantising epilogues,
and the input table, all from a Calibration (resnet_native.quantization).

The arithmetic is the host simulation's (quantization/simulate.py), so the engine and the simulation agree up to
fp32 rounding in the epilogue:
  - the values the quantised convolutions read (the input and every block's input and shortcut) are stored in the
    8-bit type at their calibrated scale; the last block's output, the pooled features and the logits stay float
    (fp32, as in the calibration's plan, whose value names the scales are keyed by);
  - each quantised convolution reads its folded weight quantised per output channel and runs
    y = [relu](alpha[k] * conv(x, w) + beta[k]) with alpha = s_x * s_w[k] / s_y, beta = b[k] / s_y
    (quantization.int8.requant_params; s_y = 1 for a float output), in one cuDNN call (quantized_conv.conv2d);
  - a block's last convolution has a residual, which cuDNN's 8-bit convolutions cannot add (no engine on sm_90
    fuses a second tensor: tools/probe_quantized.py): it writes v = s_x * s_w[k] * acc + b[k] in fp16 to a scratch
    buffer, and quantized_conv.residual_requantize adds s_z * z, applies the ReLU and requantises at s_y (one pass);
  - the input is quantised by the uint8 input stage's lookup table: table[c][v] = quantise(normalise(v)), the
    simulation's input bit for bit, with the stem's 3 channels zero-padded to INPUT_CHANNELS (8-bit convolutions
    need a channel multiple; zero channels with zero weights change nothing).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..names import QUANT_ARRAY_DTYPES
from ..quantization.calibration_file import Calibration
from ..quantization.fp8 import quantize_fp8
from ..quantization.int8 import quantize_int8, requant_params
from ..quantization.simulate import INPUT_NAME, activation_scales, quantized_steps, quantized_values, step_weight_scales
from .fold import conv_step_params

INPUT_CHANNELS = 16  # the stem's input channels once padded: a multiple the 8-bit tensor-core kernels take


@dataclasses.dataclass(frozen=True)
class Residual:
    """The residual add after a convolution that wrote dequantised fp16: out = encode(relu(v + s_z * z) / s_y)."""

    s_z: float
    inv_s_y: float  # 1 for a float output
    relu: bool


@dataclasses.dataclass(frozen=True)
class QuantizedConv:
    """One quantised convolution's device operands (the weight in the 8-bit type, NHWC (K, R, S, C)), its output
    dtype ('int8' / 'fp8', or the plan's float dtype), and for a residual step the add that follows (the
    convolution then writes fp16 into the shared scratch buffer)."""

    weight: object
    alpha: object
    beta: object
    out_dtype: str
    residual: Residual | None = None


def residual_scratch_elements(plan) -> int:
    """Elements per sample of the fp16 scratch the residual steps write (the largest of their outputs)."""
    return max((int(np.prod(plan.values[s.out].shape)) for s in quantized_steps(plan) if s.z is not None),
               default=0)


def checked_scales(plan, calibration: Calibration, dtype: str) -> dict:
    """{value index: activation scale} of every value a quantised convolution reads; ValueError when the
    calibration is for another network or another dtype."""
    scales = activation_scales(plan, calibration)  # checks the type and the network
    if calibration.dtype != dtype:
        raise ValueError(f"calibration: made for {calibration.dtype!r}, the engine computes in {dtype!r}")
    return scales


def quantized_plan(plan, dtype: str):
    """The plan with the 8-bit values in `dtype` (the input padded to INPUT_CHANNELS) and the rest as they were."""
    if plan.stem != "cifar":
        raise ValueError(f"dtype: int8 / fp8 engines run the 'cifar' stem (the 'imagenet' stem's max pool reads an "
                         f"8-bit value), got stem {plan.stem!r}")
    quantized = set(quantized_values(plan))
    values = []
    for v, value in enumerate(plan.values):
        shape = (INPUT_CHANNELS, *value.shape[1:]) if v == plan.input else value.shape
        values.append(dataclasses.replace(value, shape=shape, dtype=dtype) if v in quantized else value)
    return dataclasses.replace(plan, values=values)


def _quantize(w: np.ndarray, scales: np.ndarray, dtype: str) -> np.ndarray:
    return quantize_int8(w, scales, axis=0) if dtype == "int8" else quantize_fp8(w, scales, axis=0)


def quantized_convs(plan, state: dict, calibration: Calibration, dtype: str, to_device) -> dict:
    """{step name: QuantizedConv} of every quantised convolution (`to_device` uploads a host array)."""
    scales = checked_scales(plan, calibration, dtype)
    convs = {}
    for s in quantized_steps(plan):
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
            residual, s_y = Residual(scales[s.z], 1.0 / s_y, s.relu), 1.0
        alpha, beta, _ = requant_params(scales[s.x], s_w, bias, s_y)
        convs[s.name] = QuantizedConv(to_device(np.ascontiguousarray(q)), to_device(alpha), to_device(beta),
                                      out_dtype, residual)
    return convs


def input_table(calibration: Calibration, dtype: str, lut: np.ndarray) -> np.ndarray:
    """(3, 256) codes: the normalisation table `lut` (float) quantised at the input's scale."""
    scale = float(calibration.activation_scales[INPUT_NAME])
    table = _quantize(np.asarray(lut, np.float64), np.full(3, scale), dtype)
    return table.astype(QUANT_ARRAY_DTYPES[dtype])


__all__ = ["INPUT_CHANNELS", "QuantizedConv", "Residual", "checked_scales", "input_table", "quantized_convs",
           "quantized_plan", "residual_scratch_elements"]
