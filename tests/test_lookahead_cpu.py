"""Lookahead (optim/lookahead.py) on models placed on the host, where the fused lerp runs its float64 reference:
the slow weights and the trained ones follow slow <- d slow + (1 - d) w, w <- slow with the cubic ramp of d
computed here independently, the cadence (every `every` steps and at the last), the low-precision copies that the
reset rewrites, and the arguments it refuses."""

import numpy as np
import pytest
from test_ema_cpu import perturb, small, weights

from resnet_native.optim import Lookahead, WeightAverage
from resnet_native.optim.ema import running_statistics


def test_updates_follow_the_ramped_recurrence_and_reset_the_weights(rng):
    model, slow = small(0), small(1)
    lookahead = Lookahead(model, slow, 0.8, every=3, total_steps=10)
    want_slow = weights(model)  # the slow copy starts as the model
    for step in range(1, 11):
        perturb(model, rng)
        now = weights(model)
        lookahead.after_step(step)
        if step % 3 == 0 or step == 10:
            d = 0.8 * (step / 10) ** 3
            want_slow = {k: d * want_slow[k] + (1 - d) * now[k] for k in now}
            now = want_slow
        got_model, got_slow = weights(model), weights(slow)
        for k in now:
            np.testing.assert_allclose(got_model[k], now[k], rtol=1e-12, atol=1e-12, err_msg=f"{step} {k}")
            np.testing.assert_allclose(got_slow[k], want_slow[k], rtol=1e-12, atol=1e-12, err_msg=f"{step} {k}")
    assert lookahead.decay_at(5) == pytest.approx(0.8 * 0.125) and lookahead.decay_at(20) == pytest.approx(0.8)
    # After the last step the run ends on the slow weights, running statistics included.
    assert all(np.array_equal(a, b) for a, b in zip(running_statistics(model), running_statistics(slow), strict=True))


def test_the_reset_rewrites_the_low_precision_copies(rng):
    model, slow = small(0, "fp16", np.float32), small(0, "fp16", np.float32)
    lookahead = Lookahead(model, slow, 0.5, every=1, total_steps=4)
    perturb(model, rng)
    lookahead.after_step(2)
    for _, p in model.named_parameters():
        if p.low is not None:
            np.testing.assert_array_equal(p.low, p.data.astype(np.float16))


def test_restore_model_is_the_reverse_of_copy_model(rng):
    model, shadow = small(0), small(1)
    average = WeightAverage(model, shadow, 0.9)
    perturb(shadow, rng)
    before = weights(shadow)
    average.restore_model()
    assert all(np.array_equal(v, before[k]) for k, v in weights(model).items())


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(decay=1.0, total_steps=5), ValueError, "decay"),
    (dict(decay=-0.1, total_steps=5), ValueError, "decay"),
    (dict(decay=0.5, every=0, total_steps=5), ValueError, "every"),
    (dict(decay=0.5, total_steps=0), ValueError, "total_steps"),
])
def test_arguments_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        Lookahead(small(0), small(0), **kwargs)
