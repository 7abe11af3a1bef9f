"""CPU tests of the layers: placed on the host (to_host(): float64 NumPy arrays, which every op function hands to
its reference in resnet_native.reference), so the layers' own logic (layouts, saved tensors, gradient
accumulation, buffers, validation) is checked without a GPU."""

import numpy as np
import pytest

from resnet_native import reference as ref
from resnet_native._core.placement import host
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
from resnet_native.nn.params import Parameter, ParameterArena
from resnet_native.ops import conv


def _act(rng, layout, n, c, h, w):
    return rng.standard_normal((n, c, h, w) if layout == "NCHW" else (n, h, w, c))


# ------------------------------------------------------------------------------------------------ Conv2d


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_forward_backward_and_gradient_accumulation(rng, layout):
    layer = Conv2d(4, 6, 3, stride=2, padding=1, layout=layout, rng=rng).to_host()
    x = _act(rng, layout, 2, 4, 7, 5)
    y = layer.forward(x, train=True)
    spec = layer.spec()
    assert spec.layout == layout and spec.stride == (2, 2) and spec.engine == conv.default_engine()
    np.testing.assert_allclose(y, ref.conv.conv2d(x, layer.weight.data, spec))
    assert y.shape == ref.conv.conv_output_shape(x.shape, layer.weight.shape, spec) == layer.output_shape(x.shape)
    dy = rng.standard_normal(y.shape)
    dx = layer.backward(dy)
    np.testing.assert_allclose(dx, ref.conv.conv2d_backward_data(dy, layer.weight.data, spec, x.shape))
    dw = ref.conv.conv2d_backward_filter(x, dy, spec, layer.weight.shape)
    np.testing.assert_allclose(layer.weight.grad, dw)
    layer.forward(x, train=True)
    layer.backward(dy)
    np.testing.assert_allclose(layer.weight.grad, 2 * dw)  # gradients add up until zeroed
    with pytest.raises(RuntimeError, match="nothing saved"):
        layer.backward(dy)


def test_conv2d_weight_layout_and_state_dict(rng):
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


def test_conv2d_stem_skips_input_gradient(rng):
    layer = Conv2d(3, 4, 3, padding=1, needs_input_grad=False, rng=rng).to_host()
    y = layer.forward(_act(rng, "NHWC", 2, 3, 5, 5), train=True)
    assert layer.backward(np.ones_like(y)) is None
    assert np.abs(layer.weight.grad).sum() > 0


def test_conv2d_frozen_skips_the_filter_gradient_and_still_passes_dx_back(rng):
    frozen = Conv2d(3, 4, 3, padding=1, needs_weight_grad=False, rng=np.random.default_rng(1)).to_host()
    trained = Conv2d(3, 4, 3, padding=1, rng=np.random.default_rng(1)).to_host()
    x = _act(rng, "NHWC", 2, 3, 5, 5)
    dy = rng.standard_normal(frozen.forward(x, train=True).shape)
    trained.forward(x, train=True)
    np.testing.assert_array_equal(frozen.backward(dy), trained.backward(dy))
    assert not np.any(frozen.weight.grad) and np.any(trained.weight.grad)


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
        conv.set_default_engine("fastest")  # the one default engine, which Conv2d takes


def test_conv2d_rejects_wrong_channels(rng):
    layer = Conv2d(3, 4, 3, layout="NHWC", rng=rng).to_host()
    with pytest.raises(ValueError, match=r"x: expected 3 channels"):
        layer.forward(rng.standard_normal((2, 3, 8, 8)), train=False)  # an NCHW array given to an NHWC layer
    with pytest.raises(ValueError, match="4-D"):
        layer.forward(rng.standard_normal((3, 8, 8)), train=False)


