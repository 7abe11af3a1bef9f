"""DirectGradients on host models: a step whose optimizer reads the layers' low-precision weight gradients in place
updates every parameter bit for bit as the step through the fp32 grads does, and every other way a gradient can
arrive (twice in a pass, in the master dtype, for a parameter the optimizer does not hold, not at all) still ends
in what accumulate_grad would have summed."""

import numpy as np
import pytest

from resnet_native._core.placement import host
from resnet_native.nn.models import ResNet18
from resnet_native.nn.params import Parameter, ParameterArena, gradients_into
from resnet_native.optim import SGD, AdamW, GradScaler
from resnet_native.optim.direct_grads import DirectGradients
from resnet_native.optim.step import TrainStep


def _step(precision, opt, direct):
    model = ResNet18(num_classes=10, seed=4, layout="NHWC", precision=precision).to_host(np.float32)
    if opt == "sgd":
        optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    else:
        optimizer = AdamW(model.parameters(), lr=1e-3)
    scaler = GradScaler(init_scale=256.0, growth_interval=2) if precision == "fp16" else None
    return model, TrainStep(model, optimizer, scaler=scaler, direct_gradients=direct)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_direct_gradients_update_as_the_fp32_grads_do(rng, precision, opt):
    x = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    x = x.astype(np.float16) if precision == "fp16" else x
    labels = rng.integers(0, 10, 2)
    (plain, plain_step), (direct, direct_step) = _step(precision, opt, False), _step(precision, opt, True)
    for _ in range(3):
        a, b = plain_step(x, labels), direct_step(x, labels)
        assert float(a[0]) == float(b[0])
    ours, theirs = plain.state_dict(), direct.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
    convs = [p for _, p in direct.named_parameters() if len(p.shape) == 4]
    assert direct_step.direct.num_direct == len(convs) == 20
    assert all(not np.any(p.grad) for p in convs)  # zeroed by the first pass, left alone since
    assert direct_step.optimizer.grad_lists()[0][0] is direct_step.optimizer.params[0].grad  # released after


def _params(rng, n=3, low=np.float16):
    params = [Parameter(rng.standard_normal(4).astype(np.float32), name=f"p{i}") for i in range(n)]
    ParameterArena(params, host(np.float32), low_dtype=low)
    return params


def _low(rng):
    return rng.standard_normal(4).astype(np.float16)


def test_every_other_gradient_still_sums_into_grad(rng):
    p0, p1, p2 = _params(rng)
    (outsider,) = _params(rng, 1)
    optimizer = SGD([p0, p1, p2], lr=0.1)
    direct = DirectGradients(optimizer)
    g = {name: _low(rng) for name in ("a", "b", "c", "d", "e")}
    master = rng.standard_normal(4).astype(np.float32)
    outsider.grad[...] = 1.0
    direct.zero()
    with gradients_into(direct):
        p0.accumulate_grad(g["a"])  # taken where it is
        p1.accumulate_grad(g["b"])
        p1.accumulate_grad(g["c"])  # a second one: both go into grad
        p2.accumulate_grad(master)  # the master dtype: into grad
        outsider.accumulate_grad(g["d"])  # not the optimizer's: into its grad, as always
    direct.finish()
    (lst,) = optimizer.grad_lists()
    assert lst[0] is g["a"] and lst[1] is p1.grad and lst[2] is p2.grad
    np.testing.assert_array_equal(p1.grad, g["b"].astype(np.float32) + g["c"].astype(np.float32))
    np.testing.assert_array_equal(p2.grad, master)
    np.testing.assert_array_equal(outsider.grad, 1.0 + g["d"].astype(np.float32))
    assert direct.num_direct == 1
    direct.release()
    assert optimizer.grad_lists()[0][0] is p0.grad

    # The next pass does not zero p0's grad; its gradients still sum exactly, and one not given is zero.
    p0.grad[...] = 7.0
    direct.zero()
    np.testing.assert_array_equal(p1.grad, 0.0)
    with gradients_into(direct):
        p0.accumulate_grad(g["a"])
        p0.accumulate_grad(g["e"])
        p1.accumulate_grad(g["b"])
    direct.finish()
    np.testing.assert_array_equal(p0.grad, g["a"].astype(np.float32) + g["e"].astype(np.float32))
    (lst,) = optimizer.grad_lists()
    assert lst[0] is p0.grad and lst[1] is g["b"] and lst[2] is p2.grad
    direct.release()
    p1.grad[...] = 7.0
    direct.zero()
    with gradients_into(direct):
        p0.accumulate_grad(g["a"])
    direct.finish()
    np.testing.assert_array_equal(p1.grad, 0.0)  # taken last pass, given nothing now
    assert optimizer.grad_lists()[0][1] is p1.grad


def test_use_gradients_checks_its_lists_and_blocks_unscaling(rng):
    params = _params(rng)
    optimizer = SGD(params, lr=0.1)
    optimizer.step()  # places the state
    direct = DirectGradients(optimizer)
    with pytest.raises(ValueError, match="one list per group"):
        optimizer.use_gradients([direct._list([p.grad for p in params[:2]])])
    optimizer.use_gradients([direct._list([p.grad for p in params])])
    with pytest.raises(RuntimeError, match="use_gradients"):
        optimizer.unscale_grads(np.ones(1, np.float32))
    optimizer.use_gradients(None)
    optimizer.unscale_grads(np.ones(1, np.float32))


def test_train_step_refuses_direct_gradients_with_an_allreduce():
    model = ResNet18(num_classes=10, seed=0).to_host()
    optimizer = SGD(model.parameters(), lr=0.1)

    class Average:
        def average(self, grads):
            pass

    with pytest.raises(ValueError, match="not with an allreduce"):
        TrainStep(model, optimizer, allreduce=Average(), direct_gradients=True)
    with pytest.raises(TypeError, match="direct_gradients: expected True or False"):
        TrainStep(model, optimizer, direct_gradients=1)
