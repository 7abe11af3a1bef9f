"""The conv GPU tests' view of the package's float64 reference (resnet_native.reference): NCHW convolutions with
the geometry as arguments, and the storage helpers (bf16 lives in uint16 arrays as bit patterns).

Everything here is NCHW with filters (K, C/groups, R, S); `to_layout` / `from_layout` convert for NHWC, whose
activations are (N, H, W, C) and filters (K, R, S, C/groups). New tests should call resnet_native.reference directly.
"""

from types import SimpleNamespace

import numpy as np

from resnet_native import reference
from resnet_native.names import PRECISION_STORAGE
from resnet_native.reference.bf16 import from_bf16_bits, to_bf16_bits  # noqa: F401  (re-exported)
from resnet_native.reference.storage import relative_error, to_storage  # noqa: F401  (re-exported)

TOLERANCE = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}
STORAGE = {p: d.type for p, d in PRECISION_STORAGE.items()}


def _spec(stride, padding, dilation, groups):
    return SimpleNamespace(stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), groups=groups,
                           layout="NCHW", precision="fp32")


def output_size(size, pad, filt, stride, dilation):
    return (size + 2 * pad - dilation * (filt - 1) - 1) // stride + 1


def conv2d(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """Cross-correlation y[n, k, p, q] = sum_{c, r, s} x[n, g(k)*C/g + c, p*s0 + r*d0 - pad0, ...] * w[k, c, r, s]."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    return reference.conv.conv2d(x, w, _spec(stride, padding, dilation, groups))


def conv2d_backward_data(dy, w, x_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """dx of conv2d: the adjoint of conv2d with respect to x."""
    dy, w = np.asarray(dy, np.float64), np.asarray(w, np.float64)
    return reference.conv.conv2d_backward_data(dy, w, _spec(stride, padding, dilation, groups), tuple(x_shape))


def conv2d_backward_filter(x, dy, w_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """dw of conv2d: the adjoint of conv2d with respect to w."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    return reference.conv.conv2d_backward_filter(x, dy, _spec(stride, padding, dilation, groups), tuple(w_shape))


def to_layout(a, layout):
    """NCHW-ordered array (activation or KCRS filter) -> the layout's order."""
    return a if layout == "NCHW" else np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def from_layout(a, layout):
    """The layout's order -> NCHW (activations) / KCRS (filters)."""
    return a if layout == "NCHW" else np.ascontiguousarray(a.transpose(0, 3, 1, 2))


def from_storage(a, precision):
    """Storage array -> float64 values."""
    return reference.storage.decode(np.asarray(a), "bf16" if precision == "bf16" else "fp32")


def random_values(rng, shape, precision, scale=1.0):
    """Random normal values already representable in the storage dtype: (storage array, float64 values)."""
    stored = to_storage(rng.standard_normal(shape) * scale, precision)
    return stored, from_storage(stored, precision)


def nan_storage(shape, precision):
    """An array of NaNs in the storage dtype (poison for outputs)."""
    if precision == "bf16":
        return np.full(shape, 0x7FC0, np.uint16)
    return np.full(shape, np.nan, STORAGE[precision])
