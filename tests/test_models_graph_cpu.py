"""The whole ResNet graph on the CPU: models placed on the host (to_host(): float64 NumPy arrays, which every op
function hands to its reference in resnet_native.reference), so forward/backward wiring, layouts, the
fused/unfused residual, TrainStep, the optimizers and loss scaling are checked against finite differences and
hand-written updates without a GPU."""

import numpy as np
import pytest
from fake_arrays import FakeCudaArray

from resnet_native import reference as ref
from resnet_native.nn.models import ResNet18, ResNet50
from resnet_native.ops.losses import SoftmaxCrossEntropy
from resnet_native.optim import SGD, AdamW, GradScaler
from resnet_native.optim.step import TrainStep


def _input(rng, layout, n, hw):
    return rng.standard_normal((n, 3, hw, hw) if layout == "NCHW" else (n, hw, hw, 3))


def _loss(model, x, labels):
    loss, _ = SoftmaxCrossEntropy().forward(model.forward(x, train=True, copy=False), labels, train=False)
    return float(loss)


def _gradients(model, x, labels):
    model.to_host()
    model.zero_grad()
    lossf = SoftmaxCrossEntropy()
    lossf.forward(model.forward(x, train=True, copy=False), labels)
    model.backward(lossf.backward())
    return {name: p.grad.copy() for name, p in model.named_parameters()}


def _directional_check(model, x, labels, grads, names, rng, h=1e-8):
    """<grad, v> against (L(p + h v) - L(p - h v)) / 2h, for a random unit vector v over the named parameters.

    A unit v keeps each weight's step tiny, so few ReLU kinks are crossed; the tolerance is relative to the
    size <grad, v> has for a random direction, ||grad|| / sqrt(n)."""
    params = dict(model.named_parameters())
    direction = {n: rng.standard_normal(params[n].shape) for n in names}
    norm = np.sqrt(sum(float(np.sum(v * v)) for v in direction.values()))
    direction = {n: v / norm for n, v in direction.items()}
    analytic = sum(float(np.sum(grads[n] * direction[n])) for n in names)
    typical = np.sqrt(sum(float(np.sum(grads[n] ** 2)) for n in names) / sum(grads[n].size for n in names))
    values = []
    for step in (h, -2 * h, h):  # to p + h v, to p - h v, back to p
        for n in names:
            params[n].data += step * direction[n]
        values.append(_loss(model, x, labels))
    up, down = values[0], values[1]
    numeric = (up - down) / (2 * h)
    assert abs(numeric - analytic) <= 1e-4 * typical + 1e-5 * abs(analytic), (
        names,
        numeric,
        analytic,
        typical,
    )


def test_resnet18_gradients_match_finite_differences(rng):
    # 16x16 inputs and batch 2 leave 8 values per channel to the last batch norms (fewer make BN
    # ill-conditioned).
    model = ResNet18(num_classes=5, seed=0).to_host()
    x, labels = _input(rng, "NHWC", 2, 16), rng.integers(0, 5, 2)
    grads = _gradients(model, x, labels)
    names = [n for n, _ in model.named_parameters()]
    _directional_check(model, x, labels, grads, names, rng)
    for n in [
        "conv1.weight",
        "bn1.bias",
        "layer1.1.bn2.weight",
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.bias",
        "layer3.0.conv1.weight",
        "layer4.1.conv2.weight",
        "fc.weight",
        "fc.bias",
    ]:
        assert np.abs(grads[n]).max() > 0, n
        _directional_check(model, x, labels, grads, [n], rng)


def test_resnet50_imagenet_stem_gradients_match_finite_differences(rng):
    model = ResNet50(num_classes=4, stem="imagenet", layout="NCHW", seed=0).to_host()
    x, labels = _input(rng, "NCHW", 2, 64), rng.integers(0, 4, 2)  # 7x7/2 conv + max pool: 2x2 at layer4
    grads = _gradients(model, x, labels)
    _directional_check(model, x, labels, grads, [n for n, _ in model.named_parameters()], rng)
    for n in ["conv1.weight", "layer1.0.downsample.0.weight", "layer1.0.conv3.weight", "layer4.2.bn3.weight"]:
        _directional_check(model, x, labels, grads, [n], rng)


