"""The weights' moving average (optim/ema.py) on models placed on the host, where the multi-tensor update runs its
float64 reference: after k updates the shadow's weights and running statistics equal the recurrence
a <- d a + (1 - d) w computed here independently, the start and the cadence of the updates, the low-precision
copies, and the arguments it refuses."""

import numpy as np
import pytest

from resnet_native.nn.layers import BatchNorm2d
from resnet_native.nn.models import ResNet18
from resnet_native.optim import SGD, LinearSchedule, WeightAverage
from resnet_native.optim.ema import running_statistics
from resnet_native.optim.step import TrainStep


def small(seed=0, precision="fp32", dtype=np.float64):
    return ResNet18(num_classes=10, layout="NHWC", precision=precision, seed=seed).to_host(dtype)


def weights(model) -> dict:
    """Every parameter and running statistic, as float64 copies."""
    out = {n: np.array(p.data, np.float64) for n, p in model.named_parameters()}
    out.update({f"stat{i}": np.array(a, np.float64) for i, a in enumerate(running_statistics(model))})
    return out


def perturb(model, rng) -> None:
    """Move every weight and running statistic as a training step would (in place, as the optimizer does)."""
    for _, p in model.named_parameters():
        p.data += 0.1 * rng.standard_normal(p.shape)
    for a in running_statistics(model):
        a += 0.05 * np.abs(rng.standard_normal(a.shape))


def test_k_updates_follow_the_float64_recurrence(rng):
    model, shadow = small(0), small(1)  # a shadow of other weights: the average starts from a copy of the model
    average = WeightAverage(model, shadow, 0.9)
    want = weights(model)
    assert all(np.array_equal(want[k], v) for k, v in weights(shadow).items())
    for _ in range(5):
        perturb(model, rng)
        average.update()
        now = weights(model)
        want = {k: 0.9 * want[k] + 0.1 * now[k] for k in want}
    got = weights(shadow)
    assert got.keys() == want.keys() and len(running_statistics(shadow)) == 2 * sum(
        isinstance(m, BatchNorm2d) for _, m in shadow.named_modules())
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-12, err_msg=k)
    assert not np.array_equal(got["fc.weight"], weights(model)["fc.weight"])


def test_start_and_cadence(rng):
    """Nothing before start_step, a copy there, then an update every `every` steps; an evaluation before the start
    sees the model's weights."""
    model, shadow = small(0), small(0)
    average = WeightAverage(model, shadow, 0.5, every=2, start_step=3)
    want = weights(model)
    for step in range(1, 8):
        perturb(model, rng)
        average.after_step(step)
        now = weights(model)
        if step == 3:
            want = now
        elif step in (5, 7):
            want = {k: 0.5 * want[k] + 0.5 * now[k] for k in want}
        if step == 1:  # not started: the shadow still holds the initial copy
            assert not np.array_equal(weights(shadow)["fc.weight"], now["fc.weight"])
            average.before_evaluation(step)
            want = weights(model)
        got = weights(shadow)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-12, err_msg=f"step {step}: {k}")
    average.before_evaluation(7)  # started: an evaluation changes nothing
    np.testing.assert_array_equal(weights(shadow)["fc.weight"], got["fc.weight"])


def test_the_low_precision_copies_follow_the_average(rng):
    """An fp16 model's shadow: its fp16 copies (what its forward reads) are its averaged masters, rounded (the
    reference rounds the float64 value, the master its float32 rounding: they may differ by a rounding)."""
    model, shadow = small(0, "fp16", np.float32), small(3, "fp16", np.float32)
    average = WeightAverage(model, shadow, 0.75)
    for _ in range(3):
        perturb(model, rng)
        average.update()
    for name, p in shadow.named_parameters():
        assert p.low.dtype == np.float16
        np.testing.assert_allclose(p.low.astype(np.float32), p.data, rtol=2.0**-10, atol=2.0**-24, err_msg=name)
    assert not np.array_equal(p.data, model.parameters()[-1].data)  # the last: fc.bias


def test_after_training_steps(rng):
    """With a TrainStep and a schedule, as the trainer runs it: the average of the weights after each step."""
    model, shadow = small(0), small(0)
    opt = SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    schedule = LinearSchedule(opt, 4)
    step = TrainStep(model, opt)
    average = WeightAverage(model, shadow, 0.8)
    x = rng.standard_normal((4, 8, 8, 3))
    y = rng.integers(0, 10, 4).astype(np.int32)
    want = weights(model)
    for _ in range(3):
        step.run(x, y)
        schedule.step()
        average.after_step(opt.step_count)
        now = weights(model)
        want = {k: 0.8 * want[k] + 0.2 * now[k] for k in want}
    for k, v in weights(shadow).items():
        np.testing.assert_allclose(v, want[k], rtol=1e-12, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"decay": 1.0}, ValueError, r"decay: expected a value in \[0, 1\)"),
    ({"decay": -0.1}, ValueError, "decay"),
    ({"decay": float("nan")}, ValueError, "decay"),
    ({"decay": 0.9, "every": 0}, ValueError, "every"),
    ({"decay": 0.9, "start_step": -1}, ValueError, "start_step"),
    ({"decay": 0.9, "every": True}, TypeError, "every"),
])
def test_arguments_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        WeightAverage(small(0), small(0), **kwargs)


def test_the_shadow_must_be_the_same_network():
    model = small(0)
    other = ResNet18(num_classes=5, layout="NHWC", precision="fp32", seed=0).to_host(np.float64)
    with pytest.raises(ValueError, match="shadow: not the model's architecture"):
        WeightAverage(model, other, 0.9)
    elsewhere = ResNet18(num_classes=10, layout="NHWC", precision="fp32", seed=0).to_host(np.float32)
    with pytest.raises(ValueError, match="shadow: placed on"):
        WeightAverage(model, elsewhere, 0.9)
