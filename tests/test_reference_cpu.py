"""The float64 NumPy references (resnet_native.reference) checked on their own: convolutions against direct loops and
adjoint identities, batch norm and pooling against finite differences, the optimizer steps against PyTorch's
formulas, bf16 rounding, the argument checks that matter for a graph's wiring, and that every native op function
hands NumPy arrays to its reference (the host path of the whole graph)."""

import numpy as np
import pytest

from resnet_native import reference
from resnet_native.ops import conv, kernels, multi_tensor, norm, pool
from resnet_native.ops.conv import ConvSpec
from resnet_native.reference import bf16
from resnet_native.reference.multi_tensor import TensorList

R = reference


def _from_nchw(a, layout):
    return a if layout == "NCHW" else np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def _to_nchw(a, layout):
    return a if layout == "NCHW" else a.transpose(0, 3, 1, 2)


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


# ----------------------------------------------------------------------------------------------- convolution


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _direct_conv_nchw(x, w, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(pad), _pair(dil)
    p = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1
    q = (wd + 2 * pw - dw * (s - 1) - 1) // sw + 1
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
                                hh, ww = pi * sh - ph + ri * dh, qi * sw - pw + si * dw
                                if 0 <= hh < h and 0 <= ww < wd:
                                    acc += x[ni, g * cg + ci, hh, ww] * w[ki, ci, ri, si]
                    y[ni, ki, pi, qi] = acc
    return y


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride,pad,dil,groups,rs", [(1, 1, 1, 1, (3, 3)), (2, 1, 1, 2, (3, 3)), (1, 2, 2, 1, (3, 3)),
                                                      (2, 0, 1, 1, (3, 3)), ((2, 1), (1, 2), (2, 1), 2, (3, 2))])
