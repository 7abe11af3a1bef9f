"""GPU tests of each layer's forward and backward against the float64 NumPy references (resnet_native.reference).

Inputs are fresh random data rounded to the storage dtype; the references run in float64 on exactly those
values. Layer buffers start as NaN (BufferCache), so an element an op fails to write makes the norm-wise error
NaN and the test fail. Tolerances (norm-wise relative): fp32 1e-5, tf32 1e-3, fp16/bf16 1e-2.
"""

import cupy as cp
import numpy as np
import pytest
from device_values import TOLERANCE, check_close, host_values, to_device

import resnet_native as rn
from resnet_native import reference as ref
from resnet_native.nn.layers import (
    Add,
    BatchNorm2d,
    Conv2d,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReLU,
    SoftmaxCrossEntropy,
)
from resnet_native.ops.conv import ConvSpec

pytestmark = pytest.mark.gpu


def act_shape(layout, n, c, h, w):
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


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
    w64 = host_values(w)
    spec = ConvSpec(stride=2, padding=1, layout=layout)  # the float64 reference's: fp32 math on the stored values
    tol = TOLERANCE[precision]
    assert y.shape == act_shape(layout, 4, 16, 5, 5) and y.dtype == x.dtype
    check_close(y, ref.conv.conv2d(x64, w64, spec), tol, "y")
    dy, dy64 = to_device(rng.standard_normal(y.shape), precision)
    dx = conv.backward(dy)
    assert dx.shape == x.shape and dx.dtype == x.dtype
    check_close(dx, ref.conv.conv2d_backward_data(dy64, w64, spec, x.shape), tol, "dx")
    dw = ref.conv.conv2d_backward_filter(x64, dy64, spec, conv.weight.shape)
    assert conv.weight.grad.dtype == np.float32
    check_close(conv.weight.grad, dw, tol, "weight.grad")
    conv.forward(x, train=True)
    conv.backward(dy)
    check_close(conv.weight.grad, 2 * dw, tol, "weight.grad after two backward passes")


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
    if layout == "NHWC" and precision in ("fp16", "bf16") and relu:
        assert rn.norm.last_path()["fused"], rn.norm.last_path()  # cuDNN's fused BN (+add) + ReLU kernel ran
    tol = TOLERANCE[precision]
    rm, rv = np.zeros(c), np.ones(c)
    y_ref, mean, invstd, _ = ref.norm.batch_norm_train(
        x64, gamma, beta, rm, rv, layout=layout, momentum=0.2, z=z64, relu=relu
    )
    check_close(y, y_ref, tol, "y")
    check_close(bn.running_mean, rm, 1e-4, "running_mean")
    check_close(bn.running_var, rv, 1e-4, "running_var")
    assert bn.num_batches_tracked == 1
    dy, dy64 = to_device(rng.standard_normal(shape), precision)
    out = bn.backward(dy)
    dx, dz = out if residual else (out, None)
    # The ReLU mask is taken from the device's own output, as the layer does.
    dx_ref, dg_ref, db_ref, dz_ref = ref.norm.batch_norm_backward(
        x64, dy64, gamma, beta, mean, invstd, layout=layout, y=host_values(y), relu=relu, has_z=residual
    )
    check_close(dx, dx_ref, tol, "dx")
    check_close(bn.weight.grad, dg_ref, max(tol, 1e-5), "weight.grad")
    check_close(bn.bias.grad, db_ref, max(tol, 1e-5), "bias.grad")
    if residual:
        assert dz.dtype == x.dtype
        check_close(dz, dz_ref, tol, "dz")
    y_eval = bn.forward(x, train=False, z=z)
    running = host_values(bn.running_mean), host_values(bn.running_var)
    expect = ref.norm.batch_norm_infer(x64, gamma, beta, *running, layout=layout, z=z64, relu=relu)
    check_close(y_eval, expect, tol, "eval y")


