"""Float64 NumPy convolutions with the signatures of resnet_native.ops.conv: conv_output_shape, conv2d (with its bias,
residual and ReLU epilogue), conv2d_backward_data, conv2d_backward_filter and conv2d_backward_bias.

`spec` is a resnet_native.ops.conv.ConvSpec; only its geometry (stride, padding, dilation, groups), layout and precision
matter here (algorithm, engine and determinism choose how cuDNN computes, not what). Activations are (N, C, H, W)
for NCHW and (N, H, W, C) for NHWC; filters (K, C/groups, R, S) and (K, R, S, C/groups). x, w, dy, z, bias and out
must all hold the storage dtype of the spec's precision (fp32 and tf32: float32 or float64, fp16: float16, bf16:
uint16 bits), as for the native ops, which also check the shapes checked here.

The convolution is a cross-correlation computed as one matrix product per group: a strided view of the padded input
gives every output position's (C/groups, R, S) window, and np.tensordot contracts it with the filter (BLAS does
the sums, in float64).
"""

import numbers
from typing import NamedTuple

import numpy as np

from .._core.names import ACTIVATIONS, DTYPE_ALIASES, LAYOUTS, PRECISIONS, choice, flag, whole_number, whole_numbers
from . import storage
from .layout import from_nchw, shape_from_nchw, shape_to_nchw, to_nchw


class _Geometry(NamedTuple):
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    layout: str
    precision: str


def _geometry(spec) -> _Geometry:
    try:
        fields = (spec.stride, spec.padding, spec.dilation, spec.groups, spec.layout, spec.precision)
    except AttributeError:
        raise TypeError(f"spec: expected a resnet_native.ConvSpec, got {type(spec).__name__}") from None
    stride, padding, dilation, groups, layout, precision = fields
    return _Geometry(whole_numbers("stride", stride, 1, 2), whole_numbers("padding", padding, 0, 2),
                     whole_numbers("dilation", dilation, 1, 2), whole_number("groups", groups, 1),
                     choice("layout", layout, LAYOUTS), choice("precision", precision, PRECISIONS))


def _shape4(shape, name: str) -> tuple:
    ok = isinstance(shape, (tuple, list)) and len(shape) == 4
    if not ok or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in shape):
        raise ValueError(f"{name}: expected a tuple of 4 positive ints, got {shape!r}")
    return tuple(int(v) for v in shape)


