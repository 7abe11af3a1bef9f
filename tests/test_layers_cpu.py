"""CPU tests of the layers: run on the float64 NumPy stand-ins of the native ops (test_layers_numpy_ops), so
the layers' own logic (layouts, saved tensors, gradient accumulation, buffers, validation) is checked without
a GPU."""

import numpy as np
import pytest
import test_layers_numpy_ops as ref

from resnet_native.layers import (
    Add,
    BatchNorm2d,
    Conv2d,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReLU,
    SoftmaxCrossEntropy,
    default_engine,
    set_default_engine,
)
from resnet_native.layers._backend import ops
from resnet_native.params import Parameter, ParameterArena


@pytest.fixture
def numpy_ops():
    with ops.use(**ref.numpy_backend()):
        yield


def _act(rng, layout, n, c, h, w):
    return rng.standard_normal((n, c, h, w) if layout == "NCHW" else (n, h, w, c))


# ------------------------------------------------------------------------------------------------ Conv2d


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_forward_backward_and_gradient_accumulation(numpy_ops, rng, layout):
    conv = Conv2d(4, 6, 3, stride=2, padding=1, layout=layout, rng=rng)
    x = _act(rng, layout, 2, 4, 7, 5)
    y = conv.forward(x, train=True)
    spec = conv.spec()
    assert spec.layout == layout and spec.stride == (2, 2) and spec.engine == default_engine()
    np.testing.assert_allclose(y, ref.conv2d(x, conv.weight.data, spec))
    assert y.shape == ref.conv_output_shape(x.shape, conv.weight.shape, spec) == conv.output_shape(x.shape)
    dy = rng.standard_normal(y.shape)
    dx = conv.backward(dy)
    np.testing.assert_allclose(dx, ref.conv2d_backward_data(dy, conv.weight.data, spec, x.shape))
    dw = ref.conv2d_backward_filter(x, dy, spec, conv.weight.shape)
    np.testing.assert_allclose(conv.weight.grad, dw)
    conv.forward(x, train=True)
    conv.backward(dy)
    np.testing.assert_allclose(conv.weight.grad, 2 * dw)  # gradients add up until zeroed
    with pytest.raises(RuntimeError, match="nothing saved"):
        conv.backward(dy)


def test_conv2d_weight_layout_and_state_dict(numpy_ops, rng):
    nchw = Conv2d(3, 8, 3, layout="NCHW", rng=np.random.default_rng(1))
    nhwc = Conv2d(3, 8, 3, layout="NHWC", rng=np.random.default_rng(1))
    assert nchw.weight.shape == (8, 3, 3, 3) and nhwc.weight.shape == (8, 3, 3, 3)
    nhwc2 = Conv2d(2, 8, 3, layout="NHWC", rng=rng)
    assert nhwc2.weight.shape == (8, 3, 3, 2)  # (K, R, S, C)
    assert nhwc2.state_dict()["weight"].shape == (8, 2, 3, 3)  # torch's (K, C, R, S)
    np.testing.assert_array_equal(nchw.state_dict()["weight"], nhwc.state_dict()["weight"])
    w = rng.standard_normal((8, 2, 3, 3)).astype(np.float32)
    nhwc2.load_state_dict({"weight": w})
    np.testing.assert_array_equal(nhwc2.weight.data, w.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(nhwc2.state_dict()["weight"], w)


def test_conv2d_init_is_kaiming_normal_fan_out():
    conv = Conv2d(64, 128, 3, layout="NCHW", rng=np.random.default_rng(0))
    std = float(np.std(conv.weight.data))
    assert abs(std - np.sqrt(2.0 / (128 * 9))) < 0.02 * std


def test_conv2d_stem_skips_input_gradient(numpy_ops, rng):
    conv = Conv2d(3, 4, 3, padding=1, needs_input_grad=False, rng=rng)
    y = conv.forward(_act(rng, "NHWC", 2, 3, 5, 5), train=True)
    assert conv.backward(np.ones_like(y)) is None
    assert np.abs(conv.weight.grad).sum() > 0


def test_conv2d_validation():
    with pytest.raises(ValueError, match="layout"):
        Conv2d(3, 4, 3, layout="NWHC")
    with pytest.raises(ValueError, match="precision"):
        Conv2d(3, 4, 3, precision="fp64")
    with pytest.raises(ValueError, match="engine"):
        Conv2d(3, 4, 3, engine="fast")
    with pytest.raises(ValueError, match="groups"):
        Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="kernel_size"):
        Conv2d(3, 4, 0)
    with pytest.raises(ValueError, match="engine"):
        set_default_engine("fastest")