def test_layers_take_conv_default_engine_when_their_spec_is_built():
    before = conv.default_engine()
    other = "graph" if before != "graph" else "legacy"
    try:
        conv.set_default_engine(other)
        assert Conv2d(3, 4, 3).spec().engine == other and Conv2d(3, 4, 3).engine is None
        assert Conv2d(3, 4, 3, engine="legacy").spec().engine == "legacy"
        built = Conv2d(3, 4, 3)
        built.spec()
    finally:
        conv.set_default_engine(before)
    assert Conv2d(3, 4, 3).spec().engine == before
    assert built.spec().engine == other  # a built spec keeps its engine


# ------------------------------------------------------------------------------------------------ BatchNorm2d


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("relu,residual", [(False, False), (True, False), (True, True)])
def test_batchnorm2d_train_backward_and_running_stats(rng, layout, relu, residual):
    bn = BatchNorm2d(5, layout=layout, relu=relu, residual=residual, momentum=0.2).to_host()
    bn.load_state_dict({**bn.state_dict(), "weight": rng.standard_normal(5), "bias": rng.standard_normal(5)})
    x = _act(rng, layout, 3, 5, 4, 3) * 2 + 0.5
    z = _act(rng, layout, 3, 5, 4, 3) if residual else None
    y = bn.forward(x, train=True, z=z)
    gamma, beta = bn.weight.data, bn.bias.data
    rm, rv = np.zeros(5), np.ones(5)
    y_ref, mean, invstd, _ = ref.norm.batch_norm_train(
        x, gamma, beta, rm, rv, layout=layout, momentum=0.2, z=z, relu=relu
    )
    np.testing.assert_allclose(y, y_ref)
    np.testing.assert_allclose(bn.running_mean, rm)
    np.testing.assert_allclose(bn.running_var, rv)
    assert bn.num_batches_tracked == 1 and int(bn.state_dict()["num_batches_tracked"]) == 1
    dy = rng.standard_normal(y.shape)
    out = bn.backward(dy)
    dx, dz = out if residual else (out, None)
    dx_ref, dg_ref, db_ref, dz_ref = ref.norm.batch_norm_backward(
        x, dy, gamma, beta, mean, invstd, layout=layout, y=y_ref, relu=relu, has_z=residual
    )
    np.testing.assert_allclose(dx, dx_ref, atol=1e-12)
    np.testing.assert_allclose(bn.weight.grad, dg_ref, atol=1e-12)
    np.testing.assert_allclose(bn.bias.grad, db_ref, atol=1e-12)
    if residual:
        np.testing.assert_allclose(dz, dz_ref)


def test_batchnorm2d_eval_uses_running_stats(rng):
    bn = BatchNorm2d(3, layout="NCHW", relu=True).to_host()
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


def test_batchnorm2d_validation(rng):
    bn = BatchNorm2d(4, layout="NHWC", residual=True, relu=True).to_host()
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


def test_batchnorm2d_keeps_reserve_space_per_shape(rng, monkeypatch):
    # The reference needs no reserve space; this one hands out a token, as cuDNN's fused path does.
    plain = ref.norm.batch_norm_train

    def with_reserve(*args, reserve=None, **kwargs):
        return plain(*args, reserve=np.zeros(1, np.uint8) if reserve is None else reserve, **kwargs)

    monkeypatch.setattr(ref.norm, "batch_norm_train", with_reserve)
    bn = BatchNorm2d(2, layout="NCHW").to_host()
    x = _act(rng, "NCHW", 2, 2, 3, 3)
    bn.forward(x, train=True)
    reserve = bn._saved[4]
    assert reserve is not None
    bn.forward(x, train=True)
    assert bn._saved[4] is reserve  # handed back to the op, not re-created


# ------------------------------------------------------------------------------------------------ others