# ------------------------------------------------------------------------------------------------ elementwise


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_relu_and_add(rng, precision):
    shape = (3, 5, 7, 4)
    x, x64 = to_device(rng.standard_normal(shape), precision)
    b, b64 = to_device(rng.standard_normal(shape), precision)
    dy, dy64 = to_device(rng.standard_normal(shape), precision)
    tol = TOLERANCE[precision]
    relu = ReLU()
    y = relu.forward(x, train=True)
    check_close(y, ref.kernels.relu(x64), 0.0, "relu")
    check_close(relu.backward(dy), ref.kernels.relu_backward(dy64, ref.kernels.relu(x64)), 0.0, "relu backward")
    for fused in (False, True):
        add = Add(relu=fused)
        y = add.forward(x, b, train=True)
        check_close(y, (ref.kernels.add_relu if fused else ref.kernels.add)(x64, b64), tol, f"add (relu={fused})")
        da, db = add.backward(dy)
        # The gradient of each summand: dy through the mask of the layer's own output (no mask without ReLU).
        expect = ref.kernels.add_relu_backward(dy64, host_values(y)) if fused else dy64
        check_close(da, expect, 0.0, f"add backward (relu={fused})")
        check_close(db, expect, 0.0, f"add backward (relu={fused})")


# ------------------------------------------------------------------------------------------------ pooling


@pytest.mark.parametrize("layout,precision", [("NCHW", "fp32"), ("NHWC", "fp32"), ("NHWC", "fp16")])
def test_maxpool2d(rng, layout, precision):
    pool = MaxPool2d(3, 2, 1, layout=layout)
    x, x64 = to_device(rng.standard_normal(act_shape(layout, 2, 16, 11, 10)), precision)
    y = pool.forward(x, train=True)
    assert y.shape == act_shape(layout, 2, 16, 6, 5)
    check_close(y, ref.pool.max_pool2d(x64, kernel=3, stride=2, padding=1, layout=layout), 0.0, "y")
    dy, dy64 = to_device(rng.standard_normal(y.shape), precision)
    dx = pool.backward(dy)
    expect = ref.pool.max_pool2d_backward(dy64, x64, host_values(y), kernel=3, stride=2, padding=1, layout=layout)
    check_close(dx, expect, TOLERANCE[precision], "dx")


@pytest.mark.parametrize(
    "layout,precision", [("NCHW", "fp32"), ("NHWC", "fp32"), ("NHWC", "fp16"), ("NHWC", "bf16")]
)
def test_global_avg_pool(rng, layout, precision):
    gap = GlobalAvgPool(layout=layout)
    x, x64 = to_device(rng.standard_normal(act_shape(layout, 3, 24, 7, 5)), precision)
    y = gap.forward(x, train=True)
    assert y.shape == (3, 24) and y.dtype == x.dtype
    check_close(y, ref.pool.global_avg_pool(x64, layout=layout), TOLERANCE[precision], "y")
    dy, dy64 = to_device(rng.standard_normal((3, 24)), precision)
    expect = ref.pool.global_avg_pool_backward(dy64, x.shape, layout=layout)
    check_close(gap.backward(dy), expect, TOLERANCE[precision], "dx")


# ------------------------------------------------------------------------------------------------ Linear, los


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_linear(rng, precision):
    fc = Linear(12, 7, rng=rng).cuda()
    x, x64 = to_device(rng.standard_normal((5, 12)), precision)
    y = fc.forward(x, train=True)
    w64, b64 = host_values(fc.weight.data), host_values(fc.bias.data)
    assert y.dtype == np.float32 and y.shape == (5, 7)
    check_close(y, x64 @ w64.T + b64, 1e-5, "y")
    dy = rng.standard_normal((5, 7)).astype(np.float32)
    dx = fc.backward(cp.asarray(dy))
    assert dx.dtype == x.dtype and dx.shape == x.shape
    check_close(dx, dy.astype(np.float64) @ w64, TOLERANCE[precision], "dx")
    check_close(fc.weight.grad, dy.T.astype(np.float64) @ x64, 1e-5, "weight.grad")
    check_close(fc.bias.grad, dy.sum(0, dtype=np.float64), 1e-5, "bias.grad")
    fc.forward(x, train=True)  # a second backward adds into both gradients (accumulate_grad), as micro-batches do
    fc.backward(cp.asarray(dy))
    check_close(fc.weight.grad, 2 * dy.T.astype(np.float64) @ x64, 1e-5, "weight.grad accumulated")
    check_close(fc.bias.grad, 2 * dy.sum(0, dtype=np.float64), 1e-5, "bias.grad accumulated")


@pytest.mark.parametrize("smoothing,label_dtype", [(0.0, np.int32), (0.1, np.int32)])
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
    check_close(lossf.backward(), (np.exp(logp) - target) / n, 1e-5, "dlogits")
    lossf.forward(cp.asarray(z), cp.asarray(labels), train=True)
    scaled = lossf.backward(cp.asarray([256.0], dtype=cp.float32))
    check_close(scaled, 256 * (np.exp(logp) - target) / n, 1e-5, "scaled dlogits")