def test_conv2d_rejects_wrong_channels(numpy_ops, rng):
    conv = Conv2d(3, 4, 3, layout="NHWC", rng=rng)
    with pytest.raises(ValueError, match=r"x: expected 3 channels"):
        conv.forward(rng.standard_normal((2, 3, 8, 8)), train=False)  # an NCHW array given to an NHWC layer
    with pytest.raises(ValueError, match="4-D"):
        conv.forward(rng.standard_normal((3, 8, 8)), train=False)


def test_set_default_engine_applies_to_new_layers():
    before = default_engine()
    try:
        set_default_engine("legacy")
        assert Conv2d(3, 4, 3).engine == "legacy"
        assert Conv2d(3, 4, 3, engine="graph").engine == "graph"
    finally:
        set_default_engine(before)
    assert Conv2d(3, 4, 3).engine == before


# ------------------------------------------------------------------------------------------------ BatchNorm2d


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("relu,residual", [(False, False), (True, False), (True, True)])
def test_batchnorm2d_train_backward_and_running_stats(numpy_ops, rng, layout, relu, residual):
    bn = BatchNorm2d(5, layout=layout, relu=relu, residual=residual, momentum=0.2)
    bn.load_state_dict({**bn.state_dict(), "weight": rng.standard_normal(5), "bias": rng.standard_normal(5)})
    x = _act(rng, layout, 3, 5, 4, 3) * 2 + 0.5
    z = _act(rng, layout, 3, 5, 4, 3) if residual else None
    y = bn.forward(x, train=True, z=z)
    gamma, beta = bn.weight.data, bn.bias.data
    rm, rv = np.zeros(5), np.ones(5)
    y_ref, mean, invstd, _ = ref.batch_norm_train(
        x, gamma, beta, rm, rv, layout=layout, momentum=0.2, z=z, relu=relu
    )
    np.testing.assert_allclose(y, y_ref)
    np.testing.assert_allclose(bn.running_mean, rm)
    np.testing.assert_allclose(bn.running_var, rv)
    assert bn.num_batches_tracked == 1 and int(bn.state_dict()["num_batches_tracked"]) == 1
    dy = rng.standard_normal(y.shape)
    out = bn.backward(dy)
    dx, dz = out if residual else (out, None)
    dx_ref, dg_ref, db_ref, dz_ref = ref.batch_norm_backward(
        x, dy, gamma, beta, mean, invstd, layout=layout, y=y_ref, relu=relu, has_z=residual
    )
    np.testing.assert_allclose(dx, dx_ref, atol=1e-12)
    np.testing.assert_allclose(bn.weight.grad, dg_ref, atol=1e-12)
    np.testing.assert_allclose(bn.bias.grad, db_ref, atol=1e-12)
    if residual:
        np.testing.assert_allclose(dz, dz_ref)


def test_batchnorm2d_eval_uses_running_stats(numpy_ops, rng):
    bn = BatchNorm2d(3, layout="NCHW", relu=True)
    state = bn.state_dict()
    state.update(
        running_mean=rng.standard_normal(3), running_var=rng.uniform(0.5, 2, 3), num_batches_tracked=7
    )
    bn.load_state_dict(state)
    x = _act(rng, "NCHW", 2, 3, 4, 4)
    y = bn.forward(x, train=False)
    expect = np.maximum(
        (x - state["running_mean"].reshape(1, 3, 1, 1))
        / np.sqrt(state["running_var"].reshape(1, 3, 1, 1) + 1e-5),
        0,
    )
    np.testing.assert_allclose(y, expect, rtol=1e-6)  # running stats went through fp32 in state_dict
    assert bn.num_batches_tracked == 7
    with pytest.raises(RuntimeError, match="nothing saved"):
        bn.backward(np.ones_like(y))


