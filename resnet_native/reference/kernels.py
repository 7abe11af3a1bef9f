"""Float64 NumPy versions of the custom elementwise kernels, with the signatures of resnet_native.ops.kernels: add,
add + ReLU, ReLU and their backward, the weighted add and the scale, and the dtype conversion cast.

As the native kernels: every array has one shape (out may be one of the inputs), the inputs and out one dtype
(bf16 named with dtype='bf16'; cast converts between any two), ReLU lets NaN through (x < 0 ? 0 : x) and its
backward passes dy where y is not <= 0 (so a NaN output passes it too).
"""

import numpy as np

from . import storage


def _relu(v):
    return np.where(v < 0, 0.0, v)


def _binary(first, second, names, out, dtype, op):
    dt = storage.dtype_of(first, names[0], dtype)
    storage.like(second, names[1], first, names[0])
    result = op(storage.decode(first, dt), storage.decode(second, dt))
    return storage.write(storage.output(out, first.shape, first.dtype), result, dt)


def add(a, b, *, out=None, dtype=None):
    """out = a + b."""
    return _binary(a, b, ("a", "b"), out, dtype, np.add)


def add_relu(a, b, *, out=None, dtype=None):
    """out = max(a + b, 0): the residual join of a ResNet block."""
    return _binary(a, b, ("a", "b"), out, dtype, lambda u, v: _relu(u + v))


def add_scaled(a, b, alpha, *, out=None, dtype=None):
    """out = a + alpha * b."""
    alpha = _alpha(alpha)
    return _binary(a, b, ("a", "b"), out, dtype, lambda u, v: u + alpha * v)


def scale(x, alpha, *, out=None, dtype=None):
    """out = alpha * x."""
    alpha = _alpha(alpha)
    dt = storage.dtype_of(x, "x", dtype)
    return storage.write(storage.output(out, x.shape, x.dtype), alpha * storage.decode(x, dt), dt)


def _alpha(value) -> float:
    """The native ops' rule: a number (not a str), finite and within float32's range."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError(f"alpha: expected a number, got {type(value).__name__}")
    if not abs(float(value)) <= np.finfo(np.float32).max:
        raise ValueError(f"alpha: expected a finite number within float32's range, got {value!r}")
    return float(value)


def relu(x, *, out=None, dtype=None):
    """out = max(x, 0) (NaN propagates)."""
    dt = storage.dtype_of(x, "x", dtype)
    return storage.write(storage.output(out, x.shape, x.dtype), _relu(storage.decode(x, dt)), dt)


def relu_backward(dy, y, *, out=None, dtype=None):
    """out = dy * (y > 0), with y the saved ReLU output."""
    return _binary(dy, y, ("dy", "y"), out, dtype, lambda d, v: np.where(v <= 0, 0.0, d))


def add_relu_backward(dy, y, *, out=None, dtype=None):
    """The gradient of both summands of add_relu: dy * (y > 0), with y the saved add_relu output."""
    return relu_backward(dy, y, out=out, dtype=dtype)


def cast(x, out, *, accumulate=False):
    """out = x converted to out's dtype (fp32 <-> fp16 <-> bf16, rounding to nearest even; uint16 arrays are bf16
    here), or with accumulate out = out + x, rounded once. Same shape; returns out."""
    x_dtype = storage.dtype_of(x, "x", uint16_is_bf16=True)
    out_dtype = storage.dtype_of(out, "out", uint16_is_bf16=True)
    storage.same_shape(out, "out", x, "x")
    result = storage.decode(x, x_dtype)
    if accumulate:
        result = result + storage.decode(out, out_dtype)
    return storage.write(out, result, out_dtype)


__all__ = ["add", "add_relu", "add_relu_backward", "add_scaled", "cast", "relu", "relu_backward", "scale"]