def test_layouts_give_the_same_model(rng):
    x = _input(rng, "NCHW", 2, 8)
    labels = rng.integers(0, 10, 2)
    results = {}
    for layout in ("NCHW", "NHWC"):
        model = ResNet18(num_classes=10, layout=layout, seed=5).to_host()
        xl = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        logits = model.forward(xl, train=True)
        _gradients(model, xl, labels)
        results[layout] = (logits, model.grads_dict())
    np.testing.assert_allclose(results["NCHW"][0], results["NHWC"][0], rtol=1e-10, atol=1e-12)
    for k, g in results["NCHW"][1].items():
        assert ref.relative_error(results["NHWC"][1][k], g) < 3e-7, k  # grads_dict rounds to fp32


def test_fused_residual_equals_unfused(rng):
    x, labels = _input(rng, "NHWC", 2, 8), rng.integers(0, 10, 2)
    out = []
    for fused in (True, False):
        model = ResNet50(num_classes=10, seed=1, fused_residual=fused).to_host()
        logits = model.forward(x, train=True)
        _gradients(model, x, labels)
        out.append((logits, model.grads_dict(), model.state_dict()))
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-12)
    for k in out[0][1]:
        np.testing.assert_allclose(out[0][1][k], out[1][1][k], rtol=1e-9, atol=1e-14, err_msg=k)
    for k in out[0][2]:
        np.testing.assert_allclose(out[0][2][k], out[1][2][k], rtol=1e-6, err_msg=k)  # running stats too


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a batch of 1 at 1x1: unbiased variance of 1 value
def test_eval_uses_running_statistics_and_train_does_not(rng):
    model = ResNet18(num_classes=10, seed=2).to_host()
    x = _input(rng, "NHWC", 4, 8)
    model.forward(x, train=True)  # moves the running statistics off their initial values
    model.eval()
    full, first = model.forward(x), model.forward(x[:1])
    np.testing.assert_allclose(first[0], full[0], rtol=1e-10)  # eval: each sample on its own
    # train: batch statistics (of two samples: one value per channel in the 1x1 last stage is refused)
    train_full, train_first = model.forward(x, train=True), model.forward(x[:2], train=True)
    assert not np.allclose(train_first[0], train_full[0])
    assert int(model.state_dict()["bn1.num_batches_tracked"]) == 3


def test_forward_returns_a_copy_and_backward_needs_a_training_forward(rng):
    model = ResNet18(num_classes=10, seed=0).to_host()
    x = _input(rng, "NHWC", 2, 8)
    a = model.forward(x, train=False)
    b = model.forward(x * 2, train=False)
    assert a is not b and not np.allclose(a, b)
    own = model.forward(x, train=False, copy=False)  # the model's logits buffer, rewritten by the next call
    np.testing.assert_array_equal(own, a)
    assert model.forward(x * 2, train=False, copy=False) is own
    np.testing.assert_array_equal(own, b)
    with pytest.raises(RuntimeError, match="nothing saved"):
        model.backward(np.ones((2, 10)))


def test_model_input_validation(rng):
    model = ResNet18(num_classes=10, layout="NHWC").to_host()
    with pytest.raises(ValueError, match="3 channels"):
        model.forward(rng.standard_normal((2, 3, 8, 8)))
    with pytest.raises(ValueError, match="4-D"):
        model.forward(rng.standard_normal((8, 8, 3)))
    with pytest.raises(TypeError, match="x: expected"):
        model.forward(np.zeros((2, 8, 8, 3), np.int32))
    with pytest.raises(TypeError, match=r"x: the model is on the host \(float64\), so expected a NumPy array"):
        model.forward(FakeCudaArray((2, 8, 8, 3)))


