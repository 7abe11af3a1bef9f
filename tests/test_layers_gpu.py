"""GPU tests of each layer's forward and backward against the float64 NumPy references (resnet_native.reference).

Inputs are fresh random data rounded to the storage dtype; the references run in float64 on exactly those
values. Layer buffers start as NaN (BufferCache), so an element an op fails to write makes the norm-wise error
NaN and the test fail. Tolerances (norm-wise relative): fp32 1e-5, tf32 1e-3, fp16/bf16 1e-2.
"""

import cupy as cp
import numpy as np
import pytest

import resnet_native as rn
from resnet_native import reference as ref
from resnet_native.conv import ConvSpec
from resnet_native.layers import (
    Add,
    BatchNorm2d,
    Conv2d,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReLU,
    SoftmaxCrossEntropy,
)

pytestmark = pytest.mark.gpu

TOL = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}


def to_device(values, precision):
    """(device array in the storage dtype of `precision`, the float64 values it holds)."""
    stored = np.ascontiguousarray(ref.to_storage(values, precision))
    return cp.asarray(stored), ref.from_storage(stored)


def host(array):
    """float64 NumPy copy of a device array (bf16 bits decoded)."""
    return ref.from_storage(cp.asnumpy(array))


def act_shape(layout, n, c, h, w):
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def check(name, actual, expected, tol):
    err = ref.relative_error(host(actual), expected)
    assert err <= tol, f"{name}: relative error {err:.3g} > {tol:g}"


# ------------------------------------------------------------------------------------------------ Conv2d


@pytest.mark.parametrize(
    "layout,precision",
    [("NCHW", "fp32"), ("NHWC", "fp32"), ("NCHW", "tf32"), ("NHWC", "fp16"), ("NHWC", "bf16")],
)
def test_conv2d(rng, layout, precision):
    conv = Conv2d(8, 16, 3, stride=2, padding=1, layout=layout, precision=precision, rng=rng).cuda()
    x, x64 = to_device(rng.standard_normal(act_shape(layout, 4, 8, 9, 9)), precision)
    y = conv.forward(x, train=True)
    w = conv.weight.low if precision in ("fp16", "bf16") else conv.weight.data
    assert w.dtype == x.dtype
    w64 = host(w)
    spec = ConvSpec(stride=2, padding=1, layout=layout)  # the float64 reference's: fp32 math on the stored values
    tol = TOL[precision]
    assert y.shape == act_shape(layout, 4, 16, 5, 5) and y.dtype == x.dtype
    check("y", y, ref.conv.conv2d(x64, w64, spec), tol)
    dy, dy64 = to_device(rng.standard_normal(y.shape), precision)
    dx = conv.backward(dy)
    assert dx.shape == x.shape and dx.dtype == x.dtype
    check("dx", dx, ref.conv.conv2d_backward_data(dy64, w64, spec, x.shape), tol)
    dw = ref.conv.conv2d_backward_filter(x64, dy64, spec, conv.weight.shape)
    assert conv.weight.grad.dtype == np.float32
    check("weight.grad", conv.weight.grad, dw, tol)
    conv.forward(x, train=True)
    conv.backward(dy)
    check("weight.grad after two backward passes", conv.weight.grad, 2 * dw, tol)


def test_conv2d_stem_and_state_dict_layout(rng):
    conv = Conv2d(3, 8, 3, padding=1, layout="NHWC", needs_input_grad=False, rng=rng).cuda()
    x, _ = to_device(rng.standard_normal((2, 6, 6, 3)), "fp32")
    y = conv.forward(x, train=True)
    assert conv.backward(cp.ones_like(y)) is None
    torch_w = conv.state_dict()["weight"]
    assert torch_w.shape == (8, 3, 3, 3)
    np.testing.assert_array_equal(torch_w, cp.asnumpy(conv.weight.data).transpose(0, 3, 1, 2))


# ------------------------------------------------------------------------------------------------ BatchNorm2d


