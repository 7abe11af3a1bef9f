"""CPU tests of the optimizers, schedules and GradScaler: schedule values against PyTorch's formulas (worked
out by hand here), the on-device loss-scale rule run on NumPy, and SGD/AdamW on parameters placed on the host,
where the multi-tensor functions run their float64 references (several steps, one launch per step or arena,
state_dict round trips, zero_grad without reallocation)."""

import math

import numpy as np
import pytest

from resnet_native import reference
from resnet_native._core.placement import host
from resnet_native.nn.params import Parameter, ParameterArena
from resnet_native.optim import (
    SGD,
    AdamW,
    CosineSchedule,
    GradScaler,
    LinearSchedule,
    OneCycleSchedule,
    WarmupSchedule,
)
from resnet_native.optim.grad_scaler import update_scale


class _FakeOptimizer:
    def __init__(self, lr=0.1, momentum=0.9):
        self.lr, self.momentum = lr, momentum

    def set_momentum(self, value):
        self.momentum = value


# ------------------------------------------------------------------------------------------------ schedules


def test_cosine_schedule_values():
    opt = _FakeOptimizer(lr=0.2)
    sched = CosineSchedule(opt, 100, min_lr=0.01)
    assert opt.lr == pytest.approx(0.2)
    lrs = [opt.lr]
    for _ in range(120):
        sched.step()
        lrs.append(opt.lr)
    assert lrs[50] == pytest.approx(0.01 + 0.19 * 0.5)
    assert lrs[25] == pytest.approx(0.01 + 0.19 * (1 + math.cos(math.pi / 4)) / 2)
    assert lrs[100] == pytest.approx(0.01) and lrs[120] == pytest.approx(0.01)  # held after total_steps
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))


def test_linear_schedule_decays_to_zero_after_a_warmup():
    opt = _FakeOptimizer(lr=0.4)
    sched = WarmupSchedule(opt, 10, after=LinearSchedule(opt, 90))
    lrs = [opt.lr]
    for _ in range(110):
        sched.step()
        lrs.append(opt.lr)
    assert lrs[0] == pytest.approx(0.4 / 3) and lrs[10] == pytest.approx(0.4)  # the warm-up, then the peak
    assert lrs[55] == pytest.approx(0.4 * (1 - 45 / 90)) and lrs[82] == pytest.approx(0.4 * (1 - 72 / 90))
    assert lrs[100] == 0.0 and lrs[110] == 0.0  # zero at the end, and held there
    assert all(a > b for a, b in zip(lrs[10:100], lrs[11:101], strict=True))  # strictly down, in equal steps
    assert np.allclose(np.diff(lrs[10:101]), -0.4 / 90)
    state = sched.state_dict()
    again = WarmupSchedule(opt, 10, after=LinearSchedule(opt, 90, base_lr=1.0))  # a reload keeps the saved peak
    again.load_state_dict({**state, "last_step": 40})
    assert opt.lr == pytest.approx(0.4 * (1 - 30 / 90))
    low = LinearSchedule(_FakeOptimizer(lr=1.0), 4, min_lr=0.2)
    assert [low.lr_at(t) for t in range(6)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2])
    with pytest.raises(ValueError, match="total_steps"):
        LinearSchedule(opt, 0)


def test_onecycle_schedule_follows_pytorch():
    # torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=100): initial 1/25, peak at step 29
    # (pct_start * total - 1), final 1/25/1e4 at step 99; momentum 0.95 -> 0.85 -> 0.95.
    opt = _FakeOptimizer(lr=123.0, momentum=0.0)
    sched = OneCycleSchedule(opt, 100, max_lr=1.0)
    assert opt.lr == pytest.approx(0.04) and opt.momentum == pytest.approx(0.95)
    lrs, moms = [opt.lr], [opt.momentum]
    for _ in range(99):
        sched.step()
        lrs.append(opt.lr)
        moms.append(opt.momentum)
    assert lrs[29] == pytest.approx(1.0) and moms[29] == pytest.approx(0.85)
    assert lrs[99] == pytest.approx(4e-6) and moms[99] == pytest.approx(0.95)
    assert lrs[64] == pytest.approx(4e-6 + (1 - 4e-6) / 2)  # halfway through the second phase
    pct = 14.5 / 29  # step 14.5 would be the middle of the first phase; check step 10 by the formula
    assert pct and lrs[10] == pytest.approx(1.0 + (0.04 - 1.0) / 2 * (math.cos(math.pi * 10 / 29) + 1))
    assert max(lrs) == lrs[29]
    linear = OneCycleSchedule(_FakeOptimizer(), 100, max_lr=1.0, anneal="linear", cycle_momentum=False)
    assert linear.lr_at(10) == pytest.approx(0.04 + (1 - 0.04) * 10 / 29)


