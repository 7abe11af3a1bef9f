"""FP8 E4M3 ("E4M3FN" in the OCP 8-bit floating point spec and NVIDIA's __nv_fp8_e4m3) as uint8 codes, in NumPy.

A code is s eeee mmm: sign, 4 exponent bits with bias 7, 3 mantissa bits. e = 0 codes are subnormal, m/8 * 2**-6
(the smallest 2**-9); e in 1..15 codes are (1 + m/8) * 2**(e - 7). The format has no infinities: of the e = 15
codes only s 1111 111 (0x7F, 0xFF) is NaN, which frees s 1111 110 for the largest finite value 1.75 * 2**8 = 448.

encode_e4m3 rounds to nearest, ties to the even code (mantissa LSB 0), and saturates: every finite or infinite
|x| above 448 becomes +-448, the "satfinite" conversion the GPU's cvt.rn.satfinite.e4m3x2 and cuDNN's fp8 outputs
use (a non-saturating conversion would give NaN past 464). NaN becomes 0x7F. -0.0 and negatives rounding to zero
keep their sign (0x80).

FP8 scaling is per tensor or per channel, as int8's: s = amax / 448, so the largest |x| lands on the largest code.
"""

from __future__ import annotations

import numpy as np

from .scales import broadcast_scale, max_abs, scale_from_amax

E4M3_MAX = 448.0
E4M3_NAN = np.uint8(0x7F)
_SIGN = np.uint8(0x80)
_MAX_CODE = 0x7E  # 448


def _decode_magnitudes() -> np.ndarray:
    """The values of the non-negative finite codes 0x00..0x7E, increasing (the code is the index)."""
    codes = np.arange(_MAX_CODE + 1)
    e, m = codes >> 3, (codes & 7).astype(np.float64)
    return np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * np.exp2(e - 7.0))


_MAGNITUDES = _decode_magnitudes()


def decode_e4m3(codes) -> np.ndarray:
    """The float64 values of uint8 E4M3 codes (0x7F / 0xFF: NaN; 0x80: -0.0); exact."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"codes: expected a uint8 array of E4M3 codes, got {codes.dtype}")
    magnitude = codes & 0x7F
    values = _MAGNITUDES[np.minimum(magnitude, _MAX_CODE)]
    values = np.where(magnitude == 0x7F, np.nan, values)
    return np.where(codes & _SIGN, -values, values)


def encode_e4m3(x) -> np.ndarray:
    """x rounded to E4M3 codes (uint8): nearest, ties to even, saturating at +-448, NaN to 0x7F."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    # lo: the largest code whose value is <= |x| (inf and values past 448 clip to the top pair of codes).
    lo = np.clip(np.searchsorted(_MAGNITUDES, np.nan_to_num(a, posinf=E4M3_MAX), side="right") - 1, 0,
                 _MAX_CODE - 1)
    below, above = _MAGNITUDES[lo], _MAGNITUDES[lo + 1]
    up = (a - below > above - a) | ((a - below == above - a) & (lo % 2 == 1))
    code = np.where(a >= E4M3_MAX, _MAX_CODE, lo + up).astype(np.uint8)
    code = np.where(np.signbit(x), code | _SIGN, code)
    return np.where(np.isnan(x), E4M3_NAN, code).astype(np.uint8)


def round_e4m3(x) -> np.ndarray:
    """x rounded to the nearest E4M3 value, as float64: decode_e4m3(encode_e4m3(x)), by arithmetic instead of a
    table search (what the fake-quant forward calls on every activation)."""
    return round_e4m3_values(np.asarray(x, np.float64))


def round_e4m3_values(v, xp=np):
    """round_e4m3 in v's own float dtype and array module (NumPy or cupy: only ufuncs both have). Within a binade
    [2**k, 2**(k+1)) the codes are steps of 2**(k-3), subnormals steps of 2**-9, so rounding |v| / step to the
    nearest even integer is the code's round-to-nearest-even; a tie at a binade's top goes to 2**(k+1), which the
    next binade holds; past 448 the value saturates."""
    a = xp.abs(v)
    _, e = xp.frexp(a)  # a = f * 2**e, f in [0.5, 1): the binade's k = e - 1
    step = xp.ldexp(v.dtype.type(1.0), xp.maximum(e - 1, -6) - 3)
    with np.errstate(invalid="ignore"):  # inf / step: inf, saturated below
        q = xp.minimum(xp.rint(a / step) * step, v.dtype.type(E4M3_MAX))
    return xp.copysign(q, v)


def fp8_scale(x, axis=None) -> np.ndarray:
    """max|x| / 448, per tensor (axis=None) or per index along `axis`."""
    return scale_from_amax(max_abs(x, axis), E4M3_MAX)


def quantize_fp8(x, scale, axis=None) -> np.ndarray:
    """E4M3 codes of x / scale; `scale` a scalar (axis=None) or one per index along `axis`."""
    x = np.asarray(x, np.float64)
    return encode_e4m3(x / broadcast_scale(scale, x, axis))


def dequantize_fp8(codes, scale, axis=None) -> np.ndarray:
    """decode_e4m3(codes) * scale, float64."""
    codes = np.asarray(codes)
    return decode_e4m3(codes) * broadcast_scale(scale, codes, axis)


def fake_quantize_fp8(x, scale, axis=None) -> np.ndarray:
    """dequantize_fp8(quantize_fp8(x)): x as the FP8 engine will see it, in float64."""
    x = np.asarray(x, np.float64)
    s = broadcast_scale(scale, x, axis)
    return round_e4m3(x / s) * s
