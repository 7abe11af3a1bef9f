"""Pooling: 2-D max pooling on cuDNN and global average pooling on custom kernels.

Activations are NCHW arrays (N, C, H, W) or NHWC arrays (N, H, W, C) in fp32, fp16 or bf16 (uint16 bits,
dtype='bf16'). Max pooling pads with -inf (padded positions never win, as in PyTorch), propagates NaN, uses
floor mode and cuDNN's deterministic max mode. Global average pooling returns (N, C) in the input's dtype,
accumulating in fp32. kernel, stride and padding are an int or a pair of ints; stride=None means stride = kernel.
Outputs not given are allocated with cupy once every argument has been validated (by the native core).
"""

import numpy as np

from .. import reference
from .._core.loader import _C
from .kernels import stream


def max_pool2d_output_shape(x_shape, *, kernel, stride=None, padding=0, layout) -> tuple:
    """Output shape of max_pool2d, in the layout's order; needs no GPU."""
    return tuple(_C.max_pool2d_output_dims(x_shape, kernel, stride, padding, layout))


def max_pool2d(x, *, kernel, stride=None, padding=0, layout, out=None, dtype=None):
    if isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.pool.max_pool2d(x, kernel=kernel, stride=stride, padding=padding, layout=layout, out=out,
                                         dtype=dtype)
    """y = max over each kernel window."""
    return _C.max_pool2d(x, out, kernel, stride, padding, layout, dtype, stream())


def max_pool2d_backward(dy, x, y, *, kernel, stride=None, padding=0, layout, out=None, dtype=None):
    """dx: dy routed to the position of each window's maximum (summed where windows overlap)."""
    if isinstance(dy, np.ndarray) and isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.pool.max_pool2d_backward(dy, x, y, kernel=kernel, stride=stride, padding=padding,
                                                  layout=layout, out=out, dtype=dtype)
    return _C.max_pool2d_backward(dy, x, y, out, kernel, stride, padding, layout, dtype, stream())


def global_avg_pool(x, *, layout, out=None, dtype=None):
    """(N, C): the mean of each channel over H and W."""
    if isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.pool.global_avg_pool(x, layout=layout, out=out, dtype=dtype)
    return _C.global_avg_pool(x, out, layout, dtype, stream())


def global_avg_pool_backward(dy, x_shape, *, layout, out=None, dtype=None):
    """dx of shape x_shape: dy[n, c] / (H * W) at every position of channel c."""
    if isinstance(dy, np.ndarray):  # host arrays: the float64 reference
        return reference.pool.global_avg_pool_backward(dy, x_shape, layout=layout, out=out, dtype=dtype)
    return _C.global_avg_pool_backward(dy, x_shape, out, layout, dtype, stream())


__all__ = [
    "global_avg_pool",
    "global_avg_pool_backward",
    "max_pool2d",
    "max_pool2d_backward",
    "max_pool2d_output_shape",
]