def test_warmup_then_cosine_and_state_dict_round_trip():
    opt = _FakeOptimizer(lr=0.4)
    sched = WarmupSchedule(opt, 10, after=CosineSchedule(opt, 90))
    assert opt.lr == pytest.approx(0.4 / 3)  # start_factor 1/3 by default, as PyTorch's LinearLR
    lrs = [opt.lr]
    for _ in range(100):
        sched.step()
        lrs.append(opt.lr)
    assert lrs[5] == pytest.approx(0.4 * (1 / 3 + 2 / 3 * 0.5)) and lrs[10] == pytest.approx(0.4)
    assert lrs[55] == pytest.approx(0.2) and lrs[100] == pytest.approx(0.0)
    state = sched.state_dict()
    assert state["last_step"] == 100
    opt2 = _FakeOptimizer(lr=999.0)  # e.g. a resumed run whose optimizer already holds a mid-schedule lr
    sched2 = WarmupSchedule(opt2, 10, after=CosineSchedule(opt2, 90))
    sched2.load_state_dict({**state, "last_step": 55})
    assert opt2.lr == pytest.approx(0.2)
    sched2.step()
    assert opt2.lr == pytest.approx(lrs[56])


def test_warmup_alone_and_validation():
    opt = _FakeOptimizer(lr=1.0)
    sched = WarmupSchedule(opt, 4, start_factor=0.2)
    assert opt.lr == pytest.approx(0.2)
    for expect in (0.4, 0.6, 0.8, 1.0, 1.0):
        sched.step()
        assert opt.lr == pytest.approx(expect)
    with pytest.raises(ValueError, match="warmup_steps"):
        WarmupSchedule(opt, 0)
    # start_factor 0 would make the first step run at lr 0 (a step that moves nothing).
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"start_factor.*\(0, 1\]"):
            WarmupSchedule(_FakeOptimizer(lr=1.0), 4, start_factor=bad)
    assert WarmupSchedule(_FakeOptimizer(lr=1.0), 4, start_factor=1.0).optimizer.lr == 1.0
    with pytest.raises(TypeError, match="total_steps: expected an int >= 1, got 2.5"):
        CosineSchedule(opt, 2.5)
    with pytest.raises(ValueError, match="pct_start"):
        OneCycleSchedule(opt, 10, pct_start=1.0)
    with pytest.raises(ValueError, match="same optimizer"):
        WarmupSchedule(opt, 2, after=CosineSchedule(_FakeOptimizer(), 5))


def test_onecycle_state_dict_round_trip():
    opt = _FakeOptimizer(lr=0.01)
    sched = OneCycleSchedule(opt, 50)
    for _ in range(20):
        sched.step()
    state = sched.state_dict()
    opt2 = _FakeOptimizer(lr=0.5)
    OneCycleSchedule(opt2, 50).load_state_dict(state)
    assert opt2.lr == pytest.approx(opt.lr) and opt2.momentum == pytest.approx(opt.momentum)


# ------------------------------------------------------------------------------------------------ GradScaler


def _scaler_arrays(scale, tracker):
    scratch = {k: np.zeros(1, bool) for k in ("good", "grow", "both")}
    scratch.update(factor=np.zeros(1, np.float32), term=np.zeros(1, np.float32))
    return np.array([scale], np.float32), np.array([tracker], np.int32), scratch


def test_update_scale_rule_on_numpy():
    scale, tracker, scratch = _scaler_arrays(1024.0, 0)
    kw = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=3, scratch=scratch)
    history = []
    for inf in (0, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0):
        update_scale(np, scale, tracker, np.array([inf], np.int32), **kw)
        history.append((float(scale[0]), int(tracker[0])))
    assert history == [
        (1024, 1),
        (1024, 2),
        (2048, 0),
        (2048, 1),
        (1024, 0),
        (1024, 1),
        (512, 0),
        (256, 0),
        (256, 1),
        (256, 2),
        (512, 0),
    ]


