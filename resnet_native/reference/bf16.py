"""bfloat16 as the package stores it: uint16 arrays of bit patterns (NumPy and cupy have no bfloat16 dtype)."""

import numpy as np

_QUIET_NAN = np.uint16(0x7FC0)


def to_bf16_bits(values) -> np.ndarray:
    """`values` rounded to bfloat16, to nearest even, as uint16 bit patterns; NaN stays NaN (a quiet NaN).

    The values are made float32 first, as the native cast and kernels round from fp32 (rounding float64 straight to
    bf16 could differ from them by one unit in the last place, on ties).
    """
    with np.errstate(over="ignore"):  # beyond float32's range: inf, as the native rounding gives
        f32 = np.ascontiguousarray(values, dtype=np.float32)
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f32), _QUIET_NAN, rounded)


def from_bf16_bits(bits) -> np.ndarray:
    """The float32 values of bfloat16 bit patterns (exact: bf16 is the top half of a float32)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


__all__ = ["from_bf16_bits", "to_bf16_bits"]