def _output_hw(g: _Geometry, x_nchw: tuple, w_kcrs: tuple, x_name: str, w_name: str) -> tuple:
    """(P, Q) of convolving an NCHW x_shape with a KCRS w_shape, after the native ops' shape checks."""
    _, c, h, w = x_nchw
    k, cg, r, s = w_kcrs
    if cg * g.groups != c:
        raise ValueError(f"{w_name}: {cg} input channels per group x groups={g.groups} does not match the {c} "
                         f"channels of {x_name}")
    if k % g.groups:
        raise ValueError(f"{w_name}: K={k} output channels is not a multiple of groups={g.groups}")
    (ph, pw), (dh, dw), (sh, sw) = g.padding, g.dilation, g.stride
    extent = (dh * (r - 1) + 1, dw * (s - 1) + 1)
    if h + 2 * ph < extent[0] or w + 2 * pw < extent[1]:
        raise ValueError(f"{x_name}: the padded input ({h + 2 * ph}x{w + 2 * pw}) is smaller than the dilated "
                         f"filter ({extent[0]}x{extent[1]})")
    return ((h + 2 * ph - extent[0]) // sh + 1, (w + 2 * pw - extent[1]) // sw + 1)


def conv_output_shape(x_shape, w_shape, spec) -> tuple:
    """The output shape (in the spec's layout) of convolving x_shape with w_shape."""
    g = _geometry(spec)
    x_nchw = shape_to_nchw(_shape4(x_shape, "x_shape"), g.layout)
    w_kcrs = shape_to_nchw(_shape4(w_shape, "w_shape"), g.layout)
    p, q = _output_hw(g, x_nchw, w_kcrs, "x_shape", "w_shape")
    return shape_from_nchw((x_nchw[0], w_kcrs[0], p, q), g.layout)


def _operands(g: _Geometry, **arrays) -> str:
    """Check the named arrays are 4-D NumPy arrays of one dtype, the storage of the spec's precision; its name."""
    first_name, first = next(iter(arrays.items()))
    allowed = storage.host_dtypes(DTYPE_ALIASES[g.precision])
    for name, a in arrays.items():
        storage.host(a, name)
        if a.ndim != 4:
            raise ValueError(f"{name}: expected a 4-D {g.layout} array, got shape {tuple(a.shape)}")
        if a.dtype not in allowed:
            raise TypeError(f"{name}: expected {' or '.join(d.name for d in allowed)} for precision "
                            f"{g.precision!r}, got {a.dtype}")
        if a.dtype != first.dtype:
            raise TypeError(f"{name}: expected a {first.dtype} array (as {first_name}), got {a.dtype}")
    return DTYPE_ALIASES[g.precision]


def _windows(xpad, g: _Geometry, r: int, s: int, p: int, q: int):
    """(N, C, P, Q, R, S) view of the padded input: the window each output position (p, q) multiplies by the filter."""
    (sh, sw), (dh, dw) = g.stride, g.dilation
    view = np.lib.stride_tricks.sliding_window_view(xpad, (dh * (r - 1) + 1, dw * (s - 1) + 1), axis=(2, 3))
    return view[:, :, : sh * (p - 1) + 1 : sh, : sw * (q - 1) + 1 : sw, ::dh, ::dw]


def _padded(a, g: _Geometry):
    (ph, pw) = g.padding
    return np.pad(a, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def _groups(g: _Geometry, c: int, k: int):
    """(input channel slice, output channel slice) of every group."""
    cg, kg = c // g.groups, k // g.groups
    return [(slice(i * cg, (i + 1) * cg), slice(i * kg, (i + 1) * kg)) for i in range(g.groups)]


def conv2d(x, w, spec, *, bias=None, z=None, activation="identity", alpha1=1.0, alpha2=1.0, out=None):
    """y = activation(alpha1 * conv(x, w) + alpha2 * z + bias), returned (written into `out` when given)."""
    g = _geometry(spec)
    dtype = _operands(g, x=x, w=w)
    choice("activation", activation, ACTIVATIONS)
    xn, wk = storage.decode(to_nchw(x, g.layout), dtype), storage.decode(to_nchw(w, g.layout), dtype)
    (n, c, _, _), (k, _, r, s) = xn.shape, wk.shape
    p, q = _output_hw(g, xn.shape, wk.shape, "x", "w")
    windows, y = _windows(_padded(xn, g), g, r, s, p, q), np.empty((n, k, p, q))
    for cin, cout in _groups(g, c, k):
        y[:, cout] = np.tensordot(windows[:, cin], wk[cout], axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
    y *= float(alpha1)
    if bias is not None:
        storage.host(bias, "bias")
        if tuple(bias.shape) != (k,) or bias.dtype != x.dtype:
            raise ValueError(f"bias: expected a ({k},) {x.dtype} array, got {bias.dtype} {tuple(bias.shape)}")
        y += storage.decode(bias, dtype).reshape(1, k, 1, 1)
    y_shape = shape_from_nchw((n, k, p, q), g.layout)
    if z is not None:
        storage.host(z, "z")
        if tuple(z.shape) != y_shape or z.dtype != x.dtype:
            raise ValueError(f"z: expected a {x.dtype} array of the output's shape {y_shape}, got {z.dtype} "
                             f"{tuple(z.shape)}")
        y += float(alpha2) * storage.decode(to_nchw(z, g.layout), dtype)
    if activation == "relu":
        y = np.where(y < 0, 0.0, y)
    return storage.write(storage.output(out, y_shape, x.dtype), from_nchw(y, g.layout), dtype)


def _accumulate_into(accumulate, out) -> bool:
    accumulate = flag("accumulate", accumulate)
    if accumulate and out is None:
        raise ValueError("accumulate: needs out, the gradient to add to")
    return accumulate


def conv2d_backward_data(dy, w, spec, x_shape, *, out=None, accumulate=False):
    """dx, the gradient of conv2d's input x (of shape x_shape, in the spec's layout) given dy; with accumulate=True it
    is added to `out` (which must then be given) instead of overwriting it."""
    g = _geometry(spec)
    accumulate = _accumulate_into(accumulate, out)
    dtype = _operands(g, dy=dy, w=w)
    x_nchw = shape_to_nchw(_shape4(x_shape, "x_shape"), g.layout)
    dyn, wk = storage.decode(to_nchw(dy, g.layout), dtype), storage.decode(to_nchw(w, g.layout), dtype)
    (n, c, h, wd), (k, _, r, s) = x_nchw, wk.shape
    p, q = _output_hw(g, x_nchw, wk.shape, "x_shape", "w")
    if dyn.shape != (n, k, p, q):
        raise ValueError(f"dy: expected shape {shape_from_nchw((n, k, p, q), g.layout)}, got {tuple(dy.shape)}")
    (ph, pw), (sh, sw), (dh, dw) = g.padding, g.stride, g.dilation
    dxpad = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    for cin, cout in _groups(g, c, k):
        # The adjoint of the forward's windows: each output position's (C/g, R, S) gradient, added back tap by tap.
        dwin = np.tensordot(dyn[:, cout], wk[cout], axes=([1], [0]))  # (N, P, Q, C/g, R, S)
        for i in range(r):
            for j in range(s):
                rows = slice(i * dh, i * dh + sh * (p - 1) + 1, sh)
                cols = slice(j * dw, j * dw + sw * (q - 1) + 1, sw)
                dxpad[:, cin, rows, cols] += dwin[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    dx = from_nchw(dxpad[:, :, ph : ph + h, pw : pw + wd], g.layout)
    result = storage.output(out, shape_from_nchw(x_nchw, g.layout), dy.dtype)
    if accumulate:
        dx = dx + storage.decode(result, dtype)
    return storage.write(result, dx, dtype)


def conv2d_backward_filter(x, dy, spec, w_shape, *, out=None, accumulate=False):
    """dw, the gradient of conv2d's filter (of shape w_shape, in the spec's layout); with accumulate=True it is added
    to `out` (which must then be given) instead of overwriting it."""
    g = _geometry(spec)
    accumulate = _accumulate_into(accumulate, out)
    dtype = _operands(g, x=x, dy=dy)
    w_kcrs = shape_to_nchw(_shape4(w_shape, "w_shape"), g.layout)
    xn, dyn = storage.decode(to_nchw(x, g.layout), dtype), storage.decode(to_nchw(dy, g.layout), dtype)
    (n, c, _, _), (k, _, r, s) = xn.shape, w_kcrs
    p, q = _output_hw(g, xn.shape, w_kcrs, "x", "w_shape")
    if dyn.shape != (n, k, p, q):
        raise ValueError(f"dy: expected shape {shape_from_nchw((n, k, p, q), g.layout)}, got {tuple(dy.shape)}")
    windows, dw = _windows(_padded(xn, g), g, r, s, p, q), np.empty(w_kcrs)
    for cin, cout in _groups(g, c, k):
        dw[cout] = np.tensordot(dyn[:, cout], windows[:, cin], axes=([0, 2, 3], [0, 2, 3]))
    result = storage.output(out, tuple(w_shape), x.dtype)
    dw = from_nchw(dw, g.layout)
    if accumulate:
        dw = dw + storage.decode(result, dtype)
    return storage.write(result, dw, dtype)


def conv2d_backward_bias(dy, layout, *, out=None):
    """db = the sum of dy over N, H and W, of shape (K,) in dy's dtype."""
    layout = choice("layout", layout, LAYOUTS)
    dtype = storage.dtype_of(dy, "dy", uint16_is_bf16=True)
    if dy.ndim != 4:
        raise ValueError(f"dy: expected a 4-D {layout} array, got shape {tuple(dy.shape)}")
    db = storage.decode(to_nchw(dy, layout), dtype).sum(axis=(0, 2, 3))
    return storage.write(storage.output(out, db.shape, dy.dtype), db, dtype)


__all__ = ["conv2d", "conv2d_backward_bias", "conv2d_backward_data", "conv2d_backward_filter", "conv_output_shape"]
