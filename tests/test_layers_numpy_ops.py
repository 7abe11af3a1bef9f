"""Float64 NumPy versions of the native ops the Python graph calls, with the same signatures.

Two uses: (1) the references GPU tests compare layers and models against (`conv2d(x64, w64, spec)` etc. on
host copies); (2) a stand-in backend, `numpy_backend()`, under which the whole graph (layers, ResNets,
optimizers, loss) runs on the CPU in float64, so CPU tests check its wiring with finite differences. The tests
in this file check these references themselves (direct-loop convolution, adjoint identities, finite
differences).
"""

import dataclasses
import types

import numpy as np
import pytest

# ----------------------------------------------------------------------------------------------- helpers


def _to_nchw(a, layout):
    return a if layout == "NCHW" else a.transpose(0, 3, 1, 2)


def _from_nchw(a, layout):
    return a if layout == "NCHW" else a.transpose(0, 2, 3, 1)


def _write(out, value, like):
    """Store `value` into `out` (allocated with like's dtype when None) and return it."""
    if out is None:
        out = np.empty(value.shape, dtype=like.dtype)
    if tuple(out.shape) != tuple(value.shape):
        raise ValueError(f"out: expected shape {value.shape}, got {out.shape}")
    out[...] = value
    return out


def _f64(a):
    return np.asarray(a, dtype=np.float64)


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (int(v), int(v))


# ----------------------------------------------------------------------------------------------- convolution


@dataclasses.dataclass(frozen=True)
class ConvSpec:
    stride: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    layout: str = "NCHW"
    precision: str = "fp32"
    algo: str = "find"
    engine: str = "legacy"
    deterministic: bool = False


def _filter_to_kcrs(w, layout):
    return w if layout == "NCHW" else w.transpose(0, 3, 1, 2)


def _filter_from_kcrs(w, layout):
    return w if layout == "NCHW" else w.transpose(0, 2, 3, 1)


def _geometry(x_shape_nchw, w_shape_kcrs, spec):
    n, c, h, w = x_shape_nchw
    k, cg, r, s = w_shape_kcrs
    (sh, sw), (ph, pw), (dh, dw) = _pair(spec.stride), _pair(spec.padding), _pair(spec.dilation)
    p = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1
    q = (w + 2 * pw - dw * (s - 1) - 1) // sw + 1
    return (n, c, h, w), (k, cg, r, s), (sh, sw), (ph, pw), (dh, dw), (p, q)


def _windows(spec, r, s, p, q, dh, dw, sh, sw):
    """For each filter tap (i, j): the slices of the padded input it multiplies."""
    for i in range(r):
        for j in range(s):
            yield (
                i,
                j,
                slice(i * dh, i * dh + sh * (p - 1) + 1, sh),
                slice(j * dw, j * dw + sw * (q - 1) + 1, sw),
            )