def test_batchnorm2d_validation(numpy_ops, rng):
    bn = BatchNorm2d(4, layout="NHWC", residual=True, relu=True)
    x = _act(rng, "NHWC", 2, 4, 3, 3)
    with pytest.raises(ValueError, match="residual"):
        bn.forward(x, train=True)
    with pytest.raises(ValueError, match="z: shape"):
        bn.forward(x, train=True, z=x[:1])
    with pytest.raises(ValueError, match="momentum"):
        BatchNorm2d(4, momentum=1.5)
    # PyTorch's cumulative average (momentum=None) is not supported: a clear ValueError, not a TypeError.
    for bad in (None, "0.1", True):
        with pytest.raises(ValueError, match=r"momentum.*momentum=None.*not supported"):
            BatchNorm2d(4, momentum=bad)
    assert BatchNorm2d(4, momentum=np.float32(0.25)).momentum == 0.25
    with pytest.raises(ValueError, match="layout"):
        BatchNorm2d(4, layout="nhwc")


def test_batchnorm2d_keeps_reserve_space_per_shape(numpy_ops, rng):
    bn = BatchNorm2d(2, layout="NCHW")
    x = _act(rng, "NCHW", 2, 2, 3, 3)
    bn.forward(x, train=True)
    reserve = bn._saved[4]
    assert reserve is not None
    bn.forward(x, train=True)
    assert bn._saved[4] is reserve  # handed back to the op, not re-created


# ------------------------------------------------------------------------------------------------ others


def test_relu_and_add_layers(numpy_ops, rng):
    x, b = rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((2, 3, 4, 4))
    relu = ReLU()
    y = relu.forward(x, train=True)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    dy = rng.standard_normal(x.shape)
    np.testing.assert_array_equal(relu.backward(dy), dy * (x > 0))
    for fused in (False, True):
        add = Add(relu=fused)
        y = add.forward(x, b, train=True)
        np.testing.assert_allclose(y, np.maximum(x + b, 0) if fused else x + b)
        da, db = add.backward(dy)
        expect = dy * (x + b > 0) if fused else dy
        np.testing.assert_allclose(da, expect)
        np.testing.assert_allclose(db, expect)
    with pytest.raises(ValueError, match="b: shape"):
        Add().forward(x, b[:1], train=False)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool_layers(numpy_ops, rng, layout):
    x = _act(rng, layout, 2, 3, 7, 6)
    pool = MaxPool2d(3, 2, 1, layout=layout)
    y = pool.forward(x, train=True)
    assert y.shape == pool.output_shape(x.shape) == ((2, 3, 4, 3) if layout == "NCHW" else (2, 4, 3, 3))
    np.testing.assert_array_equal(y, ref.max_pool2d(x, kernel=3, stride=2, padding=1, layout=layout))
    dy = rng.standard_normal(y.shape)
    np.testing.assert_array_equal(
        pool.backward(dy), ref.max_pool2d_backward(dy, x, y, kernel=3, stride=2, padding=1, layout=layout)
    )
    gap = GlobalAvgPool(layout=layout)
    g = gap.forward(x, train=True)
    np.testing.assert_allclose(g, x.mean(axis=(2, 3) if layout == "NCHW" else (1, 2)))
    dg = rng.standard_normal(g.shape)
    dx = gap.backward(dg)
    assert np.isclose(np.sum(dx * x), np.sum(dg * g))
    with pytest.raises(ValueError, match="dy"):
        gap.forward(x, train=True)
        gap.backward(dg[:, :2])


def test_linear_forward_backward(numpy_ops, rng):
    fc = Linear(6, 4, rng=rng)
    x = rng.standard_normal((3, 6))
    y = fc.forward(x, train=True)
    np.testing.assert_allclose(y, x @ fc.weight.data.T + fc.bias.data)
    dy = rng.standard_normal(y.shape)
    dx = fc.backward(dy)
    np.testing.assert_allclose(dx, dy @ fc.weight.data)
    np.testing.assert_allclose(fc.weight.grad, dy.T @ x)
    np.testing.assert_allclose(fc.bias.grad, dy.sum(0))
    with pytest.raises(ValueError, match=r"x: expected shape \(N, 6\)"):
        fc.forward(x[:, :5], train=False)


