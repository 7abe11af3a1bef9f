"""Pooling: 2-D max pooling on cuDNN and global average pooling on custom kernels.

Activations are NCHW arrays (N, C, H, W) or NHWC arrays (N, H, W, C) in fp32, fp16 or bf16 (uint16 bits,
dtype='bf16'). Max pooling pads with -inf (padded positions never win, as in PyTorch), propagates NaN, uses
floor mode and cuDNN's deterministic max mode. Global average pooling returns (N, C) in the input's dtype,
accumulating in fp32. Outputs not given are allocated with cupy before the op.
"""

import numpy as np

from . import reference
from ._loader import _C
from .kernels import empty, resolve_dtype, shape_of, stream
from .norm import _channels


def _pair(value, name) -> tuple:
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an int or a pair of ints, got {value!r}")
    if isinstance(value, int):
        return (value, value)
    try:
        pair = tuple(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int or a pair of ints, got {value!r}") from None
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise ValueError(f"{name}: expected an int or a pair of ints, got {value!r}")
    return pair


def _window(kernel, stride, padding):
    kernel = _pair(kernel, "kernel")
    stride = kernel if stride is None else _pair(stride, "stride")
    return kernel, stride, _pair(padding, "padding")


def max_pool2d_output_shape(x_shape, *, kernel, stride=None, padding=0, layout) -> tuple:
    """Output shape of max_pool2d, in the layout's order; needs no GPU. stride=None means stride = kernel."""
    _channels(x_shape, layout, "x_shape")
    kernel, stride, padding = _window(kernel, stride, padding)
    return tuple(_C.max_pool2d_output_dims(tuple(int(s) for s in x_shape), kernel, stride, padding, layout))


def max_pool2d(x, *, kernel, stride=None, padding=0, layout, out=None, dtype=None):
    """y = max over each kernel window (stride=None: stride = kernel)."""
    if isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.pool.max_pool2d(x, kernel=kernel, stride=stride, padding=padding, layout=layout, out=out,
                                         dtype=dtype)
    dt = resolve_dtype(x, "x", dtype)
    shape = shape_of(x)
    y_shape = max_pool2d_output_shape(shape, kernel=kernel, stride=stride, padding=padding, layout=layout)
    if out is None:
        out = empty(y_shape, dt)
    kernel, stride, padding = _window(kernel, stride, padding)
    _C.max_pool2d(x, out, kernel, stride, padding, layout, dt, stream())
    return out


def max_pool2d_backward(dy, x, y, *, kernel, stride=None, padding=0, layout, out=None, dtype=None):
    """dx: dy routed to the position of each window's maximum (summed where windows overlap)."""
    if isinstance(dy, np.ndarray) and isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.pool.max_pool2d_backward(dy, x, y, kernel=kernel, stride=stride, padding=padding,
                                                  layout=layout, out=out, dtype=dtype)
    dt = resolve_dtype(dy, "dy", dtype)
    if out is None:
        out = empty(shape_of(x), dt)
    kernel, stride, padding = _window(kernel, stride, padding)
    _C.max_pool2d_backward(dy, x, y, out, kernel, stride, padding, layout, dt, stream())
    return out


def global_avg_pool(x, *, layout, out=None, dtype=None):
    """(N, C): the mean of each channel over H and W."""
    if isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.pool.global_avg_pool(x, layout=layout, out=out, dtype=dtype)
    dt = resolve_dtype(x, "x", dtype)
    shape = shape_of(x)
    c = _channels(shape, layout)
    if out is None:
        out = empty((shape[0], c), dt)
    _C.global_avg_pool(x, out, layout, dt, stream())
    return out


def global_avg_pool_backward(dy, x_shape, *, layout, out=None, dtype=None):
    """dx of shape x_shape: dy[n, c] / (H * W) at every position of channel c."""
    if isinstance(dy, np.ndarray):  # host arrays: the float64 reference
        return reference.pool.global_avg_pool_backward(dy, x_shape, layout=layout, out=out, dtype=dtype)
    dt = resolve_dtype(dy, "dy", dtype)
    _channels(x_shape, layout, "x_shape")
    x_shape = tuple(int(s) for s in x_shape)
    if out is None:
        out = empty(x_shape, dt)
    elif shape_of(out) != x_shape:
        raise ValueError(f"out: expected shape {x_shape} (x_shape), got {shape_of(out)}")
    _C.global_avg_pool_backward(dy, out, layout, dt, stream())
    return out


__all__ = [
    "global_avg_pool",
    "global_avg_pool_backward",
    "max_pool2d",
    "max_pool2d_backward",
    "max_pool2d_output_shape",
]
