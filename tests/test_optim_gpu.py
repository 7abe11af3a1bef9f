"""GPU tests of the optimizers on the fused multi-tensor kernels: several steps against torch.optim (and the
float64 formulas), low-precision model copies, loss-scale skipping and growth, zero_grad in place."""

import cupy as cp
import numpy as np
import pytest

from resnet_native import reference as ref
from resnet_native.nn.params import Parameter, ParameterArena
from resnet_native.optim import SGD, AdamW, GradScaler

pytestmark = pytest.mark.gpu

SHAPES = [(64, 3, 3, 3), (7,), (1,), (1023,), (10, 512), (3, 5, 5, 2)]


def _params(rng, low_dtype=None):
    values = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    params = [Parameter(v) for v in values]
    ParameterArena(params, low_dtype=low_dtype)
    return params, values


def _torch_params(torch, values):
    return [torch.tensor(v, device="cuda", requires_grad=True) for v in values]


# (optimizer class name in both libraries, hyperparameters, tolerance on the parameters' movement)
TORCH_CASES = {
    "sgd": ("SGD", dict(lr=0.05, momentum=0.9, nesterov=False, weight_decay=0.0, dampening=0.0), 1e-5),
    "sgd-nesterov-decay": ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4, dampening=0.0), 1e-5),
    "sgd-dampening-decay": ("SGD", dict(lr=0.05, momentum=0.9, nesterov=False, weight_decay=1e-2, dampening=0.25),
                            1e-5),
    "adamw": ("AdamW", dict(lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05), 1e-4),
}


def _steps_match_torch(rng, kind, hyper, tol, arrange=list):
    """Five steps of ours and of torch.optim's `kind` on the same gradients, the parameters handed over as
    arrange(parameters) (a list, or parameter groups); each parameter's movement within tol of torch's."""
    torch = pytest.importorskip("torch")
    params, values = _params(rng)
    tparams = _torch_params(torch, values)
    opt = {"SGD": SGD, "AdamW": AdamW}[kind](arrange(params), **hyper)
    topt = getattr(torch.optim, kind)(arrange(tparams), **hyper)
    for _ in range(5):
        for p, t in zip(params, tparams, strict=True):
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad[...] = cp.asarray(g)
            t.grad = torch.tensor(g, device="cuda")
        opt.step()
        topt.step()
    for p, t, v in zip(params, tparams, values, strict=True):
        moved, tmoved = cp.asnumpy(p.data) - v, t.detach().cpu().numpy() - v
        assert ref.relative_error(moved, tmoved) <= tol


@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_optimizer_matches_torch_over_several_steps(rng, case):
    _steps_match_torch(rng, *TORCH_CASES[case])


@pytest.mark.parametrize("kind", ["SGD", "AdamW"])
def test_parameter_groups_match_torch(rng, kind):
    """Every other parameter in a group without weight decay, as torch.optim's parameter groups take it."""
    hyper = TORCH_CASES["sgd-nesterov-decay" if kind == "SGD" else "adamw"][1]
    _steps_match_torch(rng, kind, hyper, 1e-4,
                       lambda ps: [{"params": ps[0::2]}, {"params": ps[1::2], "weight_decay": 0.0}])


@pytest.mark.parametrize("low", ["fp16", "bf16"])
def test_fused_step_refreshes_low_precision_copies(rng, low):
    params, values = _params(rng, low_dtype=np.float16 if low == "fp16" else np.uint16)
    opt = SGD(params, lr=0.1, momentum=0.9)
    for p in params:
        p.grad[...] = cp.asarray(rng.standard_normal(p.shape).astype(np.float32))
    opt.step()
    for p, v in zip(params, values, strict=True):
        master = cp.asnumpy(p.data)
        assert not np.array_equal(master, v)
        expect = master.astype(np.float16) if low == "fp16" else ref.bf16.to_bf16_bits(master)
        np.testing.assert_array_equal(cp.asnumpy(p.low), expect)


def test_grad_scaler_unscales_skips_and_grows(rng):
    params, values = _params(rng)
    plain_params, _ = _params(np.random.default_rng(0))
    for p, v in zip(plain_params, values, strict=True):
        p.assign(v)
    opt, plain = SGD(params, lr=0.1, momentum=0.9), SGD(plain_params, lr=0.1, momentum=0.9)
    scaler = GradScaler(init_scale=64.0, growth_interval=2)

    def set_grads(inf=False):
        for p, q in zip(params, plain_params, strict=True):
            g = rng.standard_normal(p.shape).astype(np.float32)
            q.grad[...] = cp.asarray(g)
            scaled = g * scaler.get_scale()
            if inf and p is params[3]:
                scaled[5] = np.inf
            p.grad[...] = cp.asarray(scaled)

    set_grads(inf=True)
    scaler.step(opt)
    scaler.update()
    assert int(cp.asnumpy(scaler.found_inf)[0]) == 1 and scaler.get_scale() == 32.0
    for p, v in zip(params, values, strict=True):
        np.testing.assert_array_equal(cp.asnumpy(p.data), v)  # skipped on the device
    for _ in range(2):
        opt.zero_grad()
        plain.zero_grad()
        set_grads()
        scaler.step(opt)
        scaler.update()
        plain.step()
        assert int(cp.asnumpy(scaler.found_inf)[0]) == 0
    assert scaler.get_scale() == 64.0  # grew after growth_interval=2 good steps
    for p, q in zip(params, plain_params, strict=True):
        assert ref.relative_error(cp.asnumpy(p.data), cp.asnumpy(q.data)) <= 1e-6


def test_zero_grad_keeps_the_buffers(rng):
    params, _ = _params(rng)
    opt = AdamW(params, lr=1e-3)
    for p in params:
        p.grad[...] = 1.0
    pointers = [p.grad.data.ptr for p in params]
    opt.zero_grad()
    assert [p.grad.data.ptr for p in params] == pointers
    assert all(not cp.asnumpy(p.grad).any() for p in params)


def test_optimizer_state_dict_round_trip(rng):
    params, values = _params(rng)
    opt = SGD(params, lr=0.1, momentum=0.9)
    for p in params:
        p.grad[...] = 1.0
    opt.step()
    state = opt.state_dict()
    np.testing.assert_allclose(state["momentum_buffer.0"], np.ones(SHAPES[0]))
    params2, _ = _params(np.random.default_rng(1))
    opt2 = SGD(params2, lr=0.5)
    opt2.load_state_dict(state)
    assert opt2.lr == 0.1 and opt2.step_count == 1
    np.testing.assert_array_equal(opt2.state_dict()["momentum_buffer.3"], state["momentum_buffer.3"])