def test_relu_and_add_layers(rng):
    x, b = rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((2, 3, 4, 4))
    relu = ReLU().to_host()
    y = relu.forward(x, train=True)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    dy = rng.standard_normal(x.shape)
    np.testing.assert_array_equal(relu.backward(dy), dy * (x > 0))
    for fused in (False, True):
        add = Add(relu=fused).to_host()
        y = add.forward(x, b, train=True)
        np.testing.assert_allclose(y, np.maximum(x + b, 0) if fused else x + b)
        da, db = add.backward(dy)
        expect = dy * (x + b > 0) if fused else dy
        np.testing.assert_allclose(da, expect)
        np.testing.assert_allclose(db, expect)
    with pytest.raises(ValueError, match="b: shape"):
        Add().to_host().forward(x, b[:1], train=False)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool_layers(rng, layout):
    x = _act(rng, layout, 2, 3, 7, 6)
    pool = MaxPool2d(3, 2, 1, layout=layout).to_host()
    y = pool.forward(x, train=True)
    assert y.shape == pool.output_shape(x.shape) == ((2, 3, 4, 3) if layout == "NCHW" else (2, 4, 3, 3))
    np.testing.assert_array_equal(y, ref.pool.max_pool2d(x, kernel=3, stride=2, padding=1, layout=layout))
    dy = rng.standard_normal(y.shape)
    np.testing.assert_array_equal(
        pool.backward(dy), ref.pool.max_pool2d_backward(dy, x, y, kernel=3, stride=2, padding=1, layout=layout)
    )
    gap = GlobalAvgPool(layout=layout).to_host()
    g = gap.forward(x, train=True)
    np.testing.assert_allclose(g, x.mean(axis=(2, 3) if layout == "NCHW" else (1, 2)))
    dg = rng.standard_normal(g.shape)
    dx = gap.backward(dg)
    assert np.isclose(np.sum(dx * x), np.sum(dg * g))
    with pytest.raises(ValueError, match="dy"):
        gap.forward(x, train=True)
        gap.backward(dg[:, :2])


def test_linear_forward_backward(rng):
    fc = Linear(6, 4, rng=rng).to_host()
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
def test_softmax_cross_entropy(rng, smoothing):
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


def test_layer_buffers_are_reused_per_shape(rng):
    layer = Conv2d(3, 4, 3, padding=1, layout="NCHW", rng=rng).to_host()
    a = layer.forward(rng.standard_normal((2, 3, 5, 5)), train=False)
    b = layer.forward(rng.standard_normal((2, 3, 5, 5)), train=False)
    c = layer.forward(rng.standard_normal((1, 3, 5, 5)), train=False)
    assert a is b and c is not a and c.shape == (1, 4, 5, 5)
    assert layer.forward(rng.standard_normal((2, 3, 5, 5)), train=False) is a


def test_parameter_arena_views_and_low_copies(rng):
    params = [Parameter(rng.standard_normal(s)) for s in [(3, 4), (5,), (2, 2, 2, 2)]]
    arena = ParameterArena(params, host(), low_dtype=np.float16)
    for p in params:
        assert p.placement == host() and p.arena is arena
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


def test_a_module_is_placed_once_and_takes_its_arrays_from_there(rng):
    bn = BatchNorm2d(3, layout="NCHW")
    assert bn.placement is None and bn.weight.placement is None
    assert bn.to_host() is bn and bn.to_host() is bn and bn.placement == host() == bn.weight.placement
    assert isinstance(bn.running_mean, np.ndarray) and bn.running_mean.dtype == bn.weight.grad.dtype == np.float64
    with pytest.raises(RuntimeError, match=r"already on the host \(float64\)"):
        bn.to_host(np.float32)
    with pytest.raises(ValueError, match="dtype: expected float64 or float32"):
        host(np.float16)
    layer = Conv2d(3, 4, 3, padding=1, layout="NCHW", rng=rng).to_host(np.float32)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    y = layer.forward(x, train=True)
    assert y.dtype == layer.weight.data.dtype == layer.weight.grad.dtype == np.float32
    with pytest.raises(TypeError, match=r"w: expected a float64 array \(as x\), got float32"):
        layer.forward(x.astype(np.float64), train=False)  # the weights are float32: so must x be
