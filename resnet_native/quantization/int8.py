"""Symmetric int8 quantisation and the requantisation of an int8 convolution with folded BatchNorm.

q = sat(round_half_even(x / s)), x ~ q * s, with q in [-127, 127]. -128 is never produced: the symmetric range
keeps q(-x) = -q(x) and zero at code 0 with no zero point, negating any code stays in range, and it is the range
cuDNN's and TensorRT's symmetric int8 use. Round half to even is np.rint, as the GPU's float-to-int cvt.rni.

A convolution (x at scale s_x, w with one scale s_w[k] per output channel, products summed exactly in int32 acc,
the folded bias in fp32) writes y = sat(round([relu](acc * s_x * s_w[k] + bias[k] [+ z * s_z]) / s_y))
(requantize_float, the definition), which the kernel applies as one fp32 multiplier and offset per channel
(requant_params: alpha = s_x * s_w / s_y, beta = bias / s_y, gamma = s_z / s_y). With ReLU the output only uses
[0, 127]: cuDNN's int8 outputs are signed.
"""

from __future__ import annotations

import numpy as np

from .._core.names import flag
from .scales import broadcast_scale, max_abs, scale_from_amax

INT8_MAX = 127  # the symmetric range [-127, 127]; see the module docstring for why -128 is unused


def int8_scale(x, axis=None) -> np.ndarray:
    """max|x| / 127, per tensor (axis=None) or per index along `axis`."""
    return scale_from_amax(max_abs(x, axis), INT8_MAX)


def saturate_round(v) -> np.ndarray:
    """round_half_even(v) clamped to [-127, 127], as int8."""
    return np.clip(np.rint(np.asarray(v, np.float64)), -INT8_MAX, INT8_MAX).astype(np.int8)


def quantize_int8(x, scale, axis=None) -> np.ndarray:
    """sat(round(x / scale)) as int8; `scale` a scalar (axis=None) or one per index along `axis`."""
    x = np.asarray(x, np.float64)
    if np.any(np.isnan(x)):
        raise ValueError("x: expected no NaN (int8 has no code for it)")
    return saturate_round(x / broadcast_scale(scale, x, axis))


def dequantize_int8(q, scale, axis=None) -> np.ndarray:
    """q * scale in float64 (exact: an int8 times a float64 scale rounds once)."""
    q = np.asarray(q)
    if q.dtype != np.int8:
        raise TypeError(f"q: expected an int8 array, got {q.dtype}")
    return q.astype(np.float64) * broadcast_scale(scale, q, axis)


def fake_quantize_int8(x, scale, axis=None) -> np.ndarray:
    """dequantize_int8(quantize_int8(x)): x as the int8 engine will see it, in float64."""
    return dequantize_int8(quantize_int8(x, scale, axis), scale, axis)


def _channel_vectors(k: int, s_w, bias) -> tuple[np.ndarray, np.ndarray]:
    s_w, bias = np.asarray(s_w, np.float64), np.asarray(bias, np.float64)
    if s_w.shape != (k,) or bias.shape != (k,):
        raise ValueError(f"s_w, bias: expected shape ({k},) each (one per output channel), got {s_w.shape} and "
                         f"{bias.shape}")
    if not np.all(np.isfinite(s_w)) or np.any(s_w <= 0):
        raise ValueError("s_w: expected finite scales > 0")
    return s_w, bias


def _positive(name: str, value) -> float:
    v = float(value)
    if not np.isfinite(v) or v <= 0:
        raise ValueError(f"{name}: expected a finite scale > 0, got {value!r}")
    return v


def _accumulator(acc) -> np.ndarray:
    acc = np.asarray(acc)
    if acc.dtype != np.int32 or acc.ndim != 4:
        raise TypeError(f"acc: expected an (N, K, P, Q) int32 accumulator, got {acc.dtype} shape {acc.shape}")
    return acc


def _residual(z, s_z, shape) -> tuple:
    if (z is None) != (s_z is None):
        raise ValueError("z, s_z: expected both (an int8 residual and its scale) or neither")
    if z is None:
        return None, None
    z = np.asarray(z)
    if z.dtype != np.int8 or z.shape != shape:
        raise TypeError(f"z: expected an int8 array of the accumulator's shape {shape}, got {z.dtype} {z.shape}")
    return z.astype(np.float64), _positive("s_z", s_z)


def requantize_float(acc, s_x, s_w, bias, s_y, *, relu: bool, z=None, s_z=None) -> np.ndarray:
    """int8 y = sat(round([relu](acc * s_x * s_w[k] + bias[k] [+ z * s_z]) / s_y)) in float64: the definition.

    acc: (N, K, P, Q) int32; s_w, bias: (K,); z: optional int8 residual of acc's shape, at scale s_z."""
    acc = _accumulator(acc)
    s_w, bias = _channel_vectors(acc.shape[1], s_w, bias)
    s_x, s_y = _positive("s_x", s_x), _positive("s_y", s_y)
    z, s_z = _residual(z, s_z, acc.shape)
    v = acc.astype(np.float64) * s_x * s_w[:, None, None] + bias[:, None, None]
    if z is not None:
        v = v + z * s_z
    if flag("relu", relu):
        v = np.maximum(v, 0.0)
    return saturate_round(v / s_y)


def requant_params(s_x, s_w, bias, s_y, s_z=None) -> tuple:
    """(alpha (K,), beta (K,), gamma or None) as fp32, the kernel's per-channel multiplier and offset:
    alpha = s_x * s_w / s_y, beta = bias / s_y, gamma = s_z / s_y (computed in float64, rounded once)."""
    k = np.shape(s_w)[0] if np.ndim(s_w) == 1 else 0  # a vector's own length; anything else fails the check
    s_w, bias = _channel_vectors(k, s_w, bias)
    s_x, s_y = _positive("s_x", s_x), _positive("s_y", s_y)
    gamma = None if s_z is None else np.float32(_positive("s_z", s_z) / s_y)
    return (s_x * s_w / s_y).astype(np.float32), (bias / s_y).astype(np.float32), gamma


def requantize(acc, alpha, beta, *, relu: bool, z=None, gamma=None) -> np.ndarray:
    """int8 y = sat(round([relu](alpha[k] * acc + beta[k] [+ gamma * z]))) in fp32 arithmetic, as the kernel runs
    it (alpha, beta, gamma from requant_params). ReLU commutes with the positive scaling, so the kernel may
    apply it before or after the multiply."""
    acc = _accumulator(acc)
    k = acc.shape[1]
    alpha, beta = np.asarray(alpha), np.asarray(beta)
    if alpha.dtype != np.float32 or beta.dtype != np.float32 or alpha.shape != (k,) or beta.shape != (k,):
        raise TypeError(f"alpha, beta: expected ({k},) float32 vectors (requant_params), got {alpha.dtype} "
                        f"{alpha.shape} and {beta.dtype} {beta.shape}")
    if (z is None) != (gamma is None):
        raise ValueError("z, gamma: expected both (an int8 residual and its multiplier) or neither")
    # The accumulator converted to fp32 (exact below 2**24 in magnitude), as the kernel's epilogue reads it.
    v = acc.astype(np.float32) * alpha[:, None, None] + beta[:, None, None]
    if z is not None:
        z = np.asarray(z)
        if z.dtype != np.int8 or z.shape != acc.shape:
            raise TypeError(f"z: expected an int8 array of the accumulator's shape {acc.shape}, got {z.dtype} "
                            f"{z.shape}")
        v = v + np.float32(gamma) * z.astype(np.float32)
    if flag("relu", relu):
        v = np.maximum(v, np.float32(0))
    return saturate_round(v)