def test_grad_scaler_host_state_and_validation():
    scaler = GradScaler(init_scale=512.0, growth_interval=10)
    assert scaler.get_scale() == 512.0
    state = scaler.state_dict()
    assert state["scale"] == 512.0 and state["growth_tracker"] == 0
    other = GradScaler()
    other.load_state_dict({**state, "scale": 64.0, "growth_tracker": 3})
    assert other.get_scale() == 64.0 and other.state_dict()["growth_tracker"] == 3
    assert other.growth_interval == 10
    with pytest.raises(ValueError, match="backoff_factor"):
        GradScaler(backoff_factor=1.0)
    with pytest.raises(ValueError, match="growth_interval"):
        GradScaler(growth_interval=0)


def test_grad_scaler_device_state_round_trips_on_numpy():
    scaler = GradScaler(init_scale=8.0, growth_interval=2).to_host()
    scaler.load_state_dict({"scale": 32.0, "growth_tracker": 1})
    scaler.update()  # found_inf is 0: second good step, the scale doubles
    assert scaler.get_scale() == 64.0 and scaler.state_dict()["growth_tracker"] == 0
    grad = np.ones((2, 3))
    scaler.scale_(grad)
    np.testing.assert_array_equal(grad, np.full((2, 3), 64.0))
    assert isinstance(scaler.scale_array, np.ndarray) and scaler.scale_array.dtype == np.float64
    with pytest.raises(RuntimeError, match="already on the host"):
        scaler.to_host(np.float32)


# ------------------------------------------------------------------------------------------------ optimizers


def _params(rng, shapes=((4, 3), (7,), (2, 3, 3, 2))):
    params = [Parameter(rng.standard_normal(s)) for s in shapes]
    ParameterArena(params, host())
    return params