def conv_output_shape(x_shape, w_shape, spec):
    xs = x_shape if spec.layout == "NCHW" else (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    ws = w_shape if spec.layout == "NCHW" else (w_shape[0], w_shape[3], w_shape[1], w_shape[2])
    (n, _, _, _), (k, _, _, _), _, _, _, (p, q) = _geometry(xs, ws, spec)
    return (n, k, p, q) if spec.layout == "NCHW" else (n, p, q, k)


def conv2d(x, w, spec, *, bias=None, z=None, activation="identity", alpha1=1.0, alpha2=1.0, out=None):
    xn, wk = _f64(_to_nchw(x, spec.layout)), _f64(_filter_to_kcrs(w, spec.layout))
    (n, c, h, _), (k, cg, r, s), (sh, sw), (ph, pw), (dh, dw), (p, q) = _geometry(xn.shape, wk.shape, spec)
    g, kg = spec.groups, k // spec.groups
    xpad = np.pad(xn, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y = np.zeros((n, k, p, q))
    for gi in range(g):
        xs, ws = xpad[:, gi * cg : (gi + 1) * cg], wk[gi * kg : (gi + 1) * kg]
        for i, j, rows, cols in _windows(spec, r, s, p, q, dh, dw, sh, sw):
            y[:, gi * kg : (gi + 1) * kg] += np.einsum("ncpq,kc->nkpq", xs[:, :, rows, cols], ws[:, :, i, j])
    y = alpha1 * y
    if bias is not None:
        y += _f64(bias).reshape(1, k, 1, 1)
    if z is not None:
        y += alpha2 * _f64(_to_nchw(z, spec.layout))
    if activation == "relu":
        y = np.maximum(y, 0.0)
    return _write(out, _from_nchw(y, spec.layout), x)


def conv2d_backward_data(dy, w, spec, x_shape, *, out=None):
    dyn, wk = _f64(_to_nchw(dy, spec.layout)), _f64(_filter_to_kcrs(w, spec.layout))
    xs_nchw = tuple(x_shape) if spec.layout == "NCHW" else (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    (n, c, h, wd), (k, cg, r, s), (sh, sw), (ph, pw), (dh, dw), (p, q) = _geometry(xs_nchw, wk.shape, spec)
    g, kg = spec.groups, k // spec.groups
    dxpad = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    for gi in range(g):
        ws, dys = wk[gi * kg : (gi + 1) * kg], dyn[:, gi * kg : (gi + 1) * kg]
        for i, j, rows, cols in _windows(spec, r, s, p, q, dh, dw, sh, sw):
            dxpad[:, gi * cg : (gi + 1) * cg, rows, cols] += np.einsum("nkpq,kc->ncpq", dys, ws[:, :, i, j])
    dx = dxpad[:, :, ph : ph + h, pw : pw + wd]
    return _write(out, _from_nchw(dx, spec.layout), dy)


def conv2d_backward_filter(x, dy, spec, w_shape, *, out=None, accumulate=False):
    xn, dyn = _f64(_to_nchw(x, spec.layout)), _f64(_to_nchw(dy, spec.layout))
    ws_kcrs = tuple(w_shape) if spec.layout == "NCHW" else (w_shape[0], w_shape[3], w_shape[1], w_shape[2])
    (n, c, h, _), (k, cg, r, s), (sh, sw), (ph, pw), (dh, dw), (p, q) = _geometry(xn.shape, ws_kcrs, spec)
    g, kg = spec.groups, k // spec.groups
    xpad = np.pad(xn, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    dw_ = np.zeros(ws_kcrs)
    for gi in range(g):
        xs, dys = xpad[:, gi * cg : (gi + 1) * cg], dyn[:, gi * kg : (gi + 1) * kg]
        for i, j, rows, cols in _windows(spec, r, s, p, q, dh, dw, sh, sw):
            dw_[gi * kg : (gi + 1) * kg, :, i, j] = np.einsum("nkpq,ncpq->kc", dys, xs[:, :, rows, cols])
    dw_ = _filter_from_kcrs(dw_, spec.layout)
    if accumulate and out is not None:
        dw_ = dw_ + _f64(out)
    return _write(out, dw_, x)


# ----------------------------------------------------------------------------------------------- batch norm


def _stat_axes(layout):
    return (0, 2, 3) if layout == "NCHW" else (0, 1, 2)


def _per_channel(v, layout):
    return v.reshape((1, -1, 1, 1) if layout == "NCHW" else (1, 1, 1, -1))


def batch_norm_train(
    x,
    gamma,
    beta,
    running_mean,
    running_var,
    *,
    layout,
    momentum=0.1,
    eps=1e-5,
    z=None,
    relu=False,
    out=None,
    save_mean=None,
    save_invstd=None,
    reserve=None,
    dtype=None,
):
    xd, axes = _f64(x), _stat_axes(layout)
    m = xd.size // xd.shape[1 if layout == "NCHW" else 3]
    mean, var = xd.mean(axis=axes), xd.var(axis=axes)
    invstd = 1.0 / np.sqrt(var + eps)
    y = (xd - _per_channel(mean, layout)) * _per_channel(invstd * _f64(gamma), layout) + _per_channel(
        _f64(beta), layout
    )
    if z is not None:
        y = y + _f64(z)
    if relu:
        y = np.maximum(y, 0.0)
    running_mean[...] = (1 - momentum) * _f64(running_mean) + momentum * mean
    running_var[...] = (1 - momentum) * _f64(running_var) + momentum * var * m / (m - 1)
    reserve = np.zeros(1, np.uint8) if reserve is None else reserve
    return (_write(out, y, x), _write(save_mean, mean, gamma), _write(save_invstd, invstd, gamma), reserve)


def batch_norm_infer(
    x, gamma, beta, running_mean, running_var, *, layout, eps=1e-5, z=None, relu=False, out=None, dtype=None
):
    scale = _f64(gamma) / np.sqrt(_f64(running_var) + eps)
    y = (_f64(x) - _per_channel(_f64(running_mean), layout)) * _per_channel(scale, layout) + _per_channel(
        _f64(beta), layout
    )
    if z is not None:
        y = y + _f64(z)
    if relu:
        y = np.maximum(y, 0.0)
    return _write(out, y, x)


def batch_norm_backward(
    x,
    dy,
    gamma,
    beta,
    save_mean,
    save_invstd,
    *,
    layout,
    eps=1e-5,
    y=None,
    relu=False,
    has_z=False,
    reserve=None,
    dx=None,
    dgamma=None,
    dbeta=None,
    dz=None,
    dtype=None,
    accumulate=False,
):
    xd, g, axes = _f64(x), _f64(dy), _stat_axes(layout)
    if relu:
        g = g * (_f64(y) > 0)
    m = xd.size // xd.shape[1 if layout == "NCHW" else 3]
    xhat = (xd - _per_channel(_f64(save_mean), layout)) * _per_channel(_f64(save_invstd), layout)
    db, dg = g.sum(axis=axes), (g * xhat).sum(axis=axes)
    dxv = _per_channel(_f64(gamma) * _f64(save_invstd) / m, layout) * (
        m * g - _per_channel(db, layout) - xhat * _per_channel(dg, layout)
    )
    if accumulate:
        dg, db = dg + _f64(dgamma), db + _f64(dbeta)
    return (
        _write(dx, dxv, x),
        _write(dgamma, dg, gamma),
        _write(dbeta, db, gamma),
        _write(dz, g, x) if has_z else None,
    )


# ----------------------------------------------------------------------------------------------- pooling


def _pool_windows(xn, kernel, stride, padding):
    n, c, h, w = xn.shape
    p = (h + 2 * padding - kernel) // stride + 1
    q = (w + 2 * padding - kernel) // stride + 1
    xpad = np.pad(xn, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=-np.inf)
    taps = [
        (i, j, slice(i, i + stride * (p - 1) + 1, stride), slice(j, j + stride * (q - 1) + 1, stride))
        for i in range(kernel)
        for j in range(kernel)
    ]
    return xpad, taps, (n, c, p, q)


def max_pool2d(x, *, kernel, stride, padding, layout, out=None, dtype=None):
    xpad, taps, shape = _pool_windows(_f64(_to_nchw(x, layout)), kernel, stride, padding)
    y = np.full(shape, -np.inf)
    for _, _, rows, cols in taps:
        y = np.maximum(y, xpad[:, :, rows, cols])
    return _write(out, _from_nchw(y, layout), x)


def max_pool2d_backward(dy, x, y, *, kernel, stride, padding, layout, out=None, dtype=None):
    """The gradient goes to the first maximum of each window in row-major order."""
    xpad, taps, _ = _pool_windows(_f64(_to_nchw(x, layout)), kernel, stride, padding)
    yn, dyn = _f64(_to_nchw(y, layout)), _f64(_to_nchw(dy, layout))
    dxpad, taken = np.zeros_like(xpad), np.zeros(yn.shape, dtype=bool)
    for _, _, rows, cols in taps:
        hit = (xpad[:, :, rows, cols] == yn) & ~taken
        dxpad[:, :, rows, cols] += dyn * hit
        taken |= hit
    h, w = xpad.shape[2] - 2 * padding, xpad.shape[3] - 2 * padding
    dx = dxpad[:, :, padding : padding + h, padding : padding + w]
    return _write(out, _from_nchw(dx, layout), x)


def global_avg_pool(x, *, layout, out=None, dtype=None):
    return _write(out, _f64(x).mean(axis=(2, 3) if layout == "NCHW" else (1, 2)), x)


def global_avg_pool_backward(dy, x_shape, *, layout, out=None, dtype=None):
    n, c = dy.shape
    hw = x_shape[2] * x_shape[3] if layout == "NCHW" else x_shape[1] * x_shape[2]
    d = _f64(dy) / hw
    dx = np.broadcast_to(d[:, :, None, None] if layout == "NCHW" else d[:, None, None, :], tuple(x_shape))
    return _write(out, dx, dy)


# ----------------------------------------------------------------------------------------------- elementwise


def add(a, b, *, out=None, dtype=None):
    return _write(out, _f64(a) + _f64(b), a)


def add_relu(a, b, *, out=None, dtype=None):
    return _write(out, np.maximum(_f64(a) + _f64(b), 0.0), a)


def relu(x, *, out=None, dtype=None):
    return _write(out, np.maximum(_f64(x), 0.0), x)


def relu_backward(dy, y, *, out=None, dtype=None):
    return _write(out, _f64(dy) * (_f64(y) > 0), dy)


add_relu_backward = relu_backward


def cast(x, out):
    out[...] = np.asarray(x).astype(out.dtype)
    return out


# ----------------------------------------------------------------------------------------------- optimizers


class TensorList:
    def __init__(self, arrays, dtype=None):
        self.arrays = list(arrays)

    def __len__(self):
        return len(self.arrays)


def _skipped(found_inf):
    return found_inf is not None and int(np.asarray(found_inf)[0]) != 0


def sgd_step(
    params,
    grads,
    momentum_bufs,
    *,
    lr,
    momentum=0.9,
    weight_decay=0.0,
    nesterov=False,
    dampening=0.0,
    inv_scale=1.0,
    found_inf=None,
    model_copies=None,
    first_step=False,
):
    """PyTorch SGD: the first step sets the buffer to the gradient (first_step=True, or implied when the
    buffer is zero and dampening is 0), later steps buf = momentum * buf + (1 - dampening) * g."""
    if _skipped(found_inf):
        return
    for i, (p, g, buf) in enumerate(zip(params.arrays, grads.arrays, momentum_bufs.arrays, strict=True)):
        d = _f64(g) * inv_scale + weight_decay * _f64(p)
        buf[...] = d if first_step else momentum * _f64(buf) + (1.0 - dampening) * d
        step = d + momentum * _f64(buf) if nesterov else _f64(buf)
        p[...] = _f64(p) - lr * step
        if model_copies is not None:
            model_copies.arrays[i][...] = p
    return None


def adamw_step(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    *,
    lr,
    beta1=0.9,
    beta2=0.999,
    eps=1e-8,
    weight_decay=0.01,
    step,
    inv_scale=1.0,
    found_inf=None,
    model_copies=None,
):
    if _skipped(found_inf):
        return
    bc1, bc2 = 1.0 - beta1**step, 1.0 - beta2**step
    for i, (p, g, m, v) in enumerate(
        zip(params.arrays, grads.arrays, exp_avgs.arrays, exp_avg_sqs.arrays, strict=True)
    ):
        gd = _f64(g) * inv_scale
        pd = _f64(p) * (1.0 - lr * weight_decay)
        m[...] = beta1 * _f64(m) + (1.0 - beta1) * gd
        v[...] = beta2 * _f64(v) + (1.0 - beta2) * gd * gd
        p[...] = pd - (lr / bc1) * _f64(m) / (np.sqrt(_f64(v)) / np.sqrt(bc2) + eps)
        if model_copies is not None:
            model_copies.arrays[i][...] = p


def check_finite(grads, found_inf):
    if not all(np.isfinite(_f64(g)).all() for g in grads.arrays):
        found_inf[0] = 1


def zero_(tensors):
    for a in tensors.arrays:
        a[...] = 0


def write_scalars(dst, values):
    dst[...] = np.asarray(values, dtype=dst.dtype)


def advance_step(step, found_inf=None):
    if not _skipped(found_inf):
        step[0] += 1


def scale_(tensors, factor):
    for a in tensors.arrays:
        a[...] = _f64(a) * factor


# ----------------------------------------------------------------------------------------------- the backend


def numpy_backend():
    """Keyword arguments for resnet_native.layers._backend.ops.use(...): the graph on these float64
    references."""
    ns = types.SimpleNamespace
    return dict(
        xp=np,
        conv=ns(
            ConvSpec=ConvSpec,
            conv2d=conv2d,
            conv2d_backward_data=conv2d_backward_data,
            conv2d_backward_filter=conv2d_backward_filter,
            conv_output_shape=conv_output_shape,
        ),
        kernels=ns(
            add=add,
            add_relu=add_relu,
            relu=relu,
            relu_backward=relu_backward,
            add_relu_backward=add_relu_backward,
            cast=cast,
        ),
        norm=ns(
            batch_norm_train=batch_norm_train,
            batch_norm_infer=batch_norm_infer,
            batch_norm_backward=batch_norm_backward,
        ),
        pool=ns(
            max_pool2d=max_pool2d,
            max_pool2d_backward=max_pool2d_backward,
            global_avg_pool=global_avg_pool,
            global_avg_pool_backward=global_avg_pool_backward,
        ),
        multi_tensor=ns(
            TensorList=TensorList,
            sgd_step=sgd_step,
            adamw_step=adamw_step,
            check_finite=check_finite,
            zero_=zero_,
            scale_=scale_,
            write_scalars=write_scalars,
            advance_step=advance_step,
        ),
        master_dtype=np.float64,
        storage={"fp32": np.float64, "tf32": np.float64},
        needs_gpu=False,
    )


# ----------------------------------------------------------------------------------------------- bf16 helpers


def bf16_bits_to_float(u16) -> np.ndarray:
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float_to_bf16_bits(x) -> np.ndarray:
    """Round-to-nearest-even float32 -> bf16 bit patterns (uint16); NaN stays NaN."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    out[nan] = 0x7FC0
    return out


def rel_err(a, b) -> float:
    """Norm-wise relative error of a against the reference b."""
    a, b = _f64(a), _f64(b)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# =============================================================================================== self-tests


def _direct_conv_nchw(x, w, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    p = (h + 2 * pad - dil * (r - 1) - 1) // stride + 1
    q = (wd + 2 * pad - dil * (s - 1) - 1) // stride + 1
    kg = k // groups
    y = np.zeros((n, k, p, q))
    for ni in range(n):
        for ki in range(k):
            g = ki // kg
            for pi in range(p):
                for qi in range(q):
                    acc = 0.0
                    for ci in range(cg):
                        for ri in range(r):
                            for si in range(s):
                                hh, ww = pi * stride - pad + ri * dil, qi * stride - pad + si * dil
                                if 0 <= hh < h and 0 <= ww < wd:
                                    acc += x[ni, g * cg + ci, hh, ww] * w[ki, ci, ri, si]
                    y[ni, ki, pi, qi] = acc
    return y


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride,pad,dil,groups", [(1, 1, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1), (2, 0, 1, 1)])
def test_conv_reference_matches_direct_loops_and_is_adjoint(rng, layout, stride, pad, dil, groups):
    x = rng.standard_normal((2, 4, 7, 6))
    w = rng.standard_normal((6, 4 // groups, 3, 3))
    spec = ConvSpec(
        stride=(stride, stride), padding=(pad, pad), dilation=(dil, dil), groups=groups, layout=layout
    )
    xl, wl = _from_nchw(x, layout), _filter_from_kcrs(w, layout)
    y = conv2d(xl, wl, spec)
    np.testing.assert_allclose(
        _to_nchw(y, layout), _direct_conv_nchw(x, w, stride, pad, dil, groups), atol=1e-12
    )
    assert y.shape == conv_output_shape(xl.shape, wl.shape, spec)
    dy = rng.standard_normal(y.shape)
    dx = conv2d_backward_data(dy, wl, spec, xl.shape)
    dw = conv2d_backward_filter(xl, dy, spec, wl.shape)
    inner = np.sum(y * dy)
    assert np.isclose(inner, np.sum(xl * dx), rtol=1e-12) and np.isclose(inner, np.sum(wl * dw), rtol=1e-12)


def _numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        up = f()
        x[idx] = old - eps
        down = f()
        x[idx] = old
        g[idx] = (up - down) / (2 * eps)
    return g


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("relu,with_z", [(False, False), (True, False), (True, True)])
def test_batch_norm_reference_backward_matches_finite_differences(rng, layout, relu, with_z):
    shape = (3, 2, 3, 4) if layout == "NCHW" else (3, 3, 4, 2)
    x, z, dy = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape)
    gamma, beta = rng.standard_normal(2), rng.standard_normal(2)

    def loss():
        y, *_ = batch_norm_train(
            x, gamma, beta, np.zeros(2), np.ones(2), layout=layout, z=z if with_z else None, relu=relu
        )
        return float(np.sum(y * dy))

    y, mean, invstd, _ = batch_norm_train(
        x, gamma, beta, np.zeros(2), np.ones(2), layout=layout, z=z if with_z else None, relu=relu
    )
    dx, dg, db, dz = batch_norm_backward(
        x, dy, gamma, beta, mean, invstd, layout=layout, y=y, relu=relu, has_z=with_z
    )
    np.testing.assert_allclose(dx, _numeric_grad(loss, x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dg, _numeric_grad(loss, gamma), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(db, _numeric_grad(loss, beta), rtol=1e-5, atol=1e-7)
    if with_z:
        np.testing.assert_allclose(dz, _numeric_grad(loss, z), rtol=1e-5, atol=1e-7)


def test_batch_norm_reference_running_stats_follow_pytorch(rng):
    x = rng.standard_normal((4, 3, 2, 2)) * 3 + 1
    rm, rv = np.full(3, 0.5), np.full(3, 2.0)
    batch_norm_train(x, np.ones(3), np.zeros(3), rm, rv, layout="NCHW", momentum=0.25)
    mean, var_unbiased = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(rm, 0.75 * 0.5 + 0.25 * mean)
    np.testing.assert_allclose(rv, 0.75 * 2.0 + 0.25 * var_unbiased)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool_references_backward_match_finite_differences(rng, layout):
    shape = (2, 3, 5, 6) if layout == "NCHW" else (2, 5, 6, 3)
    x = rng.standard_normal(shape)
    y = max_pool2d(x, kernel=3, stride=2, padding=1, layout=layout)
    assert y.shape == ((2, 3, 3, 3) if layout == "NCHW" else (2, 3, 3, 3))
    dy = rng.standard_normal(y.shape)
    dx = max_pool2d_backward(dy, x, y, kernel=3, stride=2, padding=1, layout=layout)
    np.testing.assert_allclose(
        dx,
        _numeric_grad(
            lambda: float(np.sum(max_pool2d(x, kernel=3, stride=2, padding=1, layout=layout) * dy)), x
        ),
        rtol=1e-6,
        atol=1e-8,
    )
    g = global_avg_pool(x, layout=layout)
    dg = rng.standard_normal(g.shape)
    assert np.isclose(np.sum(g * dg), np.sum(x * global_avg_pool_backward(dg, x.shape, layout=layout)))


def test_optimizer_references_follow_pytorch_formulas(rng):
    p0, g = rng.standard_normal(5), rng.standard_normal(5)
    p, buf = p0.copy(), np.zeros(5)
    sgd_step(
        TensorList([p]),
        TensorList([g]),
        TensorList([buf]),
        lr=0.1,
        momentum=0.9,
        weight_decay=0.01,
        nesterov=True,
    )
    d = g + 0.01 * p0
    np.testing.assert_allclose(p, p0 - 0.1 * (d + 0.9 * d))
    p, m, v = p0.copy(), np.zeros(5), np.zeros(5)
    adamw_step(
        TensorList([p]), TensorList([g]), TensorList([m]), TensorList([v]), lr=0.1, weight_decay=0.1, step=1
    )
    # Step 1 of Adam moves every coordinate by lr * sign(g) (up to eps), after the decoupled decay.
    np.testing.assert_allclose(p, p0 * (1 - 0.01) - 0.1 * np.sign(g), rtol=1e-6)
    found = np.zeros(1, np.int32)
    check_finite(TensorList([g, np.array([1.0, np.inf])]), found)
    assert found[0] == 1
    before = p.copy()
    sgd_step(TensorList([p]), TensorList([g]), TensorList([buf]), lr=0.1, found_inf=found)
    np.testing.assert_array_equal(p, before)


def test_bf16_helpers_round_to_nearest_even():
    x = np.array([1.0, -2.5, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, np.nan], dtype=np.float32)
    bits = float_to_bf16_bits(x)
    back = bf16_bits_to_float(bits)
    np.testing.assert_array_equal(back[:4], [1.0, -2.5, 1.0, 1.0 + 4 * 2.0**-8])
    assert np.isnan(back[4])