@pytest.mark.parametrize(
    "layout,precision,relu,residual",
    [
        ("NCHW", "fp32", False, False),
        ("NHWC", "fp32", True, False),
        ("NCHW", "fp32", True, True),
        ("NHWC", "fp32", True, True),
        ("NHWC", "fp16", False, False),
        ("NHWC", "fp16", True, True),
        ("NHWC", "bf16", True, True),
    ],
)
def test_batchnorm2d(rng, layout, precision, relu, residual):
    c = 32
    bn = BatchNorm2d(c, layout=layout, relu=relu, residual=residual, momentum=0.2)
    gamma, beta = (
        rng.uniform(0.5, 1.5, c).astype(np.float32),
        (0.1 * rng.standard_normal(c)).astype(np.float32),
    )
    bn.load_state_dict({**bn.state_dict(), "weight": gamma, "bias": beta})
    bn.cuda()
    shape = act_shape(layout, 4, c, 6, 5)
    x, x64 = to_device(2 * rng.standard_normal(shape) + 0.5, precision)
    z, z64 = to_device(rng.standard_normal(shape), precision) if residual else (None, None)
    y = bn.forward(x, train=True, z=z)
    if layout == "NHWC" and precision == "fp16" and relu:
        assert rn.norm.last_path()["fused"], rn.norm.last_path()  # cuDNN's fused BN (+add) + ReLU kernel ran
    tol = TOL[precision]
    rm, rv = np.zeros(c), np.ones(c)
    y_ref, mean, invstd, _ = ref.norm.batch_norm_train(
        x64, gamma, beta, rm, rv, layout=layout, momentum=0.2, z=z64, relu=relu
    )
    check("y", y, y_ref, tol)
    check("running_mean", bn.running_mean, rm, 1e-4)
    check("running_var", bn.running_var, rv, 1e-4)
    assert bn.num_batches_tracked == 1
    dy, dy64 = to_device(rng.standard_normal(shape), precision)
    out = bn.backward(dy)
    dx, dz = out if residual else (out, None)
    # The ReLU mask is taken from the device's own output, as the layer does.
    dx_ref, dg_ref, db_ref, dz_ref = ref.norm.batch_norm_backward(
        x64, dy64, gamma, beta, mean, invstd, layout=layout, y=host(y), relu=relu, has_z=residual
    )
    check("dx", dx, dx_ref, tol)
    check("weight.grad", bn.weight.grad, dg_ref, max(tol, 1e-5))
    check("bias.grad", bn.bias.grad, db_ref, max(tol, 1e-5))
    if residual:
        assert dz.dtype == x.dtype
        check("dz", dz, dz_ref, tol)
    y_eval = bn.forward(x, train=False, z=z)
    check(
        "eval y",
        y_eval,
        ref.norm.batch_norm_infer(
            x64, gamma, beta, host(bn.running_mean), host(bn.running_var), layout=layout, z=z64, relu=relu
        ),
        tol,
    )


# ------------------------------------------------------------------------------------------------ elementwise


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_relu_and_add(rng, precision):
    shape = (3, 5, 7, 4)
    x, x64 = to_device(rng.standard_normal(shape), precision)
    b, b64 = to_device(rng.standard_normal(shape), precision)
    dy, dy64 = to_device(rng.standard_normal(shape), precision)
    tol = TOL[precision]
    relu = ReLU()
    y = relu.forward(x, train=True)
    check("relu", y, np.maximum(x64, 0), 0.0)
    check("relu backward", relu.backward(dy), dy64 * (x64 > 0), 0.0)
    for fused in (False, True):
        add = Add(relu=fused)
        y = add.forward(x, b, train=True)
        expect = np.maximum(x64 + b64, 0) if fused else x64 + b64
        check(f"add (relu={fused})", y, expect, tol)
        da, db = add.backward(dy)
        mask = host(y) > 0 if fused else 1.0
        check(f"add backward (relu={fused})", da, dy64 * mask, 0.0)
        check(f"add backward (relu={fused})", db, dy64 * mask, 0.0)


# ------------------------------------------------------------------------------------------------ pooling