def _set_grads(params, rng):
    grads = [rng.standard_normal(p.shape) for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad[...] = g
    return grads


def _torch_sgd(momentum, nesterov, weight_decay, dampening):
    """torch.optim.SGD's update, written out: update(step, i, p, g) -> new p (buffers kept per parameter)."""
    bufs = {}

    def update(step, i, p, g):
        d = g + weight_decay * p
        bufs[i] = d.copy() if step == 0 else momentum * bufs[i] + (1 - dampening) * d
        return p - 0.1 * (d + momentum * bufs[i] if nesterov else bufs[i])

    return update


def _torch_adamw(lr, betas, eps, weight_decay):
    """torch.optim.AdamW's update, written out."""
    m, v = {}, {}

    def update(step, i, p, g):
        t = step + 1
        p = p * (1 - lr * weight_decay)
        m[i] = betas[0] * m.get(i, 0.0) + (1 - betas[0]) * g
        v[i] = betas[1] * v.get(i, 0.0) + (1 - betas[1]) * g * g
        return p - lr * (m[i] / (1 - betas[0] ** t)) / (np.sqrt(v[i] / (1 - betas[1] ** t)) + eps)

    return update


OPTIMIZER_CASES = {
    "sgd": (lambda params: SGD(params, lr=0.1, momentum=0.9), _torch_sgd(0.9, False, 0.0, 0.0), 4, 1e-12),
    "sgd-nesterov-decay": (lambda params: SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
                           _torch_sgd(0.9, True, 1e-2, 0.0), 4, 1e-12),
    "sgd-dampening-decay": (lambda params: SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-2, dampening=0.3),
                            _torch_sgd(0.9, False, 1e-2, 0.3), 4, 1e-12),
    "adamw": (lambda params: AdamW(params, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
              _torch_adamw(0.01, (0.8, 0.99), 1e-6, 0.1), 3, 1e-10),
}


@pytest.mark.parametrize("case", sorted(OPTIMIZER_CASES))
def test_optimizer_steps_follow_pytorch_in_one_launch_each(rng, monkeypatch, case):
    make, torch_update, steps, rtol = OPTIMIZER_CASES[case]
    params = _params(rng)
    opt = make(params)
    kernel = "sgd_step" if isinstance(opt, SGD) else "adamw_step"
    launches = []
    original = getattr(reference.multi_tensor, kernel)
    monkeypatch.setattr(reference.multi_tensor, kernel, lambda *a, **k: launches.append(1) or original(*a, **k))
    expect = [p.data.copy() for p in params]
    for step in range(steps):
        grads = _set_grads(params, rng)
        opt.step()
        expect = [torch_update(step, i, e, g) for i, (e, g) in enumerate(zip(expect, grads, strict=True))]
    for p, e in zip(params, expect, strict=True):
        np.testing.assert_allclose(p.data, e, rtol=rtol)
    assert opt.step_count == steps
    assert len(launches) == steps  # one fused multi-tensor launch per step for the whole (one-group) model


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_parameter_groups_set_their_own_weight_decay(rng, monkeypatch, kind):
    """PyTorch's parameter groups: the second parameter without decay, the others with the optimizer's; one
    launch per group."""
    params = _params(rng)
    groups = [{"params": [params[0], params[2]]}, {"params": [params[1]], "weight_decay": 0.0}]
    if kind == "sgd":
        opt, kernel = SGD(groups, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2), "sgd_step"
        updates = [_torch_sgd(0.9, True, 1e-2, 0.0), _torch_sgd(0.9, True, 0.0, 0.0)]
    else:
        opt, kernel = AdamW(groups, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), "adamw_step"
        updates = [_torch_adamw(0.01, (0.8, 0.99), 1e-6, 0.1), _torch_adamw(0.01, (0.8, 0.99), 1e-6, 0.0)]
    assert opt.params == [params[0], params[2], params[1]]  # the groups' order
    launches = []
    original = getattr(reference.multi_tensor, kernel)
    monkeypatch.setattr(reference.multi_tensor, kernel, lambda *a, **k: launches.append(1) or original(*a, **k))
    expect = [p.data.copy() for p in params]
    for step in range(3):
        grads = _set_grads(params, rng)
        opt.step()
        expect = [updates[i == 1](step, i, e, g) for i, (e, g) in enumerate(zip(expect, grads, strict=True))]
    for p, e in zip(params, expect, strict=True):
        np.testing.assert_allclose(p.data, e, rtol=1e-10)
    assert len(launches) == 2 * 3
    assert sorted(len(g) for g in opt.group_params()) == [1, 2]


def test_parameter_groups_are_checked():
    p, q = Parameter(np.zeros(2)), Parameter(np.zeros(3))
    with pytest.raises(ValueError, match=r"params\[1\]: a parameter group takes 'params' and optionally "
                                         r"'weight_decay', got \['lr', 'params'\]"):
        SGD([{"params": [p]}, {"params": [q], "lr": 0.1}], lr=0.1)
    with pytest.raises(ValueError, match=r"params\[1\]: a parameter is also in params\[0\]"):
        SGD([{"params": [p, q]}, {"params": [q], "weight_decay": 0.0}], lr=0.1)
    with pytest.raises(ValueError, match=r"params\[0\].weight_decay"):
        SGD([{"params": [p], "weight_decay": -1.0}], lr=0.1)
    with pytest.raises(ValueError, match="'params'"):
        AdamW([{"weight_decay": 0.0}])
    with pytest.raises(TypeError, match=r"params\[0\]: expected resnet_native Parameters"):
        SGD([{"params": [np.zeros(2)], "weight_decay": 0.0}], lr=0.1)


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_optimizer_state_dict_round_trip_through_npz(tmp_path, rng, kind):
    def make(params):
        return (
            SGD(params, lr=0.05, nesterov=True)
            if kind == "sgd"
            else AdamW(params, lr=0.01, betas=(0.85, 0.98))
        )

    a_params, b_params = _params(np.random.default_rng(1)), _params(np.random.default_rng(1))
    a = make(a_params)
    grads = [
        [np.random.default_rng(100 + s).standard_normal(p.shape) for p in a_params] for s in range(4)
    ]
    for s in range(2):
        for p, g in zip(a_params, grads[s], strict=True):
            p.grad[...] = g
        a.step()
    np.savez(tmp_path / "opt.npz", **a.state_dict())
    b = make(b_params)
    with np.load(tmp_path / "opt.npz") as f:
        b.load_state_dict(dict(f))
    assert b.step_count == 2 and repr(b).startswith(type(b).__name__)
    for p, q in zip(a_params, b_params, strict=True):
        q.data[...] = p.data
    for s in (2, 3):
        for params in (a_params, b_params):
            for p, g in zip(params, grads[s], strict=True):
                p.grad[...] = g
        a.step()
        b.step()
    for p, q in zip(a_params, b_params, strict=True):
        np.testing.assert_allclose(q.data, p.data, rtol=1e-6)  # state_dict holds fp32 (these run in fp64)


def test_optimizer_state_loaded_before_the_device_is_used(rng):
    state = {
        "type": "SGD",
        "step": 3,
        "lr": 0.5,
        "momentum": 0.8,
        "dampening": 0.0,
        "weight_decay": 0.0,
        "nesterov": False,
    }
    params = [Parameter(np.zeros((2, 2)))]
    opt = SGD(params, lr=0.1)
    with pytest.raises(KeyError, match="momentum_buffer.0"):
        opt.load_state_dict(state)
    opt.load_state_dict({**state, "momentum_buffer.0": np.ones((2, 2))})
    assert (opt.lr, opt.momentum, opt.step_count) == (0.5, 0.8, 3)
    np.testing.assert_array_equal(opt.state_dict()["momentum_buffer.0"], np.ones((2, 2)))
    ParameterArena(params, host())
    params[0].grad[...] = 1.0
    opt.step()  # buf = 0.8 * 1 + 1 = 1.8; p = 0 - 0.5 * 1.8
    np.testing.assert_allclose(params[0].data, np.full((2, 2), -0.9))
    with pytest.raises(ValueError, match="not a SGD"):
        opt.load_state_dict({**state, "type": "AdamW"})
    with pytest.raises(ValueError, match="expected shape"):
        opt.load_state_dict({**state, "momentum_buffer.0": np.ones(3)})


def test_zero_grad_reuses_the_gradient_buffers(rng):
    params = _params(rng)
    opt = SGD(params, lr=0.1)
    _set_grads(params, rng)
    before = [p.grad for p in params]
    opt.zero_grad()
    assert all(p.grad is b and not b.any() for p, b in zip(params, before, strict=True))


def test_zero_grad_before_the_device_is_a_no_op_and_step_needs_it():
    opt = SGD([Parameter(np.zeros(3))], lr=0.1)
    opt.zero_grad()
    with pytest.raises(RuntimeError, match="not on the GPU"):
        opt.step()


def test_optimizer_validation():
    p = [Parameter(np.zeros(2))]
    with pytest.raises(ValueError, match="lr"):
        SGD(p, lr=-1)
    with pytest.raises(ValueError, match="nesterov"):
        SGD(p, lr=0.1, momentum=0.0, nesterov=True)
    with pytest.raises(ValueError, match="empty"):
        SGD([], lr=0.1)
    with pytest.raises(TypeError, match="Parameters"):
        SGD([np.zeros(2)], lr=0.1)
    with pytest.raises(ValueError, match="betas"):
        AdamW(p, betas=(0.9, 1.0))
    assert len(SGD(p + p, lr=0.1).params) == 1  # duplicates dropped
    mixed = [Parameter(np.zeros(2)), Parameter(np.zeros(3))]
    ParameterArena(mixed[:1], host())
    with pytest.raises(RuntimeError, match="some parameters are placed and some are not"):
        SGD(mixed, lr=0.1).zero_grad()
    ParameterArena(mixed[1:], host(np.float32))
    with pytest.raises(RuntimeError, match="different places"):
        SGD(mixed, lr=0.1).zero_grad()


def _multiplies(monkeypatch, call):
    """The `out` arrays of every np.multiply call `call()` makes (a host arena's "launches")."""
    outs, multiply = [], np.multiply

    def counting(*args, out=None, **kwargs):
        outs.append(out)
        return multiply(*args, out=out, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(np, "multiply", counting)
        call()
    return outs


def test_unscale_uses_one_launch_per_owned_arena(rng, monkeypatch):
    params = _params(rng)
    opt = SGD(params, lr=0.1)
    grads = _set_grads(params, rng)
    launches = _multiplies(monkeypatch, lambda: opt.unscale_grads(np.array([0.25])))
    assert len(launches) == 1 and launches[0] is params[0].arena.grad  # one pass over the whole arena
    for p, g in zip(params, grads, strict=True):
        np.testing.assert_allclose(p.grad, g * 0.25)
    partial = SGD(params[:2], lr=0.1)  # does not own the whole arena: scales only its own gradients
    launches = _multiplies(monkeypatch, lambda: partial.unscale_grads(np.array([2.0])))
    assert len(launches) == 2 and launches[0] is params[0].grad and launches[1] is params[1].grad
    np.testing.assert_allclose(params[2].grad, grads[2] * 0.25)
    np.testing.assert_allclose(params[0].grad, grads[0] * 0.5)


def test_adamw_on_the_host_does_not_count_updates_the_scaler_skips(rng):
    params = _params(rng)
    opt, scaler = AdamW(params, lr=1e-3), GradScaler(init_scale=4.0)
    _set_grads(params, rng)
    params[0].grad[0, 0] = np.inf
    scaler.step(opt)
    scaler.update()
    assert scaler.placement == host()  # the scaler follows the optimizer's parameters
    assert opt.step_count == 1 and opt.applied_steps == 0 and scaler.get_scale() == 2.0
    _set_grads(params, rng)
    scaler.step(opt)
    scaler.update()
    assert opt.step_count == 2 and opt.applied_steps == 1 and opt.state_dict()["step"] == 1
    # What the trainer's checkpoint copies: the header, then the sources, whose 'step' counts applied updates.
    from resnet_native.training.snapshot import HostSnapshot

    copies = HostSnapshot().take({"o": opt.state_sources(), "s": scaler.state_sources()}).resolve()
    assert {**opt.state_header(), **copies["o"]}["step"] == 1 and opt.state_header()["step"] == 2
    assert {**scaler.state_header(), **copies["s"]} == scaler.state_dict()
    assert copies["s"] == {"scale": 2.0, "growth_tracker": 1}


def test_a_recipe_norm_weight_decay_puts_batch_norm_in_a_group_of_its_own():
    from resnet_native.nn.layers import BatchNorm2d
    from resnet_native.nn.models import ResNet18
    from resnet_native.training.builders import build_optimizer
    from resnet_native.training.config import TrainConfig

    model = ResNet18(num_classes=10, layout="NHWC", precision="fp32", seed=0).to_host(np.float64)
    norm = {id(p) for _, m in model.named_modules() if isinstance(m, BatchNorm2d) for p in m.parameters()}
    sgd = {"name": "sgd", "lr": 0.1, "weight_decay": 5e-4}
    plain = build_optimizer(TrainConfig.from_dict({"epochs": 1, "optimizer": sgd}), model)
    assert len(plain.group_params()) == 1 and plain.params == model.parameters()
    cfg = TrainConfig.from_dict({"epochs": 1, "optimizer": {**sgd, "norm_weight_decay": 0.0}})
    opt = build_optimizer(cfg, model)
    groups = opt.group_params()  # places the groups
    decays = {id(p): opt.group_weight_decay(g) for g, ps in zip(opt._groups, groups, strict=True) for p in ps}
    assert len(norm) == 2 * 20 and len(decays) == len(model.parameters())  # ResNet-18: 20 batch norms
    assert all(decays[i] == (0.0 if i in norm else 5e-4) for i in decays)


def test_a_frozen_stem_is_left_out_of_the_optimizer():
    """A layer that computes no gradient for its weight (the frozen stem build_model marks) keeps it out of
    trainable_parameters(), and so out of the optimizer, with or without parameter groups."""
    from resnet_native.nn.models import ResNet18
    from resnet_native.training.builders import build_optimizer
    from resnet_native.training.config import TrainConfig

    model = ResNet18(num_classes=10, layout="NHWC", precision="fp32", seed=0).to_host(np.float64)
    sgd = {"name": "sgd", "lr": 0.1}
    assert model.trainable_parameters() == model.parameters()
    model.conv1.needs_weight_grad = False  # what build_model does for stem: {frozen: true}
    assert model.conv1.frozen_parameters() == [model.conv1.weight]
    opt = build_optimizer(TrainConfig.from_dict({"epochs": 1, "optimizer": sgd, "stem": {"frozen": True}}), model)
    assert opt.params == model.parameters()[1:] and model.parameters()[0] is model.conv1.weight
    with_norm = build_optimizer(TrainConfig.from_dict({"epochs": 1, "optimizer": {**sgd, "norm_weight_decay": 0.0},
                                                       "stem": {"frozen": True}}), model)
    assert model.conv1.weight not in with_norm.params and len(with_norm.params) == len(model.parameters()) - 1

