"""The fully connected layer's three products, in float64: y = x w^T + b, dx = dy w, dw = dy^T x.

x and dx in fp32 (float32 or float64), fp16 or bf16 (uint16 bits); w, b, y, dy and dw in fp32."""

import numpy as np

from . import storage


def _matrix(array, name: str, dtype=None, **kwargs) -> tuple[np.ndarray, str]:
    resolved = storage.dtype_of(array, name, dtype, **kwargs)
    if array.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array, got shape {tuple(array.shape)}")
    return storage.decode(array, resolved), resolved


def _weight(w, features: int, features_name: str) -> np.ndarray:
    values, _ = _matrix(w, "w", "fp32")
    if w.shape[1] != features:
        raise ValueError(f"w: expected (K, {features}) to match {features_name}'s features, got {tuple(w.shape)}")
    return values


def linear_forward(x, w, b, *, out=None):
    """out[n, k] = b[k] + sum_c x[n, c] w[k, c]: (N, K) in w's dtype."""
    xv, _ = _matrix(x, "x", uint16_is_bf16=True)
    wv = _weight(w, x.shape[1], "x")
    bv = storage.read(b, "b", "fp32")
    if b.shape != (w.shape[0],):
        raise ValueError(f"b: expected shape ({w.shape[0]},) (one per output), got {tuple(b.shape)}")
    return storage.write(storage.output(out, (x.shape[0], w.shape[0]), w.dtype), xv @ wv.T + bv, "fp32")


def linear_backward_data(dy, w, out):
    """out[n, c] = sum_k dy[n, k] w[k, c], written in out's dtype (the features')."""
    _, out_dtype = _matrix(out, "out", uint16_is_bf16=True)
    dyv, _ = _matrix(dy, "dy", "fp32")
    wv = _weight(w, out.shape[1], "out")
    if dy.shape != (out.shape[0], w.shape[0]):
        raise ValueError(f"dy: expected shape {(out.shape[0], w.shape[0])} (N, K) of out's N and w's K, got "
                         f"{tuple(dy.shape)}")
    return storage.write(out, dyv @ wv, out_dtype)


def linear_backward_weight(x, dy, *, out=None):
    """out[k, c] = sum_n dy[n, k] x[n, c]: (K, C) in dy's dtype."""
    xv, _ = _matrix(x, "x", uint16_is_bf16=True)
    dyv, _ = _matrix(dy, "dy", "fp32")
    if dy.shape[0] != x.shape[0]:
        raise ValueError(f"dy: expected {x.shape[0]} rows, one per row of x, got {tuple(dy.shape)}")
    return storage.write(storage.output(out, (dy.shape[1], x.shape[1]), dy.dtype), dyv.T @ xv, "fp32")


__all__ = ["linear_backward_data", "linear_backward_weight", "linear_forward"]