def test_train_step_sgd_matches_a_hand_written_update(rng):
    x, labels = _input(rng, "NHWC", 3, 8), rng.integers(0, 10, 3).astype(np.int32)
    reference = ResNet18(num_classes=10, seed=3).to_host()
    grads = _gradients(reference, x, labels)
    expected_loss = _loss(ResNet18(num_classes=10, seed=3).to_host(), x, labels)
    model = ResNet18(num_classes=10, seed=3).to_host()
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    step = TrainStep(model, SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True))
    loss, correct = step(x, labels)
    assert np.isclose(float(loss), expected_loss, rtol=1e-12) and 0 <= int(correct) <= 3
    for n, p in model.named_parameters():
        d = grads[n] + 5e-4 * before[n]  # first step: buf = d; nesterov: d + 0.9 * buf
        np.testing.assert_allclose(p.data, before[n] - 0.1 * (d + 0.9 * d), rtol=1e-10, atol=1e-14, err_msg=n)


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_train_step_with_loss_scaling_equals_without(rng, opt):
    x, labels = _input(rng, "NHWC", 2, 8), rng.integers(0, 10, 2)

    def make(opt_params):
        return SGD(opt_params, lr=0.05, momentum=0.9) if opt == "sgd" else AdamW(opt_params, lr=1e-3)

    plain, scaled = ResNet18(num_classes=10, seed=4).to_host(), ResNet18(num_classes=10, seed=4).to_host()
    plain_step = TrainStep(plain, make(plain.parameters()))
    scaler = GradScaler(init_scale=1024.0, growth_interval=2)
    scaled_step = TrainStep(scaled, make(scaled.parameters()), scaler=scaler)
    for _ in range(2):
        plain_step(x, labels)
        scaled_step(x, labels)
    a, b = plain.state_dict(), scaled.state_dict()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-6, atol=1e-9, err_msg=k)
    assert scaler.get_scale() == 2048.0  # two good steps with growth_interval=2: doubled once


def test_grad_scaler_loads_its_state_into_the_arrays_a_captured_step_reads(rng):
    model = ResNet18(num_classes=10, seed=4).to_host()
    scaler = GradScaler(init_scale=1024.0, growth_interval=3)
    step = TrainStep(model, SGD(model.parameters(), lr=0.05), scaler=scaler)
    step(_input(rng, "NHWC", 2, 8), rng.integers(0, 10, 2))
    arrays = (scaler.scale_array, scaler.found_inf)
    scaler.load_state_dict({"scale": 64.0, "growth_tracker": 2})
    assert (scaler.scale_array, scaler.found_inf) == arrays  # the same objects: what a graph was captured on
    assert scaler.get_scale() == 64.0 and scaler.state_dict()["growth_tracker"] == 2
    step(_input(rng, "NHWC", 2, 8), rng.integers(0, 10, 2))
    assert scaler.get_scale() == 128.0  # the loaded tracker's third good step doubles the loaded scale


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the inf input turns activations into NaN
def test_grad_scaler_skips_the_step_on_inf(rng):
    model = ResNet18(num_classes=10, seed=6).to_host()
    scaler = GradScaler(init_scale=256.0)
    step = TrainStep(model, SGD(model.parameters(), lr=0.1), scaler=scaler)
    x = _input(rng, "NHWC", 2, 8)
    x[0, 0, 0, 0] = np.inf
    before = model.state_dict()
    step(x, rng.integers(0, 10, 2))
    after = model.state_dict()
    assert int(scaler.found_inf[0]) == 1 and scaler.get_scale() == 128.0
    for k in before:
        if not k.endswith(("running_mean", "running_var", "num_batches_tracked")):
            np.testing.assert_array_equal(after[k], before[k], err_msg=k)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_low_precision_training_runs_the_low_precision_paths(rng, precision):
    """fp16 / bf16 storage on the host: low-precision weight copies, gradient casts, fp32 fc, fused step."""
    model = ResNet18(num_classes=10, precision=precision, seed=7).to_host()
    opt = SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = TrainStep(model, opt, scaler=GradScaler(init_scale=128.0) if precision == "fp16" else None)
    x, labels = _input(rng, "NHWC", 4, 8).astype(np.float32), rng.integers(0, 10, 4)
    losses = [float(step(x, labels)[0]) for _ in range(6)]
    assert losses[-1] < losses[0]
    low = np.float16 if precision == "fp16" else np.uint16
    copies = model.model_copies()
    assert copies is not None and all(c.dtype == low for c in copies)
    assert model.input_dtype == low and model.conv1.forward(model._as_input(x), train=False).dtype == low
    for p in model.parameters():
        np.testing.assert_array_equal(p.low, ref.to_storage(p.data, precision))
    assert model.fc.weight.grad.dtype == np.float64 and model.conv1.weight.grad.dtype == np.float64


def test_training_reduces_the_loss(rng):
    model = ResNet18(num_classes=10, seed=8).to_host()
    opt = SGD(model.parameters(), lr=0.02, momentum=0.9)  # 0.05 diverges on most draws of 4 random images
    step = TrainStep(model, opt, label_smoothing=0.1)
    x, labels = _input(rng, "NHWC", 4, 8), rng.integers(0, 10, 4)
    losses = [float(step(x, labels)[0]) for _ in range(5)]
    assert losses[-1] < 0.8 * losses[0], losses