def test_linear_init_follows_torch_default():
    fc = Linear(256, 1000, rng=np.random.default_rng(0))
    bound = 1 / np.sqrt(256)
    assert np.abs(fc.weight.data).max() <= bound and np.abs(fc.weight.data).max() > 0.95 * bound
    assert fc.state_dict()["weight"].shape == (1000, 256) and fc.state_dict()["bias"].shape == (1000,)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_softmax_cross_entropy(numpy_ops, rng, smoothing):
    n, c = 5, 7
    z = rng.standard_normal((n, c)) * 3
    labels = rng.integers(0, c, n).astype(np.int32)
    lossf = SoftmaxCrossEntropy(smoothing)

    def direct(z):
        logp = z - z.max(1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
        t = np.full((n, c), smoothing / c)
        t[np.arange(n), labels] += 1 - smoothing
        return float(-(t * logp).sum(1).mean())

    loss, correct = lossf.forward(z, labels, train=True)
    assert loss.shape == () and correct.shape == () and correct.dtype == np.int32
    assert np.isclose(float(loss), direct(z), rtol=1e-12)
    assert int(correct) == int((z.argmax(1) == labels).sum())
    g = lossf.backward()
    eps, num = 1e-6, np.zeros_like(z)
    for idx in np.ndindex(z.shape):
        zp, zm = z.copy(), z.copy()
        zp[idx] += eps
        zm[idx] -= eps
        num[idx] = (direct(zp) - direct(zm)) / (2 * eps)
    np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-9)
    lossf.forward(z, labels, train=True)
    np.testing.assert_allclose(lossf.backward(np.array([8.0])), 8 * num, rtol=1e-6, atol=1e-8)
    with pytest.raises(RuntimeError):
        lossf.backward()
    with pytest.raises(ValueError, match="labels"):
        lossf.forward(z, labels[:3])
    with pytest.raises(ValueError, match="label_smoothing"):
        SoftmaxCrossEntropy(1.0)


def test_layer_buffers_are_reused_per_shape(numpy_ops, rng):
    conv = Conv2d(3, 4, 3, padding=1, layout="NCHW", rng=rng)
    a = conv.forward(rng.standard_normal((2, 3, 5, 5)), train=False)
    b = conv.forward(rng.standard_normal((2, 3, 5, 5)), train=False)
    c = conv.forward(rng.standard_normal((1, 3, 5, 5)), train=False)
    assert a is b and c is not a and c.shape == (1, 4, 5, 5)
    assert conv.forward(rng.standard_normal((2, 3, 5, 5)), train=False) is a


def test_parameter_arena_views_and_low_copies(rng):
    with ops.use(
        **ref.numpy_backend(),
    ) as o:
        o.storage = {**o.storage, "fp16": np.dtype(np.float16)}
        params = [Parameter(rng.standard_normal(s)) for s in [(3, 4), (5,), (2, 2, 2, 2)]]
        arena = ParameterArena(params, low_dtype=np.float16)
        for p in params:
            assert p.on_device and p.arena is arena
            assert np.shares_memory(p.data, arena.master) and np.shares_memory(p.grad, arena.grad)
            assert p.data.ctypes.data % 256 == arena.master.ctypes.data % 256  # aligned offsets
            np.testing.assert_array_equal(p.low, p.data.astype(np.float16))
            assert not p.grad.any()
        params[1].assign(np.arange(5.0))
        np.testing.assert_array_equal(params[1].low, np.arange(5.0, dtype=np.float16))
        params[0].accumulate_grad(np.ones((3, 4), np.float16))
        params[0].accumulate_grad(np.ones((3, 4)))
        np.testing.assert_array_equal(params[0].grad, np.full((3, 4), 2.0))
        with pytest.raises(ValueError, match="already on the device"):
            ParameterArena(params)
        with pytest.raises(ValueError, match="expected shape"):
            params[0].assign(np.zeros(3))
