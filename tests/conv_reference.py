"""float64 NumPy references for 2-D convolutions (any stride / padding / dilation / groups) and their gradients,
plus the storage-dtype helpers GPU tests need (bf16 lives in uint16 arrays as bit patterns).

Everything here is NCHW with filters (K, C/groups, R, S); `to_layout` / `from_layout` convert for NHWC, whose
activations are (N, H, W, C) and filters (K, R, S, C/groups).
"""

import numpy as np

TOLERANCE = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}
STORAGE = {"fp32": np.float32, "tf32": np.float32, "fp16": np.float16, "bf16": np.uint16}


def output_size(size, pad, filt, stride, dilation):
    return (size + 2 * pad - dilation * (filt - 1) - 1) // stride + 1


def _windows(xp, r, s, shape_pq, stride, dilation):
    """xp[:, :, h, w] at h = r*d0 + p*s0, w = s*d1 + q*s1 for every output position (p, q)."""
    p, q = shape_pq
    h0, w0 = r * dilation[0], s * dilation[1]
    return xp[:, :, h0 : h0 + stride[0] * (p - 1) + 1 : stride[0], w0 : w0 + stride[1] * (q - 1) + 1 : stride[1]]


def conv2d(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """Cross-correlation y[n, k, p, q] = sum_{c, r, s} x[n, g(k)*C/g + c, p*s0 + r*d0 - pad0, ...] * w[k, c, r, s]."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, c, h, wd = x.shape
    k, cg, fr, fs = w.shape
    assert c == cg * groups and k % groups == 0
    kg = k // groups
    pq = (
        output_size(h, padding[0], fr, stride[0], dilation[0]),
        output_size(wd, padding[1], fs, stride[1], dilation[1]),
    )
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))
    y = np.zeros((n, k) + pq)
    for r in range(fr):
        for s in range(fs):
            win = _windows(xp, r, s, pq, stride, dilation)
            for g in range(groups):
                y[:, g * kg : (g + 1) * kg] += np.einsum(
                    "ncpq,kc->nkpq", win[:, g * cg : (g + 1) * cg], w[g * kg : (g + 1) * kg, :, r, s]
                )
    return y


def conv2d_backward_data(dy, w, x_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """dx of conv2d: the adjoint of conv2d with respect to x."""
    dy = np.asarray(dy, np.float64)
    w = np.asarray(w, np.float64)
    n, c, h, wd = x_shape
    k, cg, fr, fs = w.shape
    kg = k // groups
    pq = dy.shape[2:]
    dxp = np.zeros((n, c, h + 2 * padding[0], wd + 2 * padding[1]))
    for r in range(fr):
        for s in range(fs):
            win = _windows(dxp, r, s, pq, stride, dilation)  # a view: += writes into dxp
            for g in range(groups):
                win[:, g * cg : (g + 1) * cg] += np.einsum(
                    "nkpq,kc->ncpq", dy[:, g * kg : (g + 1) * kg], w[g * kg : (g + 1) * kg, :, r, s]
                )
    return dxp[:, :, padding[0] : padding[0] + h, padding[1] : padding[1] + wd]


def conv2d_backward_filter(x, dy, w_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """dw of conv2d: the adjoint of conv2d with respect to w."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    k, cg, fr, fs = w_shape
    kg = k // groups
    pq = dy.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))
    dw = np.zeros(w_shape)
    for r in range(fr):
        for s in range(fs):
            win = _windows(xp, r, s, pq, stride, dilation)
            for g in range(groups):
                dw[g * kg : (g + 1) * kg, :, r, s] = np.einsum(
                    "nkpq,ncpq->kc", dy[:, g * kg : (g + 1) * kg], win[:, g * cg : (g + 1) * cg]
                )
    return dw


def to_layout(a, layout):
    """NCHW-ordered array (activation or KCRS filter) -> the layout's order."""
    return a if layout == "NCHW" else np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def from_layout(a, layout):
    """The layout's order -> NCHW (activations) / KCRS (filters)."""
    return a if layout == "NCHW" else np.ascontiguousarray(a.transpose(0, 3, 1, 2))


def to_bf16_bits(a):
    """float -> bf16 bit patterns (uint16), rounding to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16_bits(b):
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_storage(a, precision):
    """float64 values -> the precision's storage array (uint16 bits for bf16)."""
    if precision == "bf16":
        return to_bf16_bits(a)
    return np.asarray(a, STORAGE[precision])


def from_storage(a, precision):
    """Storage array -> float64 values."""
    if precision == "bf16":
        return from_bf16_bits(a).astype(np.float64)
    return np.asarray(a, np.float64)


def random_values(rng, shape, precision, scale=1.0):
    """Random normal values already representable in the storage dtype: (storage array, float64 values)."""
    stored = to_storage(rng.standard_normal(shape) * scale, precision)
    return stored, from_storage(stored, precision)


def nan_storage(shape, precision):
    """An array of NaNs in the storage dtype (poison for outputs)."""
    if precision == "bf16":
        return np.full(shape, 0x7FC0, np.uint16)
    return np.full(shape, np.nan, STORAGE[precision])


def relative_error(actual, expected):
    """Norm-wise relative error ||actual - expected|| / ||expected||."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))