@pytest.mark.parametrize("layout,precision", [("NCHW", "fp32"), ("NHWC", "fp32"), ("NHWC", "fp16")])
def test_maxpool2d(rng, layout, precision):
    pool = MaxPool2d(3, 2, 1, layout=layout)
    x, x64 = to_device(rng.standard_normal(act_shape(layout, 2, 16, 11, 10)), precision)
    y = pool.forward(x, train=True)
    assert y.shape == act_shape(layout, 2, 16, 6, 5)
    check("y", y, ref.pool.max_pool2d(x64, kernel=3, stride=2, padding=1, layout=layout), 0.0)
    dy, dy64 = to_device(rng.standard_normal(y.shape), precision)
    dx = pool.backward(dy)
    expect = ref.pool.max_pool2d_backward(dy64, x64, host(y), kernel=3, stride=2, padding=1, layout=layout)
    check("dx", dx, expect, TOL[precision])


@pytest.mark.parametrize(
    "layout,precision", [("NCHW", "fp32"), ("NHWC", "fp32"), ("NHWC", "fp16"), ("NHWC", "bf16")]
)
def test_global_avg_pool(rng, layout, precision):
    gap = GlobalAvgPool(layout=layout)
    x, x64 = to_device(rng.standard_normal(act_shape(layout, 3, 24, 7, 5)), precision)
    y = gap.forward(x, train=True)
    assert y.shape == (3, 24) and y.dtype == x.dtype
    check("y", y, ref.pool.global_avg_pool(x64, layout=layout), TOL[precision])
    dy, dy64 = to_device(rng.standard_normal((3, 24)), precision)
    check("dx", gap.backward(dy), ref.pool.global_avg_pool_backward(dy64, x.shape, layout=layout), TOL[precision])


# ------------------------------------------------------------------------------------------------ Linear, los


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_linear(rng, precision):
    fc = Linear(12, 7, rng=rng).cuda()
    x, x64 = to_device(rng.standard_normal((5, 12)), precision)
    y = fc.forward(x, train=True)
    w64, b64 = host(fc.weight.data), host(fc.bias.data)
    assert y.dtype == np.float32 and y.shape == (5, 7)
    check("y", y, x64 @ w64.T + b64, 1e-5)
    dy = rng.standard_normal((5, 7)).astype(np.float32)
    dx = fc.backward(cp.asarray(dy))
    assert dx.dtype == x.dtype and dx.shape == x.shape
    check("dx", dx, dy.astype(np.float64) @ w64, TOL[precision])
    check("weight.grad", fc.weight.grad, dy.T.astype(np.float64) @ x64, 1e-5)
    check("bias.grad", fc.bias.grad, dy.sum(0, dtype=np.float64), 1e-5)


@pytest.mark.parametrize("smoothing,label_dtype", [(0.0, np.int32), (0.1, np.int64)])
def test_softmax_cross_entropy(rng, smoothing, label_dtype):
    n, c = 8, 10
    z = (3 * rng.standard_normal((n, c))).astype(np.float32)
    labels = rng.integers(0, c, n).astype(label_dtype)
    lossf = SoftmaxCrossEntropy(smoothing)
    loss, correct = lossf.forward(cp.asarray(z), cp.asarray(labels), train=True)
    z64 = z.astype(np.float64)
    logp = z64 - z64.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    target = np.full((n, c), smoothing / c)
    target[np.arange(n), labels] += 1 - smoothing
    assert abs(float(loss) - float(-(target * logp).sum(1).mean())) <= 1e-5 * abs(float(loss))
    assert int(correct) == int((z.argmax(1) == labels).sum())
    check("dlogits", lossf.backward(), (np.exp(logp) - target) / n, 1e-5)
    lossf.forward(cp.asarray(z), cp.asarray(labels), train=True)
    check(
        "scaled dlogits",
        lossf.backward(cp.asarray([256.0], dtype=cp.float32)),
        256 * (np.exp(logp) - target) / n,
        1e-5,
    )
