"""Float64 NumPy pooling with the signatures of resnet_native.ops.pool: max pooling (output shape, forward,
backward) and global average pooling (forward, backward).

As the native ops: max pooling pads with -inf (a padded position never wins), propagates NaN and uses floor mode;
its gradient goes to the first maximum of each window in row-major order (cuDNN's deterministic max mode), summed
where windows overlap. Global average pooling gives (N, C) in the input's dtype.
"""


import numpy as np

from .._core.names import LAYOUTS, choice, whole_numbers
from . import storage
from .layout import from_nchw, shape_from_nchw, shape_to_nchw, to_nchw


def _window(kernel, stride, padding):
    kernel = whole_numbers("kernel", kernel, count=2)
    stride = kernel if stride is None else whole_numbers("stride", stride, count=2)
    padding = whole_numbers("padding", padding, count=2)
    if min(kernel) < 1 or min(stride) < 1 or min(padding) < 0:
        raise ValueError(f"kernel, stride, padding: expected >= 1, >= 1, >= 0, got {kernel}, {stride}, {padding}")
    return kernel, stride, padding


def _nchw_shape(shape, layout, name) -> tuple:
    choice("layout", layout, LAYOUTS)
    if len(shape) != 4:
        raise ValueError(f"{name}: expected a 4-D {layout} shape, got {tuple(shape)}")
    return shape_to_nchw(shape, layout)


def max_pool2d_output_shape(x_shape, *, kernel, stride=None, padding=0, layout) -> tuple:
    """Output shape of max_pool2d, in the layout's order. stride=None means stride = kernel."""
    n, c, h, w = _nchw_shape(x_shape, layout, "x_shape")
    (kh, kw), (sh, sw), (ph, pw) = _window(kernel, stride, padding)
    if h + 2 * ph < kh or w + 2 * pw < kw:
        raise ValueError(f"x_shape: the padded input ({h + 2 * ph}x{w + 2 * pw}) is smaller than the window "
                         f"({kh}x{kw})")
    return shape_from_nchw((n, c, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1), layout)


def _taps(x_nchw, kernel, stride, padding):
    """The -inf padded input and, per window position (i, j), the strided slices it reads."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, w = x_nchw.shape
    p, q = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    xpad = np.pad(x_nchw, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
    taps = [(slice(i, i + sh * (p - 1) + 1, sh), slice(j, j + sw * (q - 1) + 1, sw)) for i in range(kh)
            for j in range(kw)]
    return xpad, taps


def max_pool2d(x, *, kernel, stride=None, padding=0, layout, out=None, dtype=None):
    """y = max over each kernel window (stride=None: stride = kernel)."""
    dt = storage.dtype_of(x, "x", dtype)
    y_shape = max_pool2d_output_shape(x.shape, kernel=kernel, stride=stride, padding=padding, layout=layout)
    xpad, taps = _taps(storage.decode(to_nchw(x, layout), dt), *_window(kernel, stride, padding))
    y = np.full(_nchw_shape(y_shape, layout, "y"), -np.inf)
    for rows, cols in taps:
        y = np.maximum(y, xpad[:, :, rows, cols])
    return storage.write(storage.output(out, y_shape, x.dtype), from_nchw(y, layout), dt)


def max_pool2d_backward(dy, x, y, *, kernel, stride=None, padding=0, layout, out=None, dtype=None):
    """dx: dy routed to the position of each window's (first) maximum, summed where windows overlap."""
    dt = storage.dtype_of(dy, "dy", dtype)
    if storage.host(x, "x").dtype != dy.dtype:
        raise TypeError(f"x: expected a {dy.dtype} array (as dy), got {x.dtype}")
    y_shape = max_pool2d_output_shape(x.shape, kernel=kernel, stride=stride, padding=padding, layout=layout)
    storage.like(y, "y", dy, "dy")
    if tuple(dy.shape) != y_shape:
        raise ValueError(f"dy: expected the output's shape {y_shape}, got {tuple(dy.shape)}")
    window = _window(kernel, stride, padding)
    xpad, taps = _taps(storage.decode(to_nchw(x, layout), dt), *window)
    yn, dyn = storage.decode(to_nchw(y, layout), dt), storage.decode(to_nchw(dy, layout), dt)
    dxpad, taken = np.zeros_like(xpad), np.zeros(yn.shape, dtype=bool)
    for rows, cols in taps:
        hit = (xpad[:, :, rows, cols] == yn) & ~taken
        dxpad[:, :, rows, cols] += np.where(hit, dyn, 0.0)
        taken |= hit
    (ph, pw) = window[2]
    dx = dxpad[:, :, ph : dxpad.shape[2] - ph, pw : dxpad.shape[3] - pw]
    return storage.write(storage.output(out, x.shape, x.dtype), from_nchw(dx, layout), dt)


def global_avg_pool(x, *, layout, out=None, dtype=None):
    """(N, C): the mean of each channel over H and W."""
    dt = storage.dtype_of(x, "x", dtype)
    n, c, _, _ = _nchw_shape(x.shape, layout, "x")
    mean = storage.decode(x, dt).mean(axis=(2, 3) if layout == "NCHW" else (1, 2))
    return storage.write(storage.output(out, (n, c), x.dtype), mean, dt)


def global_avg_pool_backward(dy, x_shape, *, layout, out=None, dtype=None):
    """dx of shape x_shape: dy[n, c] / (H * W) at every position of channel c."""
    dt = storage.dtype_of(dy, "dy", dtype)
    n, c, h, w = _nchw_shape(x_shape, layout, "x_shape")
    if tuple(dy.shape) != (n, c):
        raise ValueError(f"dy: expected shape {(n, c)} (N, C of x_shape), got {tuple(dy.shape)}")
    d = storage.decode(dy, dt) / (h * w)
    per_channel = d[:, :, None, None] if layout == "NCHW" else d[:, None, None, :]
    dx = np.broadcast_to(per_channel, shape_from_nchw((n, c, h, w), layout))
    return storage.write(storage.output(out, tuple(int(s) for s in x_shape), dy.dtype), dx, dt)


__all__ = ["global_avg_pool", "global_avg_pool_backward", "max_pool2d", "max_pool2d_backward",
           "max_pool2d_output_shape"]