def test_conv_reference_matches_direct_loops_and_is_adjoint(rng, layout, stride, pad, dil, groups, rs):
    x = rng.standard_normal((2, 4, 7, 6))
    w = rng.standard_normal((6, 4 // groups, *rs))
    spec = ConvSpec(stride=stride, padding=pad, dilation=dil, groups=groups, layout=layout)
    xl, wl = _from_nchw(x, layout), _from_nchw(w, layout)
    y = R.conv.conv2d(xl, wl, spec)
    np.testing.assert_allclose(_to_nchw(y, layout), _direct_conv_nchw(x, w, stride, pad, dil, groups), atol=1e-12)
    assert y.shape == R.conv.conv_output_shape(xl.shape, wl.shape, spec) == conv.conv_output_shape(xl.shape,
                                                                                                    wl.shape, spec)
    dy = rng.standard_normal(y.shape)
    dx = R.conv.conv2d_backward_data(dy, wl, spec, xl.shape)
    dw = R.conv.conv2d_backward_filter(xl, dy, spec, wl.shape)
    inner = np.sum(y * dy)
    assert np.isclose(inner, np.sum(xl * dx), rtol=1e-12) and np.isclose(inner, np.sum(wl * dw), rtol=1e-12)
    before = rng.standard_normal(wl.shape)
    accumulated = R.conv.conv2d_backward_filter(xl, dy, spec, wl.shape, out=before.copy(), accumulate=True)
    np.testing.assert_allclose(accumulated, before + dw, rtol=1e-12)
    before = rng.standard_normal(xl.shape)
    accumulated = R.conv.conv2d_backward_data(dy, wl, spec, xl.shape, out=before.copy(), accumulate=True)
    np.testing.assert_allclose(accumulated, before + dx, rtol=1e-12)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_reference_backward_bias_is_the_adjoint_of_the_bias(rng, layout):
    spec = ConvSpec(padding=1, layout=layout)
    x, w = _from_nchw(rng.standard_normal((2, 3, 5, 6)), layout), _from_nchw(rng.standard_normal((4, 3, 3, 3)), layout)
    bias, dy = rng.standard_normal(4), _from_nchw(rng.standard_normal((2, 4, 5, 6)), layout)
    # <conv(x) + bias, dy> - <conv(x), dy> = <bias, db>
    inner = np.sum((R.conv.conv2d(x, w, spec, bias=bias) - R.conv.conv2d(x, w, spec)) * dy)
    db = R.conv.conv2d_backward_bias(dy, layout)
    assert db.shape == (4,) and np.isclose(inner, bias @ db, rtol=1e-12)
    out = np.full(4, np.nan)
    assert R.conv.conv2d_backward_bias(dy, layout, out=out) is out
    np.testing.assert_array_equal(out, db)
    half = R.to_storage(dy, "fp16")
    np.testing.assert_array_equal(R.conv.conv2d_backward_bias(half, layout),
                                  R.from_storage(half).sum(axis=(0, 2, 3) if layout == "NCHW" else (0, 1, 2))
                                  .astype(np.float16))
    with pytest.raises(ValueError, match="dy: expected a 4-D"):
        R.conv.conv2d_backward_bias(dy[0], layout)


def test_conv_reference_epilogue(rng):
    spec = ConvSpec(padding=1, layout="NHWC")
    x, w = rng.standard_normal((2, 5, 5, 3)), rng.standard_normal((4, 3, 3, 3))
    bias, z = rng.standard_normal(4), rng.standard_normal((2, 5, 5, 4))
    plain = R.conv.conv2d(x, w, spec)
    y = R.conv.conv2d(x, w, spec, bias=bias, z=z, activation="relu", alpha1=0.5, alpha2=2.0)
    np.testing.assert_allclose(y, np.maximum(0.5 * plain + 2.0 * z + bias, 0.0), rtol=1e-12)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("geometry", [dict(), dict(stride=2, padding=1), dict(stride=(2, 1), padding=(0, 2),
                                                                              dilation=(1, 2)), dict(groups=3)])
def test_conv_output_shape_agrees_with_the_native_one(layout, geometry):
    spec = ConvSpec(layout=layout, **geometry)
    problems = [((2, 6, 9, 11), (12, 6 // spec.groups, 3, 3)), ((1, 3, 4, 4), (3, 3 // spec.groups, 1, 1))]
    for x_shape, w_shape in problems:
        xs, ws = (_from_nchw(np.empty(s), layout).shape for s in (x_shape, w_shape))
        assert R.conv.conv_output_shape(xs, ws, spec) == conv.conv_output_shape(xs, ws, spec)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda x, w: R.conv.conv2d(x, w[:, :2], ConvSpec()), ValueError, "input channels per group"),
        (lambda x, w: R.conv.conv2d(x[:, :2], w[:3, :1], ConvSpec(groups=2)), ValueError, "K=3"),
        (lambda x, w: R.conv.conv2d(x[:, :, :2, :2], w, ConvSpec()), ValueError, "smaller"),
        (lambda x, w: R.conv.conv2d(x, w, ConvSpec(), out=np.zeros((2, 4, 6, 7))), ValueError, "out: expected shape"),
        (lambda x, w: R.conv.conv2d(x, w, ConvSpec(), out=np.zeros((2, 4, 6, 6), np.float32)), TypeError, "out"),
        (lambda x, w: R.conv.conv2d(x, w.astype(np.float32), ConvSpec()), TypeError, r"w: expected a float64 array"),
        (lambda x, w: R.conv.conv2d(x, w, ConvSpec(precision="fp16")), TypeError, "precision 'fp16'"),
        (lambda x, w: R.conv.conv2d(x, object(), ConvSpec()), TypeError, "w: expected a NumPy array"),
        (lambda x, w: R.conv.conv2d(x, w, ConvSpec(), bias=np.zeros(3)), ValueError, "bias"),
        (lambda x, w: R.conv.conv2d(x, w, ConvSpec(), z=np.zeros((2, 4, 6, 5))), ValueError, "z"),
        (lambda x, w: R.conv.conv2d(x, w, ConvSpec(), activation="gelu"), ValueError, "activation"),
        (lambda x, w: R.conv.conv2d(x, w, "NCHW"), TypeError, "spec"),
        (lambda x, w: R.conv.conv2d(x[0], w, ConvSpec()), ValueError, "x: expected a 4-D"),
        (lambda x, w: R.conv.conv2d_backward_data(np.zeros((2, 4, 6, 5)), w, ConvSpec(), x.shape), ValueError, "dy"),
        (lambda x, w: R.conv.conv2d_backward_data(np.zeros((2, 4, 6, 6)), w, ConvSpec(), (2, 3, 8)), ValueError,
         "x_shape"),
        (lambda x, w: R.conv.conv2d_backward_filter(x, np.zeros((2, 4, 6, 6)), ConvSpec(), w.shape, accumulate=True),
         ValueError, "accumulate"),
        (lambda x, w: R.conv.conv2d_backward_filter(x, np.zeros((2, 5, 6, 6)), ConvSpec(), w.shape), ValueError,
         "dy"),
    ],
)
def test_conv_reference_checks_what_the_native_ops_check(rng, call, error, match):
    x, w = rng.standard_normal((2, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3))
    with pytest.raises(error, match=match):
        call(x, w)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_conv_reference_reads_and_rounds_the_storage_dtype(rng, precision):
    spec = ConvSpec(padding=1, precision=precision)
    x, w = (R.to_storage(rng.standard_normal(s), precision) for s in ((2, 3, 5, 5), (4, 3, 3, 3)))
    y = R.conv.conv2d(x, w, spec)
    assert y.dtype == x.dtype
    exact = R.conv.conv2d(R.from_storage(x), R.from_storage(w), ConvSpec(padding=1))
    np.testing.assert_array_equal(y, R.to_storage(exact, precision))


# ----------------------------------------------------------------------------------------------- batch norm


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("relu,with_z", [(False, False), (True, False), (True, True)])
def test_batch_norm_reference_backward_matches_finite_differences(rng, layout, relu, with_z):
    shape = (3, 2, 3, 4) if layout == "NCHW" else (3, 3, 4, 2)
    x, z, dy = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape)
    gamma, beta = rng.standard_normal(2), rng.standard_normal(2)

    def loss():
        y, *_ = R.norm.batch_norm_train(x, gamma, beta, np.zeros(2), np.ones(2), layout=layout,
                                        z=z if with_z else None, relu=relu)
        return float(np.sum(y * dy))

    y, mean, invstd, reserve = R.norm.batch_norm_train(x, gamma, beta, np.zeros(2), np.ones(2), layout=layout,
                                                       z=z if with_z else None, relu=relu)
    assert reserve is None  # the reference keeps no reserve space
    dx, dg, db, dz = R.norm.batch_norm_backward(x, dy, gamma, beta, mean, invstd, layout=layout, y=y, relu=relu,
                                                has_z=with_z)
    np.testing.assert_allclose(dx, _numeric_grad(loss, x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dg, _numeric_grad(loss, gamma), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(db, _numeric_grad(loss, beta), rtol=1e-5, atol=1e-7)
    if with_z:
        np.testing.assert_allclose(dz, _numeric_grad(loss, z), rtol=1e-5, atol=1e-7)
    else:
        assert dz is None


def test_batch_norm_reference_running_stats_follow_pytorch(rng):
    x = rng.standard_normal((4, 3, 2, 2)) * 3 + 1
    rm, rv = np.full(3, 0.5), np.full(3, 2.0)
    R.norm.batch_norm_train(x, np.ones(3), np.zeros(3), rm, rv, layout="NCHW", momentum=0.25)
    mean, var_unbiased = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(rm, 0.75 * 0.5 + 0.25 * mean)
    np.testing.assert_allclose(rv, 0.75 * 2.0 + 0.25 * var_unbiased)
    y = R.norm.batch_norm_infer(x, np.full(3, 2.0), np.ones(3), rm, rv, layout="NCHW", eps=0.0)
    expect = 2.0 * (x - rm.reshape(1, 3, 1, 1)) / np.sqrt(rv.reshape(1, 3, 1, 1)) + 1.0
    np.testing.assert_allclose(y, expect, rtol=1e-12)


def test_batch_norm_reference_checks(rng):
    x, c = rng.standard_normal((2, 3, 4, 4)), np.ones(3)
    with pytest.raises(ValueError, match="gamma"):
        R.norm.batch_norm_train(x, np.ones(4), c, c.copy(), c.copy(), layout="NCHW")
    with pytest.raises(ValueError, match="layout"):
        R.norm.batch_norm_infer(x, c, c, c, c, layout="CHWN")
    with pytest.raises(ValueError, match="z and x must have the same shape"):
        R.norm.batch_norm_infer(x, c, c, c, c, layout="NCHW", z=x[:1])
    with pytest.raises(ValueError, match="y: the forward output"):
        R.norm.batch_norm_backward(x, x, c, c, c, c, layout="NCHW", relu=True)
    with pytest.raises(ValueError, match="accumulate"):
        R.norm.batch_norm_backward(x, x, c, c, c, c, layout="NCHW", accumulate=True)
    with pytest.raises(TypeError, match="x: expected a NumPy array"):
        R.norm.batch_norm_infer([[1.0]], c, c, c, c, layout="NCHW")


# ----------------------------------------------------------------------------------------------- pooling


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool_references_backward_match_finite_differences(rng, layout):
    shape = (2, 3, 5, 6) if layout == "NCHW" else (2, 5, 6, 3)
    x = rng.standard_normal(shape)
    window = dict(kernel=3, stride=2, padding=1, layout=layout)
    y = R.pool.max_pool2d(x, **window)
    assert y.shape == (2, 3, 3, 3) == R.pool.max_pool2d_output_shape(shape, **window)
    assert y.shape == pool.max_pool2d_output_shape(shape, **window)  # the native arithmetic agrees
    dy = rng.standard_normal(y.shape)
    dx = R.pool.max_pool2d_backward(dy, x, y, **window)
    np.testing.assert_allclose(dx, _numeric_grad(lambda: float(np.sum(R.pool.max_pool2d(x, **window) * dy)), x),
                               rtol=1e-6, atol=1e-8)
    g = R.pool.global_avg_pool(x, layout=layout)
    dg = rng.standard_normal(g.shape)
    assert np.isclose(np.sum(g * dg), np.sum(x * R.pool.global_avg_pool_backward(dg, x.shape, layout=layout)))
    with pytest.raises(ValueError, match="dy"):
        R.pool.global_avg_pool_backward(dg[:, :2], x.shape, layout=layout)


def test_max_pool_reference_gives_ties_to_the_first_maximum():
    x = np.zeros((1, 1, 2, 2))
    dx = R.pool.max_pool2d_backward(np.ones((1, 1, 1, 1)), x, np.zeros((1, 1, 1, 1)), kernel=2, layout="NCHW")
    np.testing.assert_array_equal(dx, [[[[1.0, 0.0], [0.0, 0.0]]]])


# ----------------------------------------------------------------------------------------------- elementwise, cast


def test_elementwise_references_follow_the_native_nan_rules():
    x = np.array([-1.0, 0.0, 2.0, np.nan])
    np.testing.assert_array_equal(R.kernels.relu(x), [0.0, 0.0, 2.0, np.nan])
    dy = np.ones(4)
    np.testing.assert_array_equal(R.kernels.relu_backward(dy, R.kernels.relu(x)), [0.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(R.kernels.add_relu(x, x), [0.0, 0.0, 4.0, np.nan])
    out = x.copy()
    assert R.kernels.add(out, x, out=out) is out  # in place, as the native kernels allow
    np.testing.assert_array_equal(out, 2 * x)


def test_elementwise_references_check_shapes_and_dtypes():
    a = np.ones((2, 3))
    with pytest.raises(ValueError, match="b and a must have the same shape"):
        R.kernels.add(a, a.T)
    with pytest.raises(TypeError, match="b: expected a float64 array"):
        R.kernels.add(a, a.astype(np.float16))
    with pytest.raises(ValueError, match="out: expected shape"):
        R.kernels.relu(a, out=np.ones(6))
    with pytest.raises(TypeError, match="dtype='bf16'"):
        R.kernels.relu(np.ones(3, np.uint16))
    with pytest.raises(ValueError, match="dtype: expected one of"):
        R.kernels.relu(a, dtype="int8")


def test_cast_reference_rounds_to_nearest_even():
    x = np.array([1.0, -2.5, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 65504.0 * 2])
    bits = R.kernels.cast(x, np.empty(5, np.uint16))
    np.testing.assert_array_equal(bits, [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x4800])  # 131008 rounds up to 2**17
    half = R.kernels.cast(bits, np.empty(5, np.float16))  # uint16 is bf16 for cast
    np.testing.assert_array_equal(half[:4], np.float16([1.0, -2.5, 1.0, 1.0 + 2**-6]))
    assert np.isinf(half[4])  # bf16 131072 overflows fp16
    with pytest.raises(ValueError, match="out and x must have the same shape"):
        R.kernels.cast(x, np.empty(4, np.float32))


def test_bf16_ties_go_to_the_even_neighbour():
    a = np.array([1.0, 1.0 + 2**-8, 1.0 + 2**-7 + 2**-8, 1.0 + 2**-7 + 2**-9, -2.5], dtype=np.float32)
    assert bf16.to_bf16_bits(a).tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020]
    assert bf16.from_bf16_bits(bf16.to_bf16_bits(a)).tolist() == [1.0, 1.0, 1.0 + 2**-6, 1.0 + 2**-7, -2.5]


def test_bf16_rounds_to_nearest_even_and_keeps_nan():
    x = np.array([1.0, -2.5, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, np.nan, np.inf], dtype=np.float32)
    bits = bf16.to_bf16_bits(x)
    back = bf16.from_bf16_bits(bits)
    np.testing.assert_array_equal(back[[0, 1, 2, 3, 5]], [1.0, -2.5, 1.0, 1.0 + 4 * 2.0**-8, np.inf])
    assert np.isnan(back[4]) and bits.dtype == np.uint16


def test_storage_helpers_round_trip():
    values = np.array([0.1, -3.0, 1e-3])
    for precision, dtype in (("fp32", np.float32), ("tf32", np.float32), ("fp16", np.float16), ("bf16", np.uint16)):
        stored = R.to_storage(values, precision)
        assert stored.dtype == dtype
        assert R.relative_error(R.from_storage(stored), values) < 1e-2
    assert R.relative_error(values, values) == 0.0 and np.isnan(R.relative_error([np.nan], [1.0]))
    with pytest.raises(ValueError, match="precision"):
        R.to_storage(values, "fp64")


# ----------------------------------------------------------------------------------------------- optimizers


def test_optimizer_references_follow_pytorch_formulas(rng):
    p0, g = rng.standard_normal(5), rng.standard_normal(5)
    p, buf = p0.copy(), np.zeros(5)
    R.multi_tensor.sgd_step(TensorList([p]), TensorList([g]), TensorList([buf]), lr=0.1, momentum=0.9,
                            weight_decay=0.01, nesterov=True)
    d = g + 0.01 * p0
    np.testing.assert_allclose(p, p0 - 0.1 * (d + 0.9 * d))
    p, m, v = p0.copy(), np.zeros(5), np.zeros(5)
    R.multi_tensor.adamw_step(TensorList([p]), TensorList([g]), TensorList([m]), TensorList([v]), lr=0.1,
                              weight_decay=0.1, step=np.array([1.0]))
    # Step 1 of Adam moves every coordinate by lr * sign(g) (up to eps), after the decoupled decay.
    np.testing.assert_allclose(p, p0 * (1 - 0.01) - 0.1 * np.sign(g), rtol=1e-6)
    found = np.zeros(1, np.int32)
    R.multi_tensor.check_finite(TensorList([g, np.array([1.0, np.inf])]), found)
    assert found[0] == 1
    before = p.copy()
    R.multi_tensor.sgd_step(TensorList([p]), TensorList([g]), TensorList([buf]), lr=0.1, found_inf=found)
    np.testing.assert_array_equal(p, before)
    step = np.zeros(1)
    R.multi_tensor.advance_step(step, found)
    R.multi_tensor.advance_step(step)
    assert step[0] == 1.0


def test_sgd_reference_momentum_zero_skips_the_buffers_and_copies_round(rng):
    p0, g = rng.standard_normal(6), rng.standard_normal(6)
    p, buf, copy = p0.copy(), np.full(6, 7.0), np.zeros(6, np.uint16)
    R.multi_tensor.sgd_step(TensorList([p]), TensorList([g.astype(np.float16)]), TensorList([buf]), lr=0.5,
                            momentum=0.0, dampening=0.5, inv_scale=np.array([0.5]),
                            model_copies=TensorList([copy], dtype="bf16"))
    np.testing.assert_allclose(p, p0 - 0.5 * 0.5 * g.astype(np.float16), rtol=1e-12)
    np.testing.assert_array_equal(buf, np.full(6, 7.0))  # untouched, as the kernel skips them for momentum 0
    np.testing.assert_array_equal(copy, bf16.to_bf16_bits(p))


def test_multi_tensor_references_check_their_arguments():
    a = TensorList([np.zeros(3)])
    with pytest.raises(ValueError, match="grads: expected 1 tensors of the sizes"):
        R.multi_tensor.sgd_step(a, TensorList([np.zeros(4)]), None, lr=0.1, momentum=0.0)
    with pytest.raises(ValueError, match="nesterov"):
        R.multi_tensor.sgd_step(a, a, a, lr=0.1, momentum=0.0, nesterov=True)
    with pytest.raises(ValueError, match="beta2"):
        R.multi_tensor.adamw_step(a, a, a, a, lr=0.1, beta2=1.0, step=1)
    with pytest.raises(ValueError, match="step"):
        R.multi_tensor.adamw_step(a, a, a, a, lr=0.1, step=0)
    with pytest.raises(TypeError, match="found_inf"):
        R.multi_tensor.check_finite(a, np.zeros(1, np.int64))
    with pytest.raises(TypeError, match="dtype='bf16'"):
        TensorList([np.zeros(2, np.uint16)])
    with pytest.raises(ValueError, match="dst"):
        R.multi_tensor.write_scalars(np.zeros(3), (1.0, 2.0))


# ----------------------------------------------------------------------------------------------- dispatch


def _over_lists(call):
    """A case that runs `call(ops, lists)` on fresh single-tensor TensorLists of the same values, giving them all."""
    values = [np.random.default_rng(i).uniform(0.5, 2.0, 3) for i in range(4)]  # positive: AdamW's exp_avg_sq

    def run(m):
        lists = [TensorList([v.copy()]) for v in values]
        call(m, lists)
        return np.concatenate([t[0] for t in lists])

    return run


def _written_scalars(m):
    dst = np.zeros(2)
    m.multi_tensor.write_scalars(dst, (1.5, 2.5))
    return dst


def _advanced_step(m):
    step = np.ones(1)
    m.multi_tensor.advance_step(step)
    return step


def _dispatch_cases():
    """(name, call(ops)) for every native op function that hands NumPy arrays to its reference: `ops` is either the
    native modules or resnet_native.reference, and both must give the same result."""
    rng = np.random.default_rng(0)
    spec = ConvSpec(padding=1, layout="NHWC")
    x, w, dy = rng.standard_normal((2, 5, 5, 3)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal((2, 5, 5, 4))
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    gamma_beta, stats = (np.ones(4), np.zeros(4)), (dy.mean(axis=(0, 1, 2)), 1 / dy.std(axis=(0, 1, 2)))
    window = dict(kernel=3, stride=2, padding=1, layout="NHWC")
    pooled = R.pool.max_pool2d(dy, **window)

    def running():
        return np.zeros(4), np.ones(4)

    return [
        ("conv2d", lambda m: m.conv.conv2d(x, w, spec, activation="relu", alpha1=0.5)),
        ("conv2d_backward_data", lambda m: m.conv.conv2d_backward_data(dy, w, spec, x.shape)),
        ("conv2d_backward_filter", lambda m: m.conv.conv2d_backward_filter(x, dy, spec, w.shape)),
        ("conv2d_backward_bias", lambda m: m.conv.conv2d_backward_bias(dy, "NHWC")),
        ("batch_norm_train", lambda m: m.norm.batch_norm_train(dy, *gamma_beta, *running(), layout="NHWC",
                                                               relu=True)[0]),
        ("batch_norm_infer", lambda m: m.norm.batch_norm_infer(dy, *gamma_beta, *running(), layout="NHWC", z=dy)),
        ("batch_norm_backward", lambda m: m.norm.batch_norm_backward(dy, dy, *gamma_beta, *stats, layout="NHWC")[0]),
        ("max_pool2d", lambda m: m.pool.max_pool2d(dy, **window)),
        ("max_pool2d_backward", lambda m: m.pool.max_pool2d_backward(np.ones_like(pooled), dy, pooled, **window)),
        ("global_avg_pool", lambda m: m.pool.global_avg_pool(dy, layout="NHWC")),
        ("global_avg_pool_backward", lambda m: m.pool.global_avg_pool_backward(a[:2], (2, 5, 5, 4), layout="NHWC")),
        ("add", lambda m: m.kernels.add(a, b)),
        ("add_relu", lambda m: m.kernels.add_relu(a, b)),
        ("relu", lambda m: m.kernels.relu(a)),
        ("relu_backward", lambda m: m.kernels.relu_backward(a, b)),
        ("add_relu_backward", lambda m: m.kernels.add_relu_backward(a, b)),
        ("cast", lambda m: m.kernels.cast(a, np.empty(a.shape, np.uint16))),
        ("sgd_step", _over_lists(lambda m, t: m.multi_tensor.sgd_step(*t[:3], lr=0.1, nesterov=True,
                                                                      weight_decay=0.1))),
        ("adamw_step", _over_lists(lambda m, t: m.multi_tensor.adamw_step(*t, lr=0.1, step=2))),
        ("zero_", _over_lists(lambda m, t: m.multi_tensor.zero_(t[0]))),
        ("scale_", _over_lists(lambda m, t: m.multi_tensor.scale_(t[0], 3.0))),
        ("check_finite", _over_lists(lambda m, t: m.multi_tensor.check_finite(t[0], np.zeros(1, np.int32)))),
        ("write_scalars", _written_scalars),
        ("advance_step", _advanced_step),
    ]


NATIVE = type("NativeOps", (), dict(conv=conv, norm=norm, pool=pool, kernels=kernels, multi_tensor=multi_tensor))


@pytest.mark.parametrize("name,call", _dispatch_cases(), ids=[case[0] for case in _dispatch_cases()])
def test_native_op_functions_hand_numpy_arrays_to_their_reference(name, call):
    got, want = call(NATIVE), call(R)
    assert isinstance(got, np.ndarray), name
    np.testing.assert_array_equal(got, want)
