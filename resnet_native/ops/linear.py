"""The fully connected layer's three products (nn.layers.Linear), our own kernels on the GPU:

    linear_forward(x, w, b)            y[n, k]  = b[k] + sum_c x[n, c] w[k, c]
    linear_backward_data(dy, w, out)   dx[n, c] = sum_k dy[n, k] w[k, c], written in out's dtype
    linear_backward_weight(x, dy)      dw[k, c] = sum_n dy[n, k] x[n, c]

x and dx are (N, C) in fp32, fp16 or bf16 (a uint16 array is bf16 bits); w (K, C), b (K,), y and dy (N, K) and dw
(K, C) are fp32. Every sum is taken in fp32 (no TF32) in a fixed order, so results are deterministic. NumPy
arguments go to the float64 reference (reference/linear.py). `out=None` allocates after validation; the native
core names the argument in every error. Runs on cupy's current stream.
"""

import numpy as np

from .. import reference
from .._core.loader import _C
from .._core.runtime import op_stream


def _host(*arrays) -> bool:
    return all(isinstance(a, np.ndarray) for a in arrays)


def linear_forward(x, w, b, *, out=None):
    """y = x w^T + b: (N, K) fp32 logits of (N, C) features."""
    if _host(x, w, b):
        return reference.linear.linear_forward(x, w, b, out=out)
    return _C.linear_forward(x, w, b, out, op_stream())


def linear_backward_data(dy, w, out):
    """The features' gradient dy w, written into `out` (N, C), in its dtype (the features')."""
    if _host(dy, w, out):
        return reference.linear.linear_backward_data(dy, w, out)
    return _C.linear_backward_data(dy, w, out, op_stream())


def linear_backward_weight(x, dy, *, out=None):
    """The weight's gradient dy^T x: (K, C) fp32."""
    if _host(x, dy):
        return reference.linear.linear_backward_weight(x, dy, out=out)
    return _C.linear_backward_weight(x, dy, out, op_stream())


__all__ = ["linear_backward_data", "linear_backward_weight", "linear_forward"]
