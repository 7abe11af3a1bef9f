"""The quantised forward convolution: y = [relu](scale[k] * conv(x, w) + bias[k] [+ gamma * z]) on 8-bit data.

    y = quantized_conv.conv2d(x, w, spec, scale, bias=b, z=z, gamma=g, relu=True, out=y)

With quantization.int8.requant_params' scale, bias and gamma, one call dequantises, adds the folded BatchNorm's
bias and the residual, applies the ReLU and requantises. It is one cuDNN graph-API call (engine='graph'), found,
timed and cached like any convolution's (the algorithm cache of ops.conv). NumPy arrays run the float64 reference
below (reference_conv2d), the CPU and GPU tests' reference.
"""

from __future__ import annotations

import numpy as np

from .. import reference
from .._core.loader import _C
from .._core.names import QUANT_ARRAY_DTYPES, QUANT_OUT_DTYPES, QUANT_PRECISIONS, choice, flag
from .._core.runtime import op_stream as _stream
from ..quantization.fp8 import decode_e4m3, encode_e4m3
from .conv_spec import ConvSpec, _native_spec

_OUT_CODES = dict(_C.quantized_out_codes())
# out's array dtype -> y's dtype name, per precision (uint8 is FP8 codes, and only for fp8).
_OUT_NAMES = {
    "int8": {np.dtype(np.int8): "int8", np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"},
    "fp8": {np.dtype(np.uint8): "fp8", np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"},
}


def _out_name(spec: ConvSpec, out) -> str:
    if out is None:
        raise ValueError("out: required (an int8 / uint8 (fp8) / float16 / float32 array of y's shape): its dtype "
                         "is y's")
    dtype = np.dtype(getattr(out, "dtype", None) or np.float64)
    names = _OUT_NAMES[spec.precision]
    if dtype not in names:
        raise TypeError(f"out: expected one of {', '.join(map(str, names))} for precision {spec.precision!r}, "
                        f"got {dtype}")
    return names[dtype]


def conv2d(x, w, spec: ConvSpec, scale, *, bias=None, z=None, gamma=1.0, relu=False, out=None):
    """out = [relu](scale * conv(x, w) + bias [+ gamma * z]) in out's dtype; returns out (see the module doc).

    spec.precision 'int8': x, w and z are int8 arrays and the products are summed exactly in int32; 'fp8': they are
    FP8 E4M3 codes in uint8 arrays (cupy has no fp8) and the sum is fp32 (Hopper's FP8 tensor cores keep fewer
    bits in their partial sums). NHWC only: x (N, H, W, C), w (K, R, S, C), z and out (N, P, Q, K); scale and bias
    are fp32 (K,). out's dtype is y's: the 8-bit type (nearest even, saturated), or fp16 / fp32 for a layer whose
    output no quantised convolution reads."""
    if not isinstance(spec, ConvSpec) or spec.precision not in QUANT_PRECISIONS:
        raise ValueError(f"spec: expected a ConvSpec of precision {' or '.join(map(repr, QUANT_PRECISIONS))}, got "
                         f"{spec!r}")
    relu = flag("relu", relu)
    if isinstance(x, np.ndarray) and isinstance(w, np.ndarray):  # host arrays: the float64 reference
        return reference_conv2d(x, w, spec, scale, bias=bias, z=z, gamma=gamma, relu=relu, out=out)
    return _C.conv_forward_quantized(x, w, scale, bias, z, out, _native_spec(spec, "forward"), relu, float(gamma),
                                     _OUT_CODES[_out_name(spec, out)], _stream())


def decode(q, precision: str) -> np.ndarray:
    """The float64 values of int8 values or FP8 E4M3 codes."""
    q = np.asarray(q)
    expected = QUANT_ARRAY_DTYPES[choice("precision", precision, QUANT_PRECISIONS)]
    if q.dtype != expected:
        raise TypeError(f"expected a {expected} array for {precision}, got {q.dtype}")
    return q.astype(np.float64) if precision == "int8" else decode_e4m3(q)


def encode(v, name: str) -> np.ndarray:
    """float64 values in y's dtype `name` as the GPU writes them: int8 rounded to nearest even and saturated to
    [-128, 127] (cuDNN's conversion; the package's symmetric scheme never asks for -128, see quantization.int8),
    FP8 E4M3 codes (nearest even, saturating), fp16 / fp32 rounded once."""
    choice("out dtype", name, QUANT_OUT_DTYPES)
    v = np.asarray(v, np.float64)
    if name == "int8":
        return np.clip(np.rint(v), -128, 127).astype(np.int8)
    if name == "fp8":
        return encode_e4m3(v)
    return v.astype(np.float16 if name == "fp16" else np.float32)


def reference_conv2d(x, w, spec: ConvSpec, scale, *, bias=None, z=None, gamma=1.0, relu=False, out=None):
    """conv2d in float64 on host arrays: the products summed exactly (float64 holds every int8 sum of a ResNet's
    sizes exactly), then the epilogue, then y's rounding (encode)."""
    name = _out_name(spec, out)
    float_spec = ConvSpec(stride=spec.stride, padding=spec.padding, dilation=spec.dilation, groups=spec.groups,
                          layout="NHWC", precision="fp32", engine="graph")
    acc = reference.conv.conv2d(decode(x, spec.precision), decode(w, spec.precision), float_spec)
    v = acc * np.asarray(scale, np.float64)
    if bias is not None:
        v = v + np.asarray(bias, np.float64)
    if z is not None:
        v = v + float(gamma) * decode(z, spec.precision)
    if relu:
        v = np.maximum(v, 0.0)
    y = encode(v, name)
    if tuple(out.shape) != y.shape:
        raise ValueError(f"out: expected shape {y.shape}, got {tuple(out.shape)}")
    out[...] = y
    return out


def residual_requantize(v, z, precision: str, *, s_z, inv_s_y, relu, out):
    """out = encode([relu](v + s_z * z) * inv_s_y): the residual add after a quantised convolution that wrote its
    dequantised result v (fp16); z int8 values / FP8 codes (`precision`); out int8 (saturated to the symmetric
    [-127, 127]), FP8 codes, or float32 (inv_s_y 1). fp32 arithmetic on the GPU; NumPy arrays: float64."""
    choice("precision", precision, QUANT_PRECISIONS)
    relu = flag("relu", relu)
    out_fp32 = np.dtype(getattr(out, "dtype", None) or np.float64) == np.float32
    if isinstance(v, np.ndarray) and isinstance(z, np.ndarray):
        value = v.astype(np.float64) + float(s_z) * decode(z, precision)
        value = (np.maximum(value, 0.0) if relu else value) * float(inv_s_y)
        if precision == "int8" and not out_fp32:
            out[...] = np.clip(np.rint(value), -127, 127).astype(np.int8)
        else:
            out[...] = encode(value, "fp32" if out_fp32 else precision)
        return out
    return _C.residual_requantize(v, z, out, precision == "fp8", out_fp32, float(s_z), float(inv_s_y), relu, _stream())


__all__ = ["conv2d", "decode", "encode", "reference_conv2d", "residual_requantize"]
