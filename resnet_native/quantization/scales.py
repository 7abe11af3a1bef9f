"""Symmetric scales: one per tensor (axis=None) or one per index along an axis (per output channel of a filter).

A scale s maps the real range [-amax, amax] onto the format's largest magnitude qmax (127 for int8, 448 for FP8
E4M3): q = x / s, s = amax / qmax. Scales are float64 here; the engine will store them as fp32.
"""

from __future__ import annotations

import numbers

import numpy as np


def _axis(x: np.ndarray, axis):
    """`axis` normalised to a non-negative int in range for `x`, or None (per tensor)."""
    if axis is None:
        return None
    if isinstance(axis, bool | np.bool_) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis: expected None or an int, got {axis!r}")
    if not -x.ndim <= int(axis) < x.ndim:
        raise ValueError(f"axis: expected an axis of a {x.ndim}-D array, got {axis}")
    return int(axis) % x.ndim


def max_abs(x, axis=None) -> np.ndarray:
    """max |x| over the whole array (a 0-D array) or over every axis but `axis` (one per index along it)."""
    x = np.asarray(x, np.float64)
    axis = _axis(x, axis)
    if x.size == 0:
        raise ValueError("x: expected a non-empty array (an empty tensor has no range)")
    if not np.all(np.isfinite(x)):
        raise ValueError("x: expected finite values (a NaN or an infinity has no scale)")
    others = tuple(a for a in range(x.ndim) if a != axis)
    return np.max(np.abs(x), axis=others) if axis is not None else np.max(np.abs(x))


def scale_from_amax(amax, qmax: float) -> np.ndarray:
    """amax / qmax; where that would not be a normal fp32 number (amax 0: an all-zero tensor or channel, or so
    small that the engine's fp32 scale would be subnormal or 0) the scale is 1: every value then quantises to
    0, off by at most amax, and no scale divides by zero."""
    amax = np.asarray(amax, np.float64)
    if np.any(amax < 0) or not np.all(np.isfinite(amax)):
        raise ValueError(f"amax: expected finite values >= 0, got {amax}")
    usable = amax >= float(qmax) * np.finfo(np.float32).tiny
    return np.where(usable, amax / float(qmax), 1.0)


def broadcast_scale(scale, x: np.ndarray, axis) -> np.ndarray:
    """`scale` shaped to multiply `x`: a scalar for axis=None, else a (len(x along axis),) vector placed on axis."""
    s = np.asarray(scale, np.float64)
    axis = _axis(x, axis)
    if axis is None:
        if s.ndim != 0:
            raise ValueError(f"scale: expected one scale per tensor (a scalar), got shape {s.shape}")
        expected = ()
    else:
        expected = (x.shape[axis],)
        if s.shape != expected:
            raise ValueError(f"scale: expected shape {expected} (one per index of axis {axis}), got {s.shape}")
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError("scale: expected finite scales > 0")
    if axis is None:
        return s
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return s.reshape(shape)
